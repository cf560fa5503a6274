/**
 * The `aws` driver: backing nodes are EC2 instances.
 *
 * - Every instance is tagged at creation (instance and volumes) with this deployment's pool id
 *   (`metastatic:pool`), its backing node id, backing pool and label, so the tagged instance list is the
 *   truth for reconciliation (Arvados' invariant).
 * - Launches are idempotent: the ClientToken is derived from (pool id, backing node id, attempt,
 *   offering), so a redelivered message that tries the same offering gets the same instance back. When a
 *   label has several offerings, launch() first looks for a live instance already tagged with the
 *   backing node id (a previous delivery may have fallen back to another offering).
 * - Offerings are tried in order: with `use-spot`, every spot offering first (each instance type x each
 *   subnet), then every on-demand one; without, the on-demand ones. A spot capacity miss therefore tries
 *   spot in the other subnets and types before paying for on-demand.
 * - A capacity error moves to the next offering and is remembered for 5 minutes (later launches skip
 *   that offering, or the whole subnet when it ran out of addresses).
 * - A quota error is remembered for 5 minutes against its scope only (ec2Errors.ts quotaScope: quotas
 *   are per account and region, and on-demand and spot have separate ones): MaxSpotInstanceCountExceeded
 *   skips every spot offering, VcpuLimitExceeded the offerings of the same market and vCPU bucket
 *   (Standard, G and VT, P, ...), InstanceLimitExceeded those of the same market and instance type; the
 *   launch goes on with the offerings outside the scope. Quotas are shared by every pool of this
 *   provider (one client, one account).
 * - When every offering fails, the attempt fails naming every reason; when every one is skipped (or
 *   failed on a quota only), launch() throws CapacityError: the request waits instead of spending the
 *   attempt, and launchBlocked() tells why until one of them may work again.
 * - Throttling and transient server errors are retried with jittered exponential backoff (1 s, x1.5,
 *   at most 60 s; 4 retries per call), then RetryableError (the message comes back later).
 * - Network parameters follow RunInstances' rules (networkParameters): top-level SubnetId and
 *   SecurityGroupIds, unless a public IPv4 address must be requested or the launch template has network
 *   interfaces; then one network interface (DeviceIndex 0) carries subnet and groups, never the top-level
 *   parameters ("If you specify a network interface, you must specify any security groups and subnets as
 *   part of the network interface"; EC2 answers InvalidParameterCombination otherwise, also when the
 *   conflicting half comes from the launch template). A label's launch template is read once
 *   (DescribeLaunchTemplateVersions; numbered versions for good, $Default/$Latest for 5 minutes) to
 *   know which case applies.
 * - EC2 is eventually consistent: an instance launched a moment ago can be unknown to DescribeInstances
 *   and TerminateInstances (`eventuallyConsistent`); describe() then returns undefined and terminate()
 *   succeeds, and the caller decides how long "not found" means "not yet".
 *
 * The backoff here is the only retry policy: create the EC2Client with `maxAttempts: 1`
 * (createEc2Client does), otherwise the SDK's own retries multiply with these.
 *
 * State changes are not reported by this provider: on AWS they come from EventBridge's "EC2 Instance
 * State-change Notification" events.
 *
 * IAM: ec2:RunInstances, ec2:CreateTags (for TagSpecifications), ec2:DescribeInstances,
 * ec2:DescribeImages, ec2:TerminateInstances (best restricted with `ec2:ResourceTag/metastatic:pool`),
 * ec2:DescribeLaunchTemplateVersions when labels use launch templates, iam:PassRole when labels use an
 * instance profile.
 */
