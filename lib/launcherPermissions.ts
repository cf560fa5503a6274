import { type IRole, Policy, PolicyStatement } from 'aws-cdk-lib/aws-iam';
import { Aws, Validations } from 'aws-cdk-lib/core';
import { Construct } from 'constructs';
import type { ResolvedConfig } from '../shared/core/model.ts';
import { type AwsLabelSettings, awsPoolSettings } from '../shared/providers/aws/settings.ts';
import { cfnResource } from './cfnResource.ts';

/** The tag that marks an EC2 instance (and its volumes) as belonging to one pool; its value is the pool id. */
export const POOL_TAG_KEY = 'metastatic:pool';

export interface LauncherPermissionsProps {
  /** What is launched, where and from what: every aws backing label of the configuration (`awsLabels`). */
  readonly labels: readonly AwsLabelSettings[];
  /** The value of the `metastatic:pool` tag on the pool's instances and volumes. */
  readonly poolId: string;
  /**
   * The IAM roles inside the instance profiles the labels name (`iam-instance-profile`, or a launch
   * template), as role names in this account or role ARNs. Required when a label has an instance
   * profile: neither the profile's name nor its ARN says which role it contains, and iam:PassRole is
   * checked against the role.
   * @default - none (no label may have an instance profile)
   */
  readonly instanceRoles?: readonly string[];
  /**
   * The customer-managed KMS key (ARN, in the pools' region) that encrypts the instances' EBS volumes:
   * EC2 uses it on the launching principal's behalf, so that principal needs kms:CreateGrant (for AWS
   * resources only), kms:Decrypt, kms:DescribeKey, kms:GenerateDataKeyWithoutPlaintext and
   * kms:ReEncryptFrom/To on it (AWS's EBS encryption requirements).
   * @default - none (the volumes use the AWS managed key, aws/ebs)
   */
  readonly ebsKmsKeyArn?: string;
}

/** The EC2 resources RunInstances touches for the configured labels (ARNs), and what they imply. */
export interface LaunchResources {
  /** The one region all aws pools launch in. */
  readonly region: string;
  /** Resources RunInstances uses without creating them (images, subnets, ...). */
  readonly used: readonly string[];
  /** Resource types created by RunInstances that carry the pool tag (instance, volume). */
  readonly tagged: readonly string[];
  /** Resource types created by RunInstances that are not tagged (network interfaces, spot requests). */
  readonly untagged: readonly string[];
  readonly spot: boolean;
  /** Some label launches from a launch template (which may name an instance profile). */
  readonly launchTemplate: boolean;
  /** `<pool>/<label>` of every label with an instance profile. */
  readonly labelsWithProfile: readonly string[];
}

/** Why a wildcard resource in the policy is needed: keyed by resource type, for the cdk-nag acknowledgements. */
const WILDCARD_REASONS: Record<string, string> = {
  instance:
    'Instance ids are not known before launch: RunInstances requires the request tag metastatic:pool=<pool id>, ' +
    'TerminateInstances and GetConsoleOutput the resource tag metastatic:pool=<pool id>, CreateTags ec2:CreateAction=RunInstances.',
  volume:
    'Volumes are created by RunInstances: it requires the request tag metastatic:pool=<pool id> on them; ' +
    'CreateTags only with ec2:CreateAction=RunInstances.',
  'network-interface':
    'Network interfaces are created by RunInstances; their ids are not known before launch.',
  'spot-instances-request':
    'Spot requests are created by RunInstances for use-spot labels; their ids are not known.',
  image: 'A label launches from a launch template whose image the configuration does not name.',
  'key-pair': 'A label launches from a launch template whose key pair the configuration does not name.',
  'security-group':
    "A pool names no security group: instances get the VPC's default group (or the launch template's).",
  'launch-template': 'A label names its launch template by name; the ARN needs its id.',
};

/**
 * The EC2 and IAM permissions of the functions that launch, describe and terminate the pool's
 * instances, as one policy attached to their roles. RunInstances, TerminateInstances, GetConsoleOutput and CreateTags
 * are bound to the pool's tag; resources named in the configuration (images, subnets, security groups,
 * key pairs, launch templates by id) are granted by ARN, and only what it leaves open is a wildcard.
 */
export class LauncherPermissions extends Construct {
  readonly policy: Policy;
  readonly resources: LaunchResources;

