import type { Shape } from './model.ts';
import type { Deadline } from './timing.ts';

/**
 * The port through which the core launches and stops backing nodes. One adapter per driver: `local`
 * (child processes, for the embedded pool) and `aws` (EC2). Adapters report state changes as
 * EC2-shaped events (core/stateChanges.ts), so the fulfil flow is the same everywhere.
 *
 * Every call takes the invocation's deadline (`within`, Context.deadline) where one applies: an adapter
 * whose calls can take long (EC2's requests, its retries with backoff, a launch trying offering after
 * offering) starts no request and sleeps no backoff past it, and throws DeadlineError instead (a
 * RetryableError: the work is left to the next delivery or reaper run). Unset: no bound but its own.
 */

export interface LaunchSpec {
  /** The backing node's id in the table; the provider tags the resource with it. */
  readonly backingNodeId: string;
  /** 1-based attempt number; (backingNodeId, attempt) makes the idempotency token. */
  readonly attempt: number;
  /** The backing pool (`<provider>/<pool>`) and the backing label to launch. */
  readonly poolKey: string;
  readonly label: string;
  /**
   * Slots the backing node is divided into (its max-parallel-jobs): an aws label with per-slot-users
   * creates one user per slot at launch. Unset: 1.
   */
  readonly slots?: number;
  /**
   * What one slot gives (its metastatic label's cores, memory, disk): a local backing node holds each
   * slot's jobs to it where it contains them (shared/providers/local/slotIsolation.ts).
   */
  readonly slot?: Shape;
}

export type ResourceState = 'pending' | 'running' | 'shutting-down' | 'terminated' | 'stopping' | 'stopped';

export interface BackingResource {
  /** Provider's id (EC2 instance id; `local-...` for local processes). */
  readonly resourceId: string;
  readonly backingNodeId: string;
  readonly poolKey: string;
  readonly state: ResourceState;
  /** Connection details, once known. */
  readonly host?: string;
  readonly port?: number;
  /** When the resource was created (epoch ms), if the provider knows; orphans get a grace from it. */
  readonly launchedAt?: number;
  /** Attributes the provider reports for the machine (region, image, instance type...). */
  readonly attributes: Readonly<Record<string, unknown>>;
}

/**
 * A backing node's SSH host keys as the provider reads them without a network path to the machine (on
 * EC2: the block cloud-init prints to the serial console): `none` until they are there, `invalid` with
 * the reason when what is there cannot be trusted.
 */
export type ReportedHostKeys =
  | { readonly kind: 'none' }
  /** As `<type> <base64>` (the known_hosts form). */
  | { readonly kind: 'keys'; readonly keys: readonly string[] }
  | { readonly kind: 'invalid'; readonly reason: string };

export interface BackingProvider {
  /** Starts a backing node. Idempotent: the same (backingNodeId, attempt) never starts a second resource. */
  launch(spec: LaunchSpec, within?: Deadline): Promise<{ resourceId: string }>;
  /**
   * The resource as the provider sees it now, or undefined when it does not exist (any more), or, for an
   * eventually consistent provider, not yet (see `eventuallyConsistent`).
   */
  describe(resourceId: string, within?: Deadline): Promise<BackingResource | undefined>;
  /**
   * Several resources at once (the reaper confirms a batch it terminated): the ones found, by id; an id
   * left out is not found (see `describe`). Optional: without it, `describe` is asked for each.
   */
  describeMany?(resourceIds: readonly string[], within?: Deadline): Promise<Map<string, BackingResource>>;
  /**
   * True when a resource created a moment ago can still be unknown to `describe`, `list` and `terminate`
   * (EC2's eventual consistency). The reaper then takes "not found" for "gone" only once the resource id
   * has been recorded for RESOURCE_NOT_FOUND_GRACE_MS (core/timing.ts) and a second describe agrees.
   * Unset: "not found" is final.
   */
  readonly eventuallyConsistent?: boolean;
  /**
   * Stops and deletes the resource. Idempotent: terminating a gone resource succeeds (so, with
   * `eventuallyConsistent`, a young resource "not found" may not have been terminated: describe after).
   */
  terminate(resourceId: string, within?: Deadline): Promise<void>;
  /**
   * Terminates several resources, in as few calls as the provider allows (EC2: 1,000 ids a call), with
   * `terminate`'s idempotency. Optional: without it, `terminate` is asked for each.
   */
  terminateMany?(resourceIds: readonly string[], within?: Deadline): Promise<void>;
  /** Every resource carrying this pool's tag (for reconciliation). */
  list(within?: Deadline): Promise<BackingResource[]>;
  /**
   * Why launching in a backing pool is paused right now (a quota error a moment ago), or undefined.
   * Requests then wait instead of spending launch attempts.
   */
  launchBlocked?(poolKey: string, label?: string): string | undefined;
  /**
   * Why a resource that ended on its own ended, when the provider knows (a local backing process that
   * exited before it was ready: its exit code and last error line), for the backing node's failure
   * reason. Undefined when unknown (EC2's state-change events carry no reason).
   */
  endReason?(resourceId: string): string | undefined;
  /**
   * The resource's SSH host keys as the provider itself reports them (EC2: its console output), for
   * labels that take their keys that way (aws `host-keys: console`). Throws RetryableError when the
   * provider could not be asked now; `none` while the machine has not printed them yet.
   */
  reportedHostKeys?(resourceId: string, within?: Deadline): Promise<ReportedHostKeys>;
}

/** Finds the provider adapter for a backing pool, or for a resource named in a state event. */
export interface ProviderRegistry {
  forPool(poolKey: string): BackingProvider;
  /** The provider that owns this resource id (from an event), or undefined when none does. */
  forResource(resourceId: string): BackingProvider | undefined;
}
