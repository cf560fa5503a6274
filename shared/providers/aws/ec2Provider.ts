/**
 * The `aws` driver: backing nodes are EC2 instances. The request it sends is built in
 * runInstancesRequest.ts, the offerings it tries and what it remembers of their failures are in
 * offerings.ts, its retry policy in ec2Calls.ts, what it reads before a launch in ec2Lookups.ts, how it
 * terminates in terminateInstances.ts and reads host keys from the console in consoleOutput.ts.
 *
 * - Launches are idempotent (the ClientToken, runInstancesRequest.ts). When a label has several
 *   offerings, launch() first looks for a live instance already tagged with the backing node id (a
 *   previous delivery may have fallen back to another offering).
 * - When every offering fails, the attempt fails naming every reason; when every one is skipped (or
 *   failed on a quota only), launch() throws CapacityError: the request waits instead of spending the
 *   attempt, and launchBlocked() tells why until one of them may work again.
 * - A label's launch template is read once (ec2Lookups.ts) to know which network parameters apply.
 * - EC2 is eventually consistent: an instance launched a moment ago can be unknown to DescribeInstances
 *   and TerminateInstances (`eventuallyConsistent`); describe() then returns undefined and terminate()
 *   succeeds, and the caller decides how long "not found" means "not yet".
 *
 * State changes are not reported by this provider: on AWS they come from EventBridge's "EC2 Instance
 * State-change Notification" events.
 *
 * IAM: ec2:RunInstances, ec2:CreateTags (for TagSpecifications), ec2:DescribeInstances,
 * ec2:DescribeImages, ec2:TerminateInstances and ec2:GetConsoleOutput (best restricted with
 * `ec2:ResourceTag/metastatic:pool`),
 * ec2:DescribeLaunchTemplateVersions when labels use launch templates, iam:PassRole when labels use an
 * instance profile.
 */
import {
  DescribeInstancesCommand,
  EC2Client,
  type EC2ClientConfig,
  type Filter,
  type Instance,
  paginateDescribeInstances,
  RunInstancesCommand,
} from '@aws-sdk/client-ec2';
import type { Clock } from '../../core/clock.ts';
import { CapacityError, RetryableError } from '../../core/errors.ts';
import type { BackingPool } from '../../core/model.ts';
import type { BackingProvider, BackingResource, LaunchSpec, ReportedHostKeys } from '../../core/provider.ts';
import type { Deadline } from '../../core/timing.ts';
import type { HostKeySource } from './configSchema.ts';
import { readConsoleHostKeys } from './consoleOutput.ts';
import { isEc2InstanceId } from './driver.ts';
import { type CallPolicy, type Ec2ProviderLog, ec2Call, type RetryBudget } from './ec2Calls.ts';
import { type BackoffPolicy, classifyEc2Error, DEFAULT_BACKOFF, describeEc2Error } from './ec2Errors.ts';
import { Ec2Lookups } from './ec2Lookups.ts';
import { LISTED_STATES, resourceOf } from './instances.ts';
import { describeMemo, describeOffering, OfferingMemory, offeringsOf } from './offerings.ts';
import { baseRequest, offeringRequest, TAG_POOL } from './runInstancesRequest.ts';
import { type AwsLabelSettings, awsPoolSettings } from './settings.ts';
import { terminateInstances } from './terminateInstances.ts';

/**
 * Instance ids per DescribeInstances `instance-id` filter in describeMany: a conservative size (the
 * DescribeInstances reference states no maximum for a filter's values; other EC2 APIs cap them at 200).
 */
export const DESCRIBE_BATCH_SIZE = 200;

/** A provider call's retry budget, bounded by the invocation's deadline when it has one. */
function budgetWithin(within: Deadline | undefined): RetryBudget {
  return { used: 0, ...(within ? { deadline: within } : {}) };
}
/** DescribeInstances pages: EC2 accepts MaxResults from 5 to 1000. */
export const LIST_PAGE_SIZE = 1000;
export const MIN_LIST_PAGE_SIZE = 5;

/** An EC2 client for the provider: the SDK's retries are off, the provider's backoff is the policy. */
export function createEc2Client(region: string, config: EC2ClientConfig = {}): EC2Client {
  return new EC2Client({ ...config, region, maxAttempts: 1 });
}

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

const noLog: Ec2ProviderLog = { info() {}, warn() {} };

const defaultSleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