import { createHash } from 'node:crypto';
import {
  type _InstanceType,
  DescribeImagesCommand,
  DescribeInstancesCommand,
  DescribeLaunchTemplateVersionsCommand,
  EC2Client,
  type EC2ClientConfig,
  type Filter,
  type Instance,
  type InstanceNetworkInterfaceSpecification,
  type LaunchTemplateInstanceNetworkInterfaceSpecification,
  paginateDescribeInstances,
  RunInstancesCommand,
  type RunInstancesCommandInput,
  type Tag,
  TerminateInstancesCommand,
} from '@aws-sdk/client-ec2';
import type { BackingPool } from '../../config/model.ts';
import type { Clock } from '../../core/clock.ts';
import { CapacityError, RetryableError } from '../../core/errors.ts';
import type { BackingProvider, BackingResource, LaunchSpec, ResourceState } from '../../core/provider.ts';
import type { Log } from '../../usecases/context.ts';
import {
  type BackoffPolicy,
  backoffDelay,
  classifyEc2Error,
  DEFAULT_BACKOFF,
  describeEc2Error,
  ec2ErrorCode,
  ec2ErrorMessage,
  quotaScope,
  quotaScopesOf,
  SUBNET_WIDE_ERROR_CODES,
} from './ec2Errors.ts';
import { type AwsImage, type AwsLabelSettings, awsPoolSettings } from './settings.ts';

// ---- tags -------------------------------------------------------------------------------------------

/** This deployment's pool id: every instance we own carries it. */
export const TAG_POOL = 'metastatic:pool';
export const TAG_BACKING_NODE_ID = 'metastatic:backing-node-id';
/** The backing pool key `<provider>/<pool>`. */
export const TAG_BACKING_POOL = 'metastatic:backing-pool';
/** The backing label. */
export const TAG_LABEL = 'metastatic:label';
/** `metastatic-<backingNodeId>` unless the label's tags set a Name. */
export const TAG_NAME = 'Name';

// ---- constants --------------------------------------------------------------------------------------

/** How long an offering that had no capacity is skipped. */
export const OFFERING_BACKOFF_MS = 5 * 60_000;
/** How long the offerings in a quota's scope are skipped after a quota error. */
export const QUOTA_PAUSE_MS = 5 * 60_000;
/** How long what a `$Default`/`$Latest` launch template version says is trusted (a numbered one: always). */
export const TEMPLATE_CACHE_MS = 5 * 60_000;
/** TerminateInstances takes at most this many ids. */
export const TERMINATE_BATCH_SIZE = 1000;
/** DescribeInstances pages: EC2 accepts MaxResults from 5 to 1000. */
export const LIST_PAGE_SIZE = 1000;
export const MIN_LIST_PAGE_SIZE = 5;
/** Root device name used when the image does not report one. */
export const DEFAULT_ROOT_DEVICE = '/dev/xvda';

/** Instance states list() returns (terminated ones are left out). */
export const LISTED_STATES: readonly ResourceState[] = [
  'pending',
  'running',
  'stopping',
  'stopped',
  'shutting-down',
];
const RESOURCE_STATES: ReadonlySet<string> = new Set<ResourceState>([...LISTED_STATES, 'terminated']);

/** Whether `id` has the shape of an EC2 instance id (for routing events to this provider). */
export function isEc2InstanceId(id: string): boolean {
  return /^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$/.test(id);
}

/** An EC2 client for the provider: the SDK's retries are off, the provider's backoff is the policy. */
export function createEc2Client(region: string, config: EC2ClientConfig = {}): EC2Client {
  return new EC2Client({ ...config, region, maxAttempts: 1 });
}

// ---- offerings --------------------------------------------------------------------------------------

export type Market = 'spot' | 'on-demand';

/** One way to launch a label: an instance type in a subnet, spot or on-demand. */
export interface Offering {
  readonly instanceType: string;
  readonly subnetId: string;
  readonly market: Market;
}

/**
 * With use-spot every spot offering, then every on-demand one; without, the on-demand ones. Within a
 * market: every instance type (in order) x every subnet (in order).
 */
export function offeringsOf(settings: AwsLabelSettings): Offering[] {
  const markets: Market[] = settings.useSpot ? ['spot', 'on-demand'] : ['on-demand'];
  const out: Offering[] = [];
  for (const market of markets) {
    for (const instanceType of settings.instanceTypes) {
      for (const subnetId of settings.subnetIds) out.push({ instanceType, subnetId, market });
    }
  }
  return out;
}

