import { createHash } from 'node:crypto';
import type {
  _InstanceType,
  InstanceNetworkInterfaceSpecification,
  LaunchTemplateInstanceNetworkInterfaceSpecification,
  RunInstancesCommandInput,
  Tag,
} from '@aws-sdk/client-ec2';
import type { LaunchSpec } from '../../core/provider.ts';
import { limitsOf } from '../../core/slotLimits.ts';
import { DEFAULT_AWS_USERNAME } from '../../fields/contractFields.ts';
import type { Offering } from './offerings.ts';
import type { AwsImage, AwsLabelSettings } from './settings.ts';
import { composeUserData, MAX_USERDATA_BYTES, userDataBytes } from './userData.ts';

/**
 * The RunInstances request, built as plain data from a label's settings (no EC2 call here).
 *
 * - Every instance is tagged at creation (instance and volumes) with this deployment's pool id
 *   (`metastatic:pool`), its backing node id, backing pool and label, so the tagged instance list is the
 *   truth for reconciliation (Arvados' invariant).
 * - Launches are idempotent: the ClientToken is derived from (pool id, backing node id, attempt,
 *   offering), so a redelivered message that tries the same offering gets the same instance back.
 * - Network parameters follow RunInstances' rules (networkParameters): top-level SubnetId and
 *   SecurityGroupIds, unless a public IPv4 address must be requested or the launch template has network
 *   interfaces; then one network interface (DeviceIndex 0) carries subnet and groups, never the top-level
 *   parameters ("If you specify a network interface, you must specify any security groups and subnets as
 *   part of the network interface"; EC2 answers InvalidParameterCombination otherwise, also when the
 *   conflicting half comes from the launch template).
 */

/** This deployment's pool id: every instance we own carries it. */
export const TAG_POOL = 'metastatic:pool';
export const TAG_BACKING_NODE_ID = 'metastatic:backing-node-id';
/** The backing pool key `<provider>/<pool>`. */
export const TAG_BACKING_POOL = 'metastatic:backing-pool';
/** The backing label. */
export const TAG_LABEL = 'metastatic:label';
/** `metastatic-<backingNodeId>` unless the label's tags set a Name. */
export const TAG_NAME = 'Name';

/** Root device name used when the image does not report one. */
export const DEFAULT_ROOT_DEVICE = '/dev/xvda';

/**
 * The RunInstances ClientToken (<= 64 ASCII characters): the same pool id, backing node, attempt and
 * offering always give the same token; another offering gives another token.
 */
export function clientToken(poolId: string, spec: LaunchSpec, offering: Offering): string {
  const digest = createHash('sha256')
    .update(
      [
        poolId,
        spec.backingNodeId,
        spec.attempt,
        offering.instanceType,
        offering.subnetId,
        offering.market,
      ].join('\n'),
    )
    .digest('hex');
  return `metastatic-${digest.slice(0, 48)}`;
}

/** What a launch template version says about the network: what RunInstances' rules depend on. */
export interface TemplateNetwork {
  /** `id=lt-1 version $Default`, for messages. */
  readonly describe: string;
  /** Its network interfaces (DeviceIndex 0, or unset, is the primary one). */
  readonly interfaces: readonly LaunchTemplateInstanceNetworkInterfaceSpecification[];
  /** Security groups it sets at instance level (SecurityGroupIds, SecurityGroups). */
  readonly instanceGroups: readonly string[];
  /** Its user data, decoded: user data given at launch replaces it, so ours is combined with it. */
  readonly userData?: string;
}

export type NetworkParameters = Pick<
  RunInstancesCommandInput,
  'SubnetId' | 'SecurityGroupIds' | 'NetworkInterfaces'
>;

/**
 * The network part of RunInstances for an offering's subnet, after RunInstances' rules: with a network
 * interface in the request or in its launch template, subnet and security groups must be given in the
 * network interface, not at instance level (InvalidParameterCombination: "Network interfaces and an
 * instance-level subnet ID / security groups may not be specified on the same request"), and a launch
 * template's parameters can be overridden at launch but not removed.
 *
 * - No network interface in the template, no public IPv4: `SubnetId`, and `SecurityGroupIds` when the
 *   pool names groups (they replace the template's; without, the template's groups or the VPC's default
 *   group apply).
 * - public-ipv4 (and no interface in the template): one interface, DeviceIndex 0, with the subnet,
 *   AssociatePublicIpAddress and the pool's groups. A template that sets instance-level groups cannot be
 *   combined with it (its groups cannot be removed): an Error says what to change.
 * - The template has network interfaces: they are sent back with the primary one's SubnetId replaced by
 *   the offering's, its Groups by the pool's (when given) and AssociatePublicIpAddress set with
 *   public-ipv4; whether EC2 merges request and template interfaces or replaces them, the result is the
 *   same. A template that attaches an existing interface (NetworkInterfaceId) or also sets instance-level
 *   groups cannot launch in our subnets: an Error says so.
 */