export class Ec2Provider implements BackingProvider {
  /** Right after RunInstances, DescribeInstances and TerminateInstances may not know the instance yet. */
  readonly eventuallyConsistent = true;
  private readonly client: EC2Client;
  private readonly poolId: string;
  private readonly clock: Clock;
  private readonly log: Ec2ProviderLog;
  private readonly policy: CallPolicy;
  private readonly listPageSize: number;
  /** poolKey -> label -> settings. */
  private readonly settings = new Map<string, Map<string, AwsLabelSettings>>();
  private readonly memory: OfferingMemory;
  private readonly lookups: Ec2Lookups;

  constructor(options: Ec2ProviderOptions) {
    this.client = options.client;
    this.poolId = options.poolId;
    this.clock = options.clock;
    this.log = options.log ?? noLog;
    this.policy = {
      backoff: { ...DEFAULT_BACKOFF, ...options.backoff },
      random: options.random ?? Math.random,
      sleep: options.sleep ?? defaultSleep,
      log: this.log,
    };
    this.memory = new OfferingMemory(this.clock);
    this.lookups = new Ec2Lookups(this.client, this.clock, this.policy);
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

  /** The label's `host-keys` as configured (label, else pool); undefined when unset or not this provider's. */
  hostKeysSetting(poolKey: string, label: string): HostKeySource | undefined {
    return this.settings.get(poolKey)?.get(label)?.hostKeys;
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
      return settings ? this.memory.labelBlocked(settings) : undefined;
    }
    const reasons: string[] = [];
    for (const settings of labels.values()) {
      const reason = this.memory.labelBlocked(settings);
      if (reason === undefined) return undefined;
      reasons.push(reason);
    }
    return reasons.length > 0 ? reasons.join(' | ') : undefined;
  }