/** `m7i.large in subnet-1 (spot)` */
export function describeOffering(o: Offering): string {
  return `${o.instanceType} in ${o.subnetId} (${o.market})`;
}

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

// ---- network parameters -----------------------------------------------------------------------------

/** What a launch template version says about the network: what RunInstances' rules depend on. */
export interface TemplateNetwork {
  /** `id=lt-1 version $Default`, for messages. */
  readonly describe: string;
  /** Its network interfaces (DeviceIndex 0, or unset, is the primary one). */
  readonly interfaces: readonly LaunchTemplateInstanceNetworkInterfaceSpecification[];
  /** Security groups it sets at instance level (SecurityGroupIds, SecurityGroups). */
  readonly instanceGroups: readonly string[];
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

// ---- the provider -----------------------------------------------------------------------------------

export type Ec2ProviderLog = Pick<Log, 'info' | 'warn'>;

export interface Ec2ProviderOptions {
  /** Create it with `maxAttempts: 1` (see createEc2Client); its region must be the pools' region. */
  readonly client: EC2Client;
  /** The backing pools this provider launches in; pools of other drivers are ignored. */
  readonly pools: readonly BackingPool[];
  /** The value of the `metastatic:pool` tag: one per deployment (stack), shared by all its pools. */
  readonly poolId: string;
  readonly clock: Clock;
  readonly log?: Ec2ProviderLog;
  /** Injectable for tests; default setTimeout. */
  readonly sleep?: (ms: number) => Promise<void>;
  /** Injectable for tests; default Math.random. */
  readonly random?: () => number;
  /** Overrides of DEFAULT_BACKOFF. */
  readonly backoff?: Partial<BackoffPolicy>;
  /** Instances per DescribeInstances page in list() (5..1000, EC2's bounds); default 1000. */
  readonly listPageSize?: number;
}

interface Remembered {
  readonly kind: 'capacity' | 'quota';
  readonly code: string;
  readonly message: string;
  /** For a quota: the launches it holds for (ec2Errors.ts quotaScope). */
  readonly scope?: string;
  readonly at: number;
  readonly until: number;
}

/** Retries left in one provider call, shared by all the EC2 requests the call makes. */
interface RetryBudget {
  used: number;
}

const noLog: Ec2ProviderLog = { info() {}, warn() {} };

const defaultSleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

function tagMap(tags: readonly Tag[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const tag of tags ?? []) {
    if (tag.Key !== undefined) out[tag.Key] = tag.Value ?? '';
  }
  return out;
}

function toTags(entries: Iterable<readonly [string, string]>): Tag[] {
  return [...entries].map(([Key, Value]) => ({ Key, Value }));
}

export class Ec2Provider implements BackingProvider {
  /** Right after RunInstances, DescribeInstances and TerminateInstances may not know the instance yet. */
  readonly eventuallyConsistent = true;
  private readonly client: EC2Client;
  private readonly poolId: string;
  private readonly clock: Clock;
  private readonly log: Ec2ProviderLog;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly random: () => number;
  private readonly backoff: BackoffPolicy;
  private readonly listPageSize: number;
  /** poolKey -> label -> settings. */
  private readonly settings = new Map<string, Map<string, AwsLabelSettings>>();
  /** Offerings, whole subnets or quota scopes that failed a moment ago, by offeringKey / subnetKey / quotaKey. */
  private readonly failures = new Map<string, Remembered>();
  /** imageId -> root device name (never changes for an AMI). */
  private readonly rootDevices = new Map<string, string>();
  /** What launch template versions say about the network, until when. */
  private readonly templates = new Map<
    string,
    { readonly network: TemplateNetwork; readonly until: number }
  >();