  constructor(scope: Construct, id: string, props: LauncherPermissionsProps) {
    super(scope, id);
    const resources = launchResources(props.labels);
    this.resources = resources;
    const { region } = resources;
    const arn = (resource: string) => ec2Arn(region, resource);

    const roleArns = instanceRoleArns(props.instanceRoles ?? []);
    if (resources.labelsWithProfile.length > 0 && roleArns.length === 0) {
      throw new Error(
        `label(s) ${resources.labelsWithProfile.join(', ')} have an iam-instance-profile: give the role(s) in ` +
          'those profiles as instanceRoles (role names or ARNs) so that iam:PassRole can be granted for them',
      );
    }
    // A launch template may carry an instance profile of its own: then instanceRoles names its role.
    if (resources.labelsWithProfile.length === 0 && !resources.launchTemplate && roleArns.length > 0) {
      throw new Error(
        'instanceRoles is set, but no aws label has an iam-instance-profile or a launch template; remove instanceRoles',
      );
    }

    const statements = [
      new PolicyStatement({
        sid: 'RunTaggedInstances',
        actions: ['ec2:RunInstances'],
        resources: resources.tagged.map((type) => arn(`${type}/*`)),
        conditions: { StringEquals: { [`aws:RequestTag/${POOL_TAG_KEY}`]: props.poolId } },
      }),
      new PolicyStatement({
        sid: 'RunInstancesWith',
        actions: ['ec2:RunInstances'],
        resources: [...resources.used, ...resources.untagged.map((type) => arn(`${type}/*`))],
      }),
      new PolicyStatement({
        sid: 'TagOnLaunch',
        actions: ['ec2:CreateTags'],
        resources: resources.tagged.map((type) => arn(`${type}/*`)),
        conditions: { StringEquals: { 'ec2:CreateAction': 'RunInstances' } },
      }),
      new PolicyStatement({
        sid: 'TerminatePoolInstances',
        actions: ['ec2:TerminateInstances'],
        resources: [arn('instance/*')],
        conditions: { StringEquals: { [`aws:ResourceTag/${POOL_TAG_KEY}`]: props.poolId } },
      }),
      // The host keys cloud-init prints to the serial console (aws `host-keys: console`, the default
      // when the functions cannot reach the instances): only of the pool's own instances.
      new PolicyStatement({
        sid: 'ReadPoolConsoles',
        actions: ['ec2:GetConsoleOutput'],
        resources: [arn('instance/*')],
        conditions: { StringEquals: { [`aws:ResourceTag/${POOL_TAG_KEY}`]: props.poolId } },
      }),
      // None supports resource-level permissions. DescribeInstances: state of an instance and the list
      // of the pool's (filtered by its tag); DescribeImages: an image's root device, for the root volume;
      // DescribeLaunchTemplateVersions: whether a label's template has network interfaces (RunInstances
      // then takes subnet and groups only inside one).
      new PolicyStatement({
        sid: 'Describe',
        actions: [
          'ec2:DescribeInstances',
          'ec2:DescribeImages',
          ...(resources.launchTemplate ? ['ec2:DescribeLaunchTemplateVersions'] : []),
        ],
        resources: ['*'],
      }),
    ];
    if (resources.spot) {
      // The first spot launch in an account creates EC2's spot service-linked role.
      statements.push(
        new PolicyStatement({
          sid: 'SpotServiceLinkedRole',
          actions: ['iam:CreateServiceLinkedRole'],
          resources: [
            `arn:${Aws.PARTITION}:iam::${Aws.ACCOUNT_ID}:role/aws-service-role/spot.amazonaws.com/AWSServiceRoleForEC2Spot`,
          ],
          conditions: { StringEquals: { 'iam:AWSServiceName': 'spot.amazonaws.com' } },
        }),
      );
    }
    if (props.ebsKmsKeyArn !== undefined) {
      const keyArn = checkEbsKeyArn(props.ebsKmsKeyArn, region);
      statements.push(
        // Grants let EC2 use the key for the volume after launch; only grants for AWS resources.
        new PolicyStatement({
          sid: 'EbsKeyGrantsForEc2',
          actions: ['kms:CreateGrant'],
          resources: [keyArn],
          conditions: { Bool: { 'kms:GrantIsForAWSResource': 'true' } },
        }),
        new PolicyStatement({
          sid: 'EbsKeyUse',
          actions: [
            'kms:Decrypt',
            'kms:DescribeKey',
            'kms:GenerateDataKeyWithoutPlaintext',
            'kms:ReEncryptFrom',
            'kms:ReEncryptTo',
          ],
          resources: [keyArn],
        }),
      );
    }
    if (roleArns.length > 0) {
      statements.push(
        new PolicyStatement({
          sid: 'PassInstanceRoles',
          actions: ['iam:PassRole'],
          resources: roleArns,
          conditions: { StringEquals: { 'iam:PassedToService': 'ec2.amazonaws.com' } },
        }),
      );
    }
    this.policy = new Policy(this, 'Policy', { statements });

    // One acknowledgement per wildcard resource, each with the reason that resource cannot be named.
    const wildcards = new Set<string>(['instance', 'volume', ...resources.untagged]);
    for (const used of resources.used) {
      const match = /:([a-z-]+)\/\*$/.exec(used);
      if (match?.[1]) wildcards.add(match[1]);
    }
    for (const type of wildcards) {
      Validations.of(cfnResource(this.policy)).acknowledge({
        id: `AwsSolutions-IAM5[Resource::${nagArn(region, `${type}/*`)}]`,
        reason:
          WILDCARD_REASONS[type] ??
          `RunInstances creates or uses ${type} resources not named in the configuration.`,
      });
    }
    Validations.of(cfnResource(this.policy)).acknowledge({
      id: 'AwsSolutions-IAM5[Resource::*]',
      reason:
        'ec2:DescribeInstances, ec2:DescribeImages and ec2:DescribeLaunchTemplateVersions support no resource-level permissions (the functions ' +
        'filter instances by the pool tag).',
    });
  }

  /** Attaches the policy to a function's role. */
  grantTo(role: IRole): void {
    this.policy.attachToRole(role);
  }
}

/** Every aws backing label of the configuration with its launch settings. */
export function awsLabels(config: ResolvedConfig): AwsLabelSettings[] {
  return config.backingPools
    .filter((pool) => pool.driver === 'aws')
    .flatMap((pool) => [...awsPoolSettings(pool).values()]);
}

/**
 * What RunInstances needs for these labels. A resource the label or pool names is granted by ARN; one
 * left to a launch template or to the VPC's defaults is granted as `<type>/*`.
 */
export function launchResources(labels: readonly AwsLabelSettings[]): LaunchResources {
  const region = regionOf(labels);
  const used = new Set<string>();
  const arn = (resource: string) => ec2Arn(region, resource);
  for (const label of labels) {
    for (const subnet of label.subnetIds) used.add(arn(`subnet/${subnet}`));
    if (label.securityGroupIds.length === 0) used.add(arn('security-group/*'));
    for (const group of label.securityGroupIds) used.add(arn(`security-group/${group}`));
    if (label.keyName !== undefined) used.add(arn(`key-pair/${label.keyName}`));
    if (label.image.kind === 'image') {
      used.add(imageArn(region, label.image.imageId));
    } else {
      // The template supplies the image, and may supply a key pair.
      used.add(imageArn(region, '*'));
      if (label.keyName === undefined) used.add(arn('key-pair/*'));
      used.add(arn(`launch-template/${label.image.id ?? '*'}`));
    }
  }
  const spot = labels.some((l) => l.useSpot);
  return {
    region,
    used: [...used].sort(),
    tagged: ['instance', 'volume'],
    untagged: ['network-interface', ...(spot ? ['spot-instances-request'] : [])],
    spot,
    launchTemplate: labels.some((l) => l.image.kind === 'launch-template'),
    labelsWithProfile: labels
      .filter((l) => l.iamInstanceProfile !== undefined)
      .map((l) => `${l.poolKey.split('/')[1] ?? l.poolKey}/${l.label}`),
  };
}

/** The region of the configuration's aws pools: one for all, since the stack receives their EC2 events. */
export function poolRegion(config: ResolvedConfig): string {
  return regionOf(awsLabels(config));
}

function regionOf(labels: readonly AwsLabelSettings[]): string {
  const regions = [...new Set(labels.map((l) => l.region))];
  const region = regions[0];
  if (region === undefined) throw new Error('the configuration has no aws backing pool');
  if (regions.length > 1) {
    throw new Error(
      `aws pools use regions ${regions.join(', ')}: all must use one region, the stack's ` +
        '(EC2 state-change events reach EventBridge only in the region of the instance)',
    );
  }
  return region;
}

function ec2Arn(region: string, resource: string): string {
  return `arn:${Aws.PARTITION}:ec2:${region}:${Aws.ACCOUNT_ID}:${resource}`;
}

/** AMIs have no account in their ARN. */
function imageArn(region: string, imageId: string): string {
  return `arn:${Aws.PARTITION}:ec2:${region}::image/${imageId}`;
}

/** How cdk-nag prints an ARN built by ec2Arn/imageArn in a finding id. */
function nagArn(region: string, resource: string): string {
  const account = resource.startsWith('image/') ? '' : '<AWS::AccountId>';
  return `arn:<AWS::Partition>:ec2:${region}:${account}:${resource}`;
}

/** A KMS key ARN (not an alias: IAM grants on keys by key ARN) in the pools' region. */
function checkEbsKeyArn(arn: string, region: string): string {
  const match = /^arn:[a-z-]+:kms:([a-z0-9-]+):\d{12}:key\/[A-Za-z0-9-]+$/.exec(arn);
  if (!match) {
    throw new Error(
      `ebsKmsKeyArn: ${arn} is not a KMS key ARN (arn:<partition>:kms:<region>:<account>:key/<key id>; not an alias)`,
    );
  }
  if (match[1] !== region) {
    throw new Error(
      `ebsKmsKeyArn: the key is in ${match[1]}, but the instances launch in ${region}: EBS uses a key of their region`,
    );
  }
  return arn;
}

/** Role names (this account) or role ARNs -> role ARNs. */
function instanceRoleArns(roles: readonly string[]): string[] {
  return roles.map((role) => {
    if (role.startsWith('arn:')) {
      if (!/^arn:[^:]+:iam::\d{12}:role\/.+/.test(role)) {
        throw new Error(
          `instanceRoles: ${role} is not an IAM role ARN (arn:<partition>:iam::<account>:role/<name>)`,
        );
      }
      return role;
    }
    if (!/^[\w+=,.@/-]+$/.test(role)) throw new Error(`instanceRoles: ${role} is not a role name or ARN`);
    return `arn:${Aws.PARTITION}:iam::${Aws.ACCOUNT_ID}:role/${role}`;
  });
}