  async launch(spec: LaunchSpec, within?: Deadline): Promise<{ resourceId: string }> {
    const settings = this.settingsFor(spec.poolKey, spec.label);
    // Every offering failed (capacity or quota) a moment ago: wait, do not spend the attempt.
    const blocked = this.memory.labelBlocked(settings);
    if (blocked !== undefined) throw new CapacityError(blocked);
    // One budget for the whole launch: each offering's RunInstances (and each lookup before them)
    // starts only while the invocation has time left, so the loop stops at its deadline.
    const budget: RetryBudget = { used: 0, ...(within ? { deadline: within } : {}) };
    const offerings = offeringsOf(settings);

    if (offerings.length > 1) {
      // A previous delivery may have launched on another offering than the first one we try now.
      const existing = await this.lookups.findLive(this.poolId, spec.backingNodeId, budget);
      if (existing !== undefined) {
        this.log.info('ec2 instance already launched for backing node', {
          backingNodeId: spec.backingNodeId,
          instanceId: existing,
        });
        return { resourceId: existing };
      }
    }

    const image = settings.image;
    const rootDevice =
      image.kind === 'image' ? await this.lookups.rootDevice(image.imageId, budget) : undefined;
    const template =
      image.kind === 'launch-template' ? await this.lookups.templateNetwork(image, budget) : undefined;
    const base = baseRequest(spec, settings, this.poolId, rootDevice, template?.userData);
    const outcomes: string[] = [];
    let tried = 0;
    let capacityMisses = 0;
    for (const offering of offerings) {
      const remembered = this.memory.remembered(offering);
      if (remembered) {
        const ago = Math.round((this.clock.now() - remembered.at) / 1000);
        outcomes.push(`${describeOffering(offering)}: skipped, ${describeMemo(remembered)} ${ago}s ago`);
        continue;
      }
      tried++;
      const input = offeringRequest(base, settings, spec, offering, this.poolId, template);
      try {
        const out = await ec2Call(this.policy, 'RunInstances', budget, () =>
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
        // Throttled out, or out of the invocation's time: the message comes back later.
        if (err instanceof RetryableError) throw err;
        const kind = classifyEc2Error(err);
        if (kind === 'capacity') {
          capacityMisses++;
          this.memory.rememberCapacity(offering, err);
          outcomes.push(`${describeOffering(offering)}: ${describeEc2Error(err)}`);
          this.log.warn('ec2 offering has no capacity', {
            backingNodeId: spec.backingNodeId,
            offering: describeOffering(offering),
            error: describeEc2Error(err),
          });
          continue;
        }
        if (kind === 'quota') {
          const memo = this.memory.rememberQuota(offering, err);
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
        this.memory.labelBlocked(settings) ??
          `no offering of ${where} can launch now: ${outcomes.join('; ')}`,
      );
    }
    throw new Error(`no capacity for ${where}: ${outcomes.join('; ')}`);
  }

  async describe(resourceId: string, within?: Deadline): Promise<BackingResource | undefined> {
    if (!isEc2InstanceId(resourceId)) return undefined;
    const budget = budgetWithin(within);
    let instances: Instance[];
    try {
      const out = await ec2Call(this.policy, 'DescribeInstances', budget, () =>
        this.client.send(new DescribeInstancesCommand({ InstanceIds: [resourceId] })),
      );
      instances = (out.Reservations ?? []).flatMap((r) => r.Instances ?? []);
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      if (classifyEc2Error(err) === 'not-found') return undefined;
      throw new Error(`DescribeInstances ${resourceId} failed: ${describeEc2Error(err)}`, { cause: err });
    }
    const instance = instances.find((i) => i.InstanceId === resourceId);
    return instance ? resourceOf(instance, this.poolId, this.settings) : undefined;
  }

  /**
   * Our instances among `resourceIds`, by id, in one DescribeInstances per DESCRIBE_BATCH_SIZE ids. An
   * `instance-id` filter rather than InstanceIds: EC2 fails the whole call when one id is unknown, while
   * a filter leaves it out (so an id missing from the answer is "not found", as for describe()).
   */
  async describeMany(
    resourceIds: readonly string[],
    within?: Deadline,
  ): Promise<Map<string, BackingResource>> {
    const ids = [...new Set(resourceIds)].filter(isEc2InstanceId);
    const budget = budgetWithin(within);
    const found = new Map<string, BackingResource>();
    for (let start = 0; start < ids.length; start += DESCRIBE_BATCH_SIZE) {
      const filters: Filter[] = [
        { Name: 'instance-id', Values: ids.slice(start, start + DESCRIBE_BATCH_SIZE) },
      ];
      for (const instance of await this.describeAll(filters, budget, 'DescribeInstances (by id)')) {
        const resource = resourceOf(instance, this.poolId, this.settings);
        if (resource) found.set(resource.resourceId, resource);
      }
    }
    return found;
  }

  async list(within?: Deadline): Promise<BackingResource[]> {
    const budget = budgetWithin(within);
    const filters: Filter[] = [
      { Name: `tag:${TAG_POOL}`, Values: [this.poolId] },
      { Name: 'instance-state-name', Values: [...LISTED_STATES] },
    ];
    const instances = await this.describeAll(filters, budget, 'DescribeInstances (list)');
    const out: BackingResource[] = [];
    for (const instance of instances) {
      const resource = resourceOf(instance, this.poolId, this.settings);
      if (resource) out.push(resource);
    }
    return out;
  }

  /**
   * The SSH host keys cloud-init printed to the instance's serial console (consoleHostKeys.ts), read
   * with GetConsoleOutput. `Latest: true` reads the console as it is now, which Nitro instances support;
   * others refuse it, and only that refusal is asked again without it (the output EC2 buffered at the
   * last state change, which can be minutes late; consoleOutput.ts). An instance EC2 does not know (yet) has no keys yet: the caller's
   * boot-timeout bounds the wait.
   */
  async reportedHostKeys(resourceId: string, within?: Deadline): Promise<ReportedHostKeys> {
    if (!isEc2InstanceId(resourceId))
      return { kind: 'invalid', reason: `${resourceId} is not an instance id` };
    return readConsoleHostKeys(this.client, this.policy, resourceId, budgetWithin(within));
  }

  async terminate(resourceId: string, within?: Deadline): Promise<void> {
    await this.terminateMany([resourceId], within);
  }

  /**
   * Terminates the instances, in batches of TERMINATE_BATCH_SIZE (terminateInstances.ts). Idempotent: an instance that is gone
   * (or an id that is not an instance id) counts as terminated.
   */
  async terminateMany(resourceIds: readonly string[], within?: Deadline): Promise<void> {
    const ids = [...new Set(resourceIds)].filter(isEc2InstanceId);
    await terminateInstances(this.client, this.policy, ids, budgetWithin(within));
  }

  // ---- internals ------------------------------------------------------------------------------------

  /**
   * Every instance DescribeInstances returns for `filters`, all pages. A throttled page restarts the
   * listing: a partial list would make live instances look vanished.
   */
  private async describeAll(filters: Filter[], budget: RetryBudget, what: string): Promise<Instance[]> {
    return ec2Call(this.policy, 'DescribeInstances', budget, async () => {
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
      throw new Error(`${what} failed: ${describeEc2Error(err)}`, { cause: err });
    });
  }

  private settingsFor(poolKey: string, label: string): AwsLabelSettings {
    const pool = this.settings.get(poolKey);
    if (!pool) throw new Error(`backing pool ${poolKey} is not an aws pool of this provider`);
    const settings = pool.get(label);
    if (!settings) throw new Error(`backing pool ${poolKey} has no label ${label}`);
    return settings;
  }
}