  constructor(options: Ec2ProviderOptions) {
    this.client = options.client;
    this.poolId = options.poolId;
    this.clock = options.clock;
    this.log = options.log ?? noLog;
    this.sleep = options.sleep ?? defaultSleep;
    this.random = options.random ?? Math.random;
    this.backoff = { ...DEFAULT_BACKOFF, ...options.backoff };
    this.listPageSize = options.listPageSize ?? LIST_PAGE_SIZE;
    if (this.poolId === '') throw new Error('Ec2Provider: poolId must not be empty');
    if (
      !Number.isInteger(this.listPageSize) ||
      this.listPageSize < MIN_LIST_PAGE_SIZE ||
      this.listPageSize > LIST_PAGE_SIZE
    ) {
      throw new Error(
        `Ec2Provider: listPageSize must be an integer from ${MIN_LIST_PAGE_SIZE} to ${LIST_PAGE_SIZE} (EC2's MaxResults), not ${this.listPageSize}`,
      );
    }
    for (const pool of options.pools) {
      if (pool.driver === 'aws') this.settings.set(pool.key, awsPoolSettings(pool));
    }
  }

  /** Whether this provider launches in the backing pool. */
  servesPool(poolKey: string): boolean {
    return this.settings.has(poolKey);
  }

  /**
   * Why the label cannot launch now: every one of its offerings had no capacity, or is in the scope of a
   * quota reached, within the last 5 minutes. Without a label: when that holds for every label of the
   * pool. Undefined while some offering may work.
   */
  launchBlocked(poolKey: string, label?: string): string | undefined {
    const labels = this.settings.get(poolKey);
    if (!labels) return undefined;
    if (label !== undefined) {
      const settings = labels.get(label);
      return settings ? this.labelBlocked(settings) : undefined;
    }
    const reasons: string[] = [];
    for (const settings of labels.values()) {
      const reason = this.labelBlocked(settings);
      if (reason === undefined) return undefined;
      reasons.push(reason);
    }
    return reasons.length > 0 ? reasons.join(' | ') : undefined;
  }

  async launch(spec: LaunchSpec): Promise<{ resourceId: string }> {
    const settings = this.settingsFor(spec.poolKey, spec.label);
    // Every offering failed (capacity or quota) a moment ago: wait, do not spend the attempt.
    const blocked = this.labelBlocked(settings);
    if (blocked !== undefined) throw new CapacityError(blocked);
    const budget: RetryBudget = { used: 0 };
    const offerings = offeringsOf(settings);

    if (offerings.length > 1) {
      // A previous delivery may have launched on another offering than the first one we try now.
      const existing = await this.findLive(spec.backingNodeId, budget);
      if (existing !== undefined) {
        this.log.info('ec2 instance already launched for backing node', {
          backingNodeId: spec.backingNodeId,
          instanceId: existing,
        });
        return { resourceId: existing };
      }
    }

    const base = await this.baseRequest(spec, settings, budget);
    const template =
      settings.image.kind === 'launch-template'
        ? await this.templateNetwork(settings.image, budget)
        : undefined;
    const outcomes: string[] = [];
    let tried = 0;
    let capacityMisses = 0;
    for (const offering of offerings) {
      const remembered = this.remembered(offering);
      if (remembered) {
        const ago = Math.round((this.clock.now() - remembered.at) / 1000);
        outcomes.push(`${describeOffering(offering)}: skipped, ${describeMemo(remembered)} ${ago}s ago`);
        continue;
      }
      tried++;
      const input: RunInstancesCommandInput = {
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
        ClientToken: clientToken(this.poolId, spec, offering),
      };
      try {
        const out = await this.call('RunInstances', budget, () =>
          this.client.send(new RunInstancesCommand(input)),
        );
        const instanceId = out.Instances?.[0]?.InstanceId;
        if (!instanceId) throw new Error('RunInstances returned no instance');
        this.log.info('ec2 instance launched', {
          backingNodeId: spec.backingNodeId,
          instanceId,
          offering: describeOffering(offering),
        });
        return { resourceId: instanceId };
      } catch (err) {
        if (err instanceof RetryableError) throw err; // throttled out: the message comes back later
        const kind = classifyEc2Error(err);
        if (kind === 'capacity') {
          capacityMisses++;
          this.rememberCapacity(offering, err);
          outcomes.push(`${describeOffering(offering)}: ${describeEc2Error(err)}`);
          this.log.warn('ec2 offering has no capacity', {
            backingNodeId: spec.backingNodeId,
            offering: describeOffering(offering),
            error: describeEc2Error(err),
          });
          continue;
        }
        if (kind === 'quota') {
          const memo = this.rememberQuota(offering, err);
          outcomes.push(`${describeOffering(offering)}: ${describeEc2Error(err)}`);
          this.log.warn('ec2 quota reached; offerings in its scope are skipped', {
            backingNodeId: spec.backingNodeId,
            offering: describeOffering(offering),
            scope: memo.scope,
            until: new Date(memo.until).toISOString(),
            error: describeEc2Error(err),
          });
          continue;
        }
        throw new Error(
          `RunInstances (${describeOffering(offering)}) for backing node ${spec.backingNodeId} failed: ${describeEc2Error(err)}`,
          { cause: err },
        );
      }
    }
    const where = `label ${spec.label} in backing pool ${spec.poolKey}`;
    // Nothing tried, or only quotas reached: every offering is remembered, so the request waits for one.
    if (tried === 0 || capacityMisses === 0) {
      throw new CapacityError(
        this.labelBlocked(settings) ?? `no offering of ${where} can launch now: ${outcomes.join('; ')}`,
      );
    }
    throw new Error(`no capacity for ${where}: ${outcomes.join('; ')}`);
  }