export function networkParameters(
  settings: Pick<AwsLabelSettings, 'securityGroupIds' | 'publicIpv4'>,
  subnetId: string,
  template?: TemplateNetwork,
): NetworkParameters {
  const groups = settings.securityGroupIds.length > 0 ? { Groups: [...settings.securityGroupIds] } : {};
  const interfaces = template?.interfaces ?? [];
  if (template && template.instanceGroups.length > 0 && (interfaces.length > 0 || settings.publicIpv4)) {
    const why =
      interfaces.length > 0
        ? 'it also has network interfaces, and EC2 rejects instance-level security groups with network interfaces'
        : 'public-ipv4 needs a network interface in the request, and EC2 rejects a network interface with instance-level security groups';
    throw new Error(
      `launch template ${template.describe} sets security groups at instance level (${template.instanceGroups.join(', ')}): ${why} (InvalidParameterCombination); move the groups into the template's network interface (DeviceIndex 0, Groups), or give them as the pool's security-group-ids and remove them from the template`,
    );
  }
  if (interfaces.length === 0) {
    if (!settings.publicIpv4) {
      return {
        SubnetId: subnetId,
        ...(groups.Groups ? { SecurityGroupIds: groups.Groups } : {}),
      };
    }
    return {
      NetworkInterfaces: [
        {
          DeviceIndex: 0,
          SubnetId: subnetId,
          AssociatePublicIpAddress: true,
          DeleteOnTermination: true,
          ...groups,
        },
      ],
    };
  }
  const isPrimary = (n: LaunchTemplateInstanceNetworkInterfaceSpecification) =>
    (n.DeviceIndex ?? 0) === 0 && (n.NetworkCardIndex ?? 0) === 0;
  const primary = interfaces.find(isPrimary);
  if (primary?.NetworkInterfaceId !== undefined) {
    throw new Error(
      `launch template ${template?.describe} attaches the existing network interface ${primary.NetworkInterfaceId}: it can launch one instance in its subnet only; remove NetworkInterfaceId from the template`,
    );
  }
  const ours: InstanceNetworkInterfaceSpecification = {
    ...(primary ? requestInterface(primary) : { DeleteOnTermination: true }),
    DeviceIndex: 0,
    SubnetId: subnetId,
    ...groups,
    ...(settings.publicIpv4 ? { AssociatePublicIpAddress: true } : {}),
  };
  return {
    NetworkInterfaces: [ours, ...interfaces.filter((n) => n !== primary).map(requestInterface)],
  };
}

/** A launch template's network interface as a RunInstances one (the same fields, with defined values). */
function requestInterface(
  n: LaunchTemplateInstanceNetworkInterfaceSpecification,
): InstanceNetworkInterfaceSpecification {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(n)) {
    if (value !== undefined && !(Array.isArray(value) && value.length === 0)) out[key] = value;
  }
  return out as InstanceNetworkInterfaceSpecification;
}

/** `id=lt-1 version 3` / `name=builders version $Default` */
export function describeTemplate(image: Extract<AwsImage, { kind: 'launch-template' }>): string {
  const which = image.id !== undefined ? `id=${image.id}` : `name=${image.name}`;
  return `${which} version ${image.version ?? '$Default'}`;
}

/**
 * The user data of a launch (userData.ts): the label's own `userdata`, else its launch template's, with
 * the pool's authorized-keys and per-slot users. Over EC2's 16 KB it is an Error that names the keys to
 * change (the configuration check catches this before, except for a launch template's own user data,
 * which only EC2 knows).
 */
export function launchUserData(
  spec: LaunchSpec,
  settings: AwsLabelSettings,
  templateUserData?: string,
): string | undefined {
  const own = settings.userdata ?? templateUserData;
  const username = settings.username ?? DEFAULT_AWS_USERNAME;
  const text = composeUserData({
    ...(own === undefined ? {} : { own }),
    authorizedKeys: settings.authorizedKeys ?? [],
    ...(settings.perSlotUsers
      ? {
          slotUsers: {
            username,
            slots: spec.slots ?? 1,
            ...(settings.contain
              ? { contain: { limits: limitsOf(spec.slot), imds: settings.slotImds === true } }
              : {}),
          },
        }
      : {}),
  });
  if (text !== undefined && userDataBytes(text) > MAX_USERDATA_BYTES) {
    const whose =
      settings.userdata !== undefined
        ? 'userdata'
        : templateUserData !== undefined
          ? "launch template's user data"
          : '';
    throw new Error(
      `the user data of label ${settings.label} in ${settings.poolKey} would be ${userDataBytes(text)} bytes, over EC2's ${MAX_USERDATA_BYTES}: ${[whose, 'authorized-keys', settings.perSlotUsers ? `per-slot-users (${spec.slots ?? 1} users)` : ''].filter(Boolean).join(', ')} together; make them smaller`,
    );
  }
  return text;
}

