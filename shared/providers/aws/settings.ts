/**
 * The aws driver's options of a backing pool (model.ts keeps them as written, kebab-case) turned into
 * the typed, normalized settings the EC2 provider launches from. The options are validated again here
 * (its schema and its driver's rules), so a hand-built BackingPool fails as clearly as a file would.
 */

import type { BackingPool } from '../../core/model.ts';
import { formatPath } from '../../fields/paths.ts';
import {
  type AwsProviderConfig,
  awsProviderSchema,
  type EBS_VOLUME_TYPES,
  type HostKeySource,
} from './configSchema.ts';
import { awsDriver } from './driver.ts';

/** The root volume type when the label gives none. */
export const DEFAULT_VOLUME_TYPE = 'gp3';

export type AwsImage =
  | { readonly kind: 'image'; readonly imageId: string }
  | {
      readonly kind: 'launch-template';
      readonly id?: string;
      readonly name?: string;
      readonly version?: string;
    };

/** Everything needed to launch and describe one backing label of one aws pool. */
export interface AwsLabelSettings {
  readonly poolKey: string;
  readonly label: string;
  readonly region: string;
  /** Tried in order; never empty. */
  readonly instanceTypes: readonly string[];
  /** Tried in order; never empty. */
  readonly subnetIds: readonly string[];
  /** Empty: the VPC's default security group. */
  readonly securityGroupIds: readonly string[];
  readonly publicIpv4: boolean;
  readonly image: AwsImage;
  readonly keyName?: string;
  readonly userdata?: string;
  readonly iamInstanceProfile?: { readonly name: string } | { readonly arn: string };
  readonly volumeSize?: number;
  readonly volumeType: (typeof EBS_VOLUME_TYPES)[number];
  readonly tags: Readonly<Record<string, string>>;
  readonly useSpot: boolean;
  readonly connectionPort: number;
  /** The pool's authorized-keys: put on every instance through cloud-init (userData.ts). Unset: none. */
  readonly authorizedKeys?: readonly string[];
  /** Whom jobs log in as; with perSlotUsers, the prefix of the slot users. Unset: ec2-user. */
  readonly username?: string;
  readonly perSlotUsers?: boolean;
  /** `isolation: contain`: the slots are contained by the slot program (slotBoot.ts). */
  readonly contain?: boolean;
  /** With contain: slot users may reach IMDS. */
  readonly slotImds?: boolean;
  /** `host-keys` of the label, else of the pool; unset: by the functions' network (awsContext). */
  readonly hostKeys?: HostKeySource;
}

/** The settings of every label of an aws backing pool; throws when the options are invalid. */
export function awsPoolSettings(pool: BackingPool): Map<string, AwsLabelSettings> {
  if (pool.driver !== 'aws') throw new Error(`backing pool ${pool.key} uses driver ${pool.driver}, not aws`);
  const raw = {
    ...pool.providerOptions,
    name: pool.providerName,
    driver: 'aws',
    pools: [
      {
        ...pool.poolOptions,
        name: pool.poolName,
        labels: [...pool.labels.values()].map((label) => ({ ...label.options, name: label.name })),
      },
    ],
  };
  // The aws driver's own rules, as the configuration's check ran them (one slot per backing node here).
  const problems: string[] = awsDriver
    .rules(raw, ['providers', 0], () => 1)
    .map((issue) => `${formatPath(issue.path)}: ${issue.message}`);
  const parsed = awsProviderSchema.safeParse(raw);
  if (!parsed.success) {
    for (const issue of parsed.error.issues) problems.push(`${formatPath(issue.path)}: ${issue.message}`);
  }
  if (!parsed.success || problems.length > 0) {
    throw new Error(`invalid aws backing pool ${pool.key}: ${problems.join('; ')}`);
  }
  return settingsOf(pool.key, parsed.data);
}

function settingsOf(poolKey: string, provider: AwsProviderConfig): Map<string, AwsLabelSettings> {
  const out = new Map<string, AwsLabelSettings>();
  const pool = provider.pools[0];
  if (!pool) return out;
  const subnetIds = pool['subnet-ids'] ?? (pool['subnet-id'] ? [pool['subnet-id']] : []);
  const securityGroupIds =
    pool['security-group-ids'] ?? (pool['security-group-id'] ? [pool['security-group-id']] : []);
  for (const label of pool.labels) {
    const template = label['launch-template'];
    const profile = label['iam-instance-profile'];
    const image: AwsImage = template
      ? {
          kind: 'launch-template',
          ...(template.id !== undefined ? { id: template.id } : {}),
          ...(template.name !== undefined ? { name: template.name } : {}),
          ...(template.version !== undefined ? { version: String(template.version) } : {}),
        }
      : { kind: 'image', imageId: label['image-id'] ?? '' };
    out.set(label.name, {
      poolKey,
      label: label.name,
      region: provider.region,
      instanceTypes: label['instance-types'] ?? (label['instance-type'] ? [label['instance-type']] : []),
      subnetIds,
      securityGroupIds,
      publicIpv4: pool['public-ipv4'],
      image,
      ...(label['key-name'] !== undefined ? { keyName: label['key-name'] } : {}),
      ...(label.userdata !== undefined ? { userdata: label.userdata } : {}),
      ...(profile?.arn !== undefined
        ? { iamInstanceProfile: { arn: profile.arn } }
        : profile?.name !== undefined
          ? { iamInstanceProfile: { name: profile.name } }
          : {}),
      ...(label['volume-size'] !== undefined ? { volumeSize: label['volume-size'] } : {}),
      volumeType: label['volume-type'] ?? DEFAULT_VOLUME_TYPE,
      tags: label.tags,
      useSpot: label['use-spot'],
      connectionPort: label['connection-port'],
      authorizedKeys: pool['authorized-keys'] ?? [],
      username: label.username,
      perSlotUsers: label['per-slot-users'],
      ...(label.isolation === 'contain' ? { contain: true, slotImds: label['slot-imds'] } : {}),
      ...((label['host-keys'] ?? pool['host-keys'])
        ? { hostKeys: label['host-keys'] ?? pool['host-keys'] }
        : {}),
    });
  }
  return out;
}