  async describe(resourceId: string): Promise<BackingResource | undefined> {
    if (!isEc2InstanceId(resourceId)) return undefined;
    const budget: RetryBudget = { used: 0 };
    let instances: Instance[];
    try {
      const out = await this.call('DescribeInstances', budget, () =>
        this.client.send(new DescribeInstancesCommand({ InstanceIds: [resourceId] })),
      );
      instances = (out.Reservations ?? []).flatMap((r) => r.Instances ?? []);
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      if (classifyEc2Error(err) === 'not-found') return undefined;
      throw new Error(`DescribeInstances ${resourceId} failed: ${describeEc2Error(err)}`, { cause: err });
    }
    const instance = instances.find((i) => i.InstanceId === resourceId);
    return instance ? this.toResource(instance) : undefined;
  }

  async list(): Promise<BackingResource[]> {
    const budget: RetryBudget = { used: 0 };
    const filters: Filter[] = [
      { Name: `tag:${TAG_POOL}`, Values: [this.poolId] },
      { Name: 'instance-state-name', Values: [...LISTED_STATES] },
    ];
    // A throttled page restarts the listing: a partial list would make live instances look vanished.
    const instances = await this.call('DescribeInstances', budget, async () => {
      const out: Instance[] = [];
      for await (const page of paginateDescribeInstances(
        { client: this.client, pageSize: this.listPageSize },
        { Filters: filters },
      )) {
        for (const reservation of page.Reservations ?? []) out.push(...(reservation.Instances ?? []));
      }
      return out;
    }).catch((err: unknown) => {
      if (err instanceof RetryableError) throw err;
      throw new Error(`DescribeInstances (list) failed: ${describeEc2Error(err)}`, { cause: err });
    });
    const out: BackingResource[] = [];
    for (const instance of instances) {
      const resource = this.toResource(instance);
      if (resource) out.push(resource);
    }
    return out;
  }

  async terminate(resourceId: string): Promise<void> {
    await this.terminateMany([resourceId]);
  }

  /**
   * Terminates the instances, in batches of TERMINATE_BATCH_SIZE. Idempotent: an instance that is gone
   * (or an id that is not an instance id) counts as terminated.
   */
  async terminateMany(resourceIds: readonly string[]): Promise<void> {
    const ids = [...new Set(resourceIds)].filter(isEc2InstanceId);
    const budget: RetryBudget = { used: 0 };
    for (let start = 0; start < ids.length; start += TERMINATE_BATCH_SIZE) {
      await this.terminateBatch(ids.slice(start, start + TERMINATE_BATCH_SIZE), budget);
    }
  }