/**
 * The parts of the RunInstances request that do not depend on the offering. `rootDevice` is the image's
 * root device name (for the encrypted root volume mapping), needed when the label names an image;
 * `templateUserData` the launch template's user data, when the label launches from one.
 */
export function baseRequest(
  spec: LaunchSpec,
  settings: AwsLabelSettings,
  poolId: string,
  rootDevice: string | undefined,
  templateUserData?: string,
): RunInstancesCommandInput {
  const tags = tagsFor(spec, settings, poolId);
  const image = settings.image;
  const input: RunInstancesCommandInput = {
    MinCount: 1,
    MaxCount: 1,
    MetadataOptions: { HttpTokens: 'required', HttpEndpoint: 'enabled', HttpPutResponseHopLimit: 2 },
    InstanceInitiatedShutdownBehavior: 'terminate',
    TagSpecifications: [
      { ResourceType: 'instance', Tags: tags },
      { ResourceType: 'volume', Tags: tags },
    ],
  };
  if (image.kind === 'image') {
    input.ImageId = image.imageId;
    input.BlockDeviceMappings = [
      {
        DeviceName: rootDevice ?? DEFAULT_ROOT_DEVICE,
        Ebs: {
          Encrypted: true,
          DeleteOnTermination: true,
          VolumeType: settings.volumeType,
          ...(settings.volumeSize !== undefined ? { VolumeSize: settings.volumeSize } : {}),
        },
      },
    ];
  } else {
    input.LaunchTemplate = {
      ...(image.id !== undefined ? { LaunchTemplateId: image.id } : { LaunchTemplateName: image.name }),
      ...(image.version !== undefined ? { Version: image.version } : {}),
    };
  }
  if (settings.keyName !== undefined) input.KeyName = settings.keyName;
  const userData = launchUserData(spec, settings, templateUserData);
  // Not the template's own, unchanged: sending it back would change nothing.
  if (userData !== undefined && userData !== templateUserData)
    input.UserData = Buffer.from(userData, 'utf8').toString('base64');
  if (settings.iamInstanceProfile) {
    input.IamInstanceProfile =
      'arn' in settings.iamInstanceProfile
        ? { Arn: settings.iamInstanceProfile.arn }
        : { Name: settings.iamInstanceProfile.name };
  }
  return input;
}

/** The whole request for one offering: the base, its instance type, network and market, its ClientToken. */
export function offeringRequest(
  base: RunInstancesCommandInput,
  settings: AwsLabelSettings,
  spec: LaunchSpec,
  offering: Offering,
  poolId: string,
  template: TemplateNetwork | undefined,
): RunInstancesCommandInput {
  return {
    ...base,
    InstanceType: offering.instanceType as _InstanceType,
    ...networkParameters(settings, offering.subnetId, template),
    ...(offering.market === 'spot'
      ? {
          InstanceMarketOptions: {
            MarketType: 'spot',
            SpotOptions: { SpotInstanceType: 'one-time', InstanceInterruptionBehavior: 'terminate' },
          },
        }
      : {}),
    ClientToken: clientToken(poolId, spec, offering),
  };
}

/** Our tags, then Name, then the label's own tags (which may set Name but no reserved key). */
function tagsFor(spec: LaunchSpec, settings: AwsLabelSettings, poolId: string): Tag[] {
  const tags = new Map<string, string>([
    [TAG_POOL, poolId],
    [TAG_BACKING_NODE_ID, spec.backingNodeId],
    [TAG_BACKING_POOL, spec.poolKey],
    [TAG_LABEL, spec.label],
    [TAG_NAME, `metastatic-${spec.backingNodeId}`],
  ]);
  for (const [key, value] of Object.entries(settings.tags)) {
    const lower = key.toLowerCase();
    if (lower.startsWith('aws:') || lower.startsWith('metastatic:')) continue;
    tags.set(key, value);
  }
  return [...tags].map(([Key, Value]) => ({ Key, Value }));
}

/** An instance's tags as a map. */
export function tagMap(tags: readonly Tag[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const tag of tags ?? []) {
    if (tag.Key !== undefined) out[tag.Key] = tag.Value ?? '';
  }
  return out;
}
