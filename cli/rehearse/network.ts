import {
  CreateLaunchTemplateCommand,
  CreateLaunchTemplateVersionCommand,
  CreateSecurityGroupCommand,
  CreateSubnetCommand,
  CreateVpcCommand,
  DescribeLaunchTemplatesCommand,
  type EC2Client,
  RegisterImageCommand,
} from '@aws-sdk/client-ec2';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import { type AwsLabelSettings, awsPoolSettings } from '../../shared/providers/aws/settings.ts';

/**
 * What a configuration names in the account (subnets, security groups, images, launch templates), made
 * in moto for the rehearsal. moto cannot create a resource with an id chosen by the caller, so each gets
 * moto's own id, and the functions run with the configuration those ids are replaced in (`mapConfigText`):
 * the one shipped in the rehearsal's copy of the code, never the user's file. A launch template named
 * by name keeps its name.
 */
export interface RehearsalNetwork {
  readonly vpcId: string;
  /** The configuration's id -> moto's, for every id the configuration names. */
  readonly ids: ReadonlyMap<string, string>;
  /** What was made, for the progress output: `subnet subnet-0abc -> subnet-1234`. */
  readonly made: readonly string[];
}

/** Every aws label's launch settings in the configuration. */
export function awsLabelSettings(config: ResolvedConfig): AwsLabelSettings[] {
  return config.backingPools
    .filter((p) => p.driver === 'aws')
    .flatMap((p) => [...awsPoolSettings(p).values()]);
}

export async function createNetwork(ec2: EC2Client, config: ResolvedConfig): Promise<RehearsalNetwork> {
  const labels = awsLabelSettings(config);
  const ids = new Map<string, string>();
  const made: string[] = [];
  const vpc = await ec2.send(new CreateVpcCommand({ CidrBlock: '10.20.0.0/16' }));
  const vpcId = vpc.Vpc?.VpcId as string;
  const distinct = (values: Iterable<string>) => [...new Set(values)];

  for (const [i, subnetId] of distinct(labels.flatMap((l) => l.subnetIds)).entries()) {
    if (i >= 250) throw new Error('the rehearsal makes at most 250 subnets');
    const subnet = await ec2.send(
      new CreateSubnetCommand({
        VpcId: vpcId,
        CidrBlock: `10.20.${i + 1}.0/24`,
        TagSpecifications: [{ ResourceType: 'subnet', Tags: [{ Key: 'Name', Value: subnetId }] }],
      }),
    );
    ids.set(subnetId, subnet.Subnet?.SubnetId as string);
    made.push(`subnet ${subnetId} -> ${subnet.Subnet?.SubnetId}`);
  }
  for (const groupId of distinct(labels.flatMap((l) => l.securityGroupIds))) {
    const group = await ec2.send(
      new CreateSecurityGroupCommand({
        VpcId: vpcId,
        GroupName: `rehearsal ${groupId}`,
        Description: `stands in for ${groupId}`,
      }),
    );
    ids.set(groupId, group.GroupId as string);
    made.push(`security group ${groupId} -> ${group.GroupId}`);
  }
  const register = async (name: string) => {
    const out = await ec2.send(new RegisterImageCommand({ Name: name, RootDeviceName: '/dev/xvda' }));
    return out.ImageId as string;
  };
  const image = async (imageId: string) => {
    const known = ids.get(imageId);
    if (known) return known;
    const registered = await register(`rehearsal ${imageId}`);
    ids.set(imageId, registered);
    made.push(`image ${imageId} -> ${registered}`);
    return registered;
  };
  for (const label of labels) {
    if (label.image.kind === 'image') await image(label.image.imageId);
  }
  for (const label of labels) {
    if (label.image.kind !== 'launch-template') continue;
    const { id, name, version } = label.image;
    const templateName = name ?? `rehearsal-${id}`;
    if (id !== undefined && ids.has(id)) continue;
    const existing = await ec2
      .send(new DescribeLaunchTemplatesCommand({ LaunchTemplateNames: [templateName] }))
      .then((o) => o.LaunchTemplates?.[0])
      .catch(() => undefined);
    let templateId = existing?.LaunchTemplateId;
    if (!templateId) {
      const data = { ImageId: await register(`rehearsal launch template ${id ?? name}`) };
      const created = await ec2.send(
        new CreateLaunchTemplateCommand({ LaunchTemplateName: templateName, LaunchTemplateData: data }),
      );
      templateId = created.LaunchTemplate?.LaunchTemplateId as string;
      // A label may name a version: make that many (the same data).
      const versions = /^\d+$/.test(version ?? '') ? Number(version) : 1;
      for (let v = 2; v <= Math.min(versions, 50); v++) {
        await ec2.send(
          new CreateLaunchTemplateVersionCommand({ LaunchTemplateId: templateId, LaunchTemplateData: data }),
        );
      }
      made.push(`launch template ${id ?? name} -> ${templateId} (${templateName})`);
    }
    if (id !== undefined) ids.set(id, templateId);
  }
  return { vpcId, ids, made };
}

/**
 * The configuration text with each id replaced by moto's, as whole words only (an id is never part of a
 * longer one: `subnet-1` does not touch `subnet-12`); comments and layout kept.
 */
export function mapConfigText(text: string, ids: ReadonlyMap<string, string>): string {
  let out = text;
  // Longest first, so that an id that is a prefix of another is not replaced inside it.
  for (const [from, to] of [...ids.entries()].sort((a, b) => b[0].length - a[0].length)) {
    const escaped = from.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    out = out.replace(new RegExp(`(?<![\\w-])${escaped}(?![\\w-])`, 'g'), to);
  }
  return out;
}

/**
 * What can never work on moto: the functions connect to the instances (their port, an SSH host key scan)
 * when they run in the instances' VPC or the instances have public addresses, and moto's instances are
 * records, not machines: readiness would wait for a port that never answers.
 */
export function reachabilityWarnings(config: ResolvedConfig, inVpc: boolean): string[] {
  const reaching = awsLabelSettings(config).filter((l) => inVpc || l.publicIpv4 || l.hostKeys === 'scan');
  if (reaching.length === 0) return [];
  const why = inVpc ? 'the functions run in the instances’ VPC' : 'public-ipv4 or host-keys: scan';
  return [
    `the functions connect to the instances of ${[...new Set(reaching.map((l) => `${l.poolKey}/${l.label}`))].join(', ')} ` +
      `(${why}), and moto's instances are not machines: their backing nodes will wait for a port that never answers and fail. ` +
      'Rehearse with the functions outside the VPC, no public-ipv4 and host-keys: console or none.',
  ];
}