  // ---- internals ------------------------------------------------------------------------------------

  private settingsFor(poolKey: string, label: string): AwsLabelSettings {
    const pool = this.settings.get(poolKey);
    if (!pool) throw new Error(`backing pool ${poolKey} is not an aws pool of this provider`);
    const settings = pool.get(label);
    if (!settings) throw new Error(`backing pool ${poolKey} has no label ${label}`);
    return settings;
  }

  private offeringKey(o: Offering): string {
    return `offering\n${o.instanceType}\n${o.subnetId}\n${o.market}`;
  }

  private subnetKey(subnetId: string): string {
    return `subnet\n${subnetId}`;
  }

  private quotaKey(scope: string): string {
    return `quota\n${scope}`;
  }

  /** The unexpired failure remembered for the offering: its own, its subnet's, or a quota covering it. */
  private remembered(o: Offering): Remembered | undefined {
    const now = this.clock.now();
    const keys = [
      this.offeringKey(o),
      this.subnetKey(o.subnetId),
      ...quotaScopesOf(o).map((scope) => this.quotaKey(scope)),
    ];
    for (const key of keys) {
      const memo = this.failures.get(key);
      if (!memo) continue;
      if (memo.until > now) return memo;
      this.failures.delete(key);
    }
    return undefined;
  }

  /** The reason every offering of the label is remembered as failed, or undefined when one is not. */
  private labelBlocked(settings: AwsLabelSettings): string | undefined {
    const offerings = offeringsOf(settings);
    const failures = offerings.map((o) => this.remembered(o));
    if (failures.some((f) => f === undefined)) return undefined;
    const until = Math.min(...failures.map((f) => f?.until ?? 0));
    return `no offering of label ${settings.label} in backing pool ${settings.poolKey} can launch until ${new Date(until).toISOString()}: ${offerings
      .map((o, i) => `${describeOffering(o)}: ${failures[i] ? describeMemo(failures[i]) : ''}`)
      .join('; ')}`;
  }

  private rememberCapacity(o: Offering, err: unknown): void {
    const now = this.clock.now();
    const code = ec2ErrorCode(err);
    const memo: Remembered = {
      kind: 'capacity',
      code,
      message: ec2ErrorMessage(err),
      at: now,
      until: now + OFFERING_BACKOFF_MS,
    };
    this.failures.set(
      SUBNET_WIDE_ERROR_CODES.has(code) ? this.subnetKey(o.subnetId) : this.offeringKey(o),
      memo,
    );
  }

  private rememberQuota(o: Offering, err: unknown): Remembered {
    const now = this.clock.now();
    const code = ec2ErrorCode(err);
    const scope = quotaScope(code, o);
    const memo: Remembered = {
      kind: 'quota',
      code,
      message: ec2ErrorMessage(err),
      scope,
      at: now,
      until: now + QUOTA_PAUSE_MS,
    };
    this.failures.set(this.quotaKey(scope), memo);
    return memo;
  }

  /**
   * What the label's launch template version says about the network (DescribeLaunchTemplateVersions),
   * remembered for good for a numbered version and TEMPLATE_CACHE_MS for $Default/$Latest (they move).
   */
  private async templateNetwork(
    image: Extract<AwsImage, { kind: 'launch-template' }>,
    budget: RetryBudget,
  ): Promise<TemplateNetwork> {
    const version = image.version ?? '$Default';
    const key = `${image.id ?? ''}\n${image.name ?? ''}\n${version}`;
    const now = this.clock.now();
    const known = this.templates.get(key);
    if (known && known.until > now) return known.network;
    const describe = describeTemplate(image);
    let data:
      | {
          NetworkInterfaces?: LaunchTemplateInstanceNetworkInterfaceSpecification[] | undefined;
          SecurityGroupIds?: string[] | undefined;
          SecurityGroups?: string[] | undefined;
        }
      | undefined;
    try {
      const out = await this.call('DescribeLaunchTemplateVersions', budget, () =>
        this.client.send(
          new DescribeLaunchTemplateVersionsCommand({
            ...(image.id !== undefined ? { LaunchTemplateId: image.id } : { LaunchTemplateName: image.name }),
            Versions: [version],
          }),
        ),
      );
      data = out.LaunchTemplateVersions?.[0]?.LaunchTemplateData;
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      throw new Error(
        `DescribeLaunchTemplateVersions (launch template ${describe}) failed: ${describeEc2Error(err)}`,
        {
          cause: err,
        },
      );
    }
    if (!data) throw new Error(`launch template ${describe} does not exist`);
    const network: TemplateNetwork = {
      describe,
      interfaces: data.NetworkInterfaces ?? [],
      instanceGroups: [...(data.SecurityGroupIds ?? []), ...(data.SecurityGroups ?? [])],
    };
    this.templates.set(key, {
      network,
      until: /^\d+$/.test(version) ? Number.POSITIVE_INFINITY : now + TEMPLATE_CACHE_MS,
    });
    return network;
  }

  /**
   * Runs one EC2 request, retrying throttling and transient errors with backoff while the call's budget
   * lasts; then RetryableError. Other errors are thrown as they are.
   */
  private async call<T>(what: string, budget: RetryBudget, request: () => Promise<T>): Promise<T> {
    for (;;) {
      try {
        return await request();
      } catch (err) {
        const kind = classifyEc2Error(err);
        if (kind !== 'throttle' && kind !== 'transient') throw err;
        if (budget.used >= this.backoff.maxRetries) {
          throw new RetryableError(
            `${what} ${kind === 'throttle' ? 'throttled' : 'failed'} after ${budget.used} retries: ${describeEc2Error(err)}`,
            { cause: err },
          );
        }
        const delay = backoffDelay(this.backoff, budget.used, this.random);
        budget.used++;
        this.log.warn('ec2 request retried', { request: what, error: describeEc2Error(err), delayMs: delay });
        await this.sleep(delay);
      }
    }
  }

  /** A pending or running instance already tagged with the backing node id, if any. */
  private async findLive(backingNodeId: string, budget: RetryBudget): Promise<string | undefined> {
    try {
      const out = await this.call('DescribeInstances', budget, () =>
        this.client.send(
          new DescribeInstancesCommand({
            Filters: [
              { Name: `tag:${TAG_POOL}`, Values: [this.poolId] },
              { Name: `tag:${TAG_BACKING_NODE_ID}`, Values: [backingNodeId] },
              { Name: 'instance-state-name', Values: ['pending', 'running'] },
            ],
          }),
        ),
      );
      return (out.Reservations ?? []).flatMap((r) => r.Instances ?? []).find((i) => i.InstanceId)?.InstanceId;
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      throw new Error(`DescribeInstances (backing node ${backingNodeId}) failed: ${describeEc2Error(err)}`, {
        cause: err,
      });
    }
  }

  /** The image's root device name (for the encrypted root volume mapping), looked up once per image. */
  private async rootDevice(imageId: string, budget: RetryBudget): Promise<string> {
    const known = this.rootDevices.get(imageId);
    if (known !== undefined) return known;
    let image: { RootDeviceName?: string | undefined } | undefined;
    try {
      const out = await this.call('DescribeImages', budget, () =>
        this.client.send(new DescribeImagesCommand({ ImageIds: [imageId] })),
      );
      image = out.Images?.find((i) => i.ImageId === imageId) ?? out.Images?.[0];
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      throw new Error(`DescribeImages ${imageId} failed: ${describeEc2Error(err)}`, { cause: err });
    }
    if (!image) throw new Error(`image ${imageId} does not exist (or is not shared with this account)`);
    const device = image.RootDeviceName ?? DEFAULT_ROOT_DEVICE;
    this.rootDevices.set(imageId, device);
    return device;
  }

  /** The parts of the RunInstances request that do not depend on the offering. */
  private async baseRequest(
    spec: LaunchSpec,
    settings: AwsLabelSettings,
    budget: RetryBudget,
  ): Promise<RunInstancesCommandInput> {
    const tags = this.tagsFor(spec, settings);
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
          DeviceName: await this.rootDevice(image.imageId, budget),
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
    if (settings.userdata !== undefined)
      input.UserData = Buffer.from(settings.userdata, 'utf8').toString('base64');
    if (settings.iamInstanceProfile) {
      input.IamInstanceProfile =
        'arn' in settings.iamInstanceProfile
          ? { Arn: settings.iamInstanceProfile.arn }
          : { Name: settings.iamInstanceProfile.name };
    }
    return input;
  }

  /** Our tags, then Name, then the label's own tags (which may set Name but no reserved key). */
  private tagsFor(spec: LaunchSpec, settings: AwsLabelSettings): Tag[] {
    const tags = new Map<string, string>([
      [TAG_POOL, this.poolId],
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
    return toTags(tags);
  }

  private toResource(instance: Instance): BackingResource | undefined {
    const tags = tagMap(instance.Tags);
    const instanceId = instance.InstanceId;
    if (tags[TAG_POOL] !== this.poolId || !instanceId) return undefined;
    const stateName = instance.State?.Name ?? 'pending';
    const state: ResourceState = RESOURCE_STATES.has(stateName) ? (stateName as ResourceState) : 'pending';
    const poolKey = tags[TAG_BACKING_POOL] ?? '';
    const label = tags[TAG_LABEL] ?? '';
    const settings = this.settings.get(poolKey)?.get(label);
    const privateIp = instance.PrivateIpAddress;
    const publicIp = instance.PublicIpAddress;
    const host = settings?.publicIpv4 ? publicIp : privateIp;
    const region =
      settings?.region ?? instance.Placement?.AvailabilityZone?.replace(/[a-z]$/, '') ?? 'unknown';
    return {
      resourceId: instanceId,
      backingNodeId: tags[TAG_BACKING_NODE_ID] ?? '',
      poolKey,
      state,
      ...(host !== undefined && host !== '' ? { host } : {}),
      port: settings?.connectionPort ?? 22,
      ...(instance.LaunchTime ? { launchedAt: new Date(instance.LaunchTime).getTime() } : {}),
      attributes: {
        provider: 'aws',
        region,
        instanceId,
        instanceType: instance.InstanceType,
        availabilityZone: instance.Placement?.AvailabilityZone,
        imageId: instance.ImageId,
        privateIp,
        ...(publicIp !== undefined ? { publicIp } : {}),
        spot: instance.InstanceLifecycle === 'spot',
        label,
      },
    };
  }

  private async terminateBatch(ids: readonly string[], budget: RetryBudget): Promise<void> {
    let remaining = [...ids];
    while (remaining.length > 0) {
      try {
        await this.call('TerminateInstances', budget, () =>
          this.client.send(new TerminateInstancesCommand({ InstanceIds: remaining })),
        );
        this.log.info('ec2 instances terminating', { instanceIds: remaining });
        return;
      } catch (err) {
        if (err instanceof RetryableError) throw err;
        if (classifyEc2Error(err) !== 'not-found') {
          throw new Error(`TerminateInstances failed: ${describeEc2Error(err)}`, { cause: err });
        }
        // The whole call fails when one id is gone; its message names the missing ones.
        if (remaining.length === 1) return;
        const missing = new Set(ec2ErrorMessage(err).match(/i-[0-9a-f]+/g) ?? []);
        const rest = remaining.filter((id) => !missing.has(id));
        if (rest.length === remaining.length) {
          for (const id of remaining) await this.terminateBatch([id], budget);
          return;
        }
        remaining = rest;
      }
    }
  }
}

/** `InsufficientInstanceCapacity` / `MaxSpotInstanceCountExceeded (quota: spot instances)` */
function describeMemo(memo: Remembered): string {
  return memo.kind === 'quota' ? `${memo.code} (quota: ${memo.scope})` : memo.code;
}
