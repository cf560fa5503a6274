import type { Clock } from '../core/clock.ts';
import type { Log } from '../core/log.ts';
import type { ResolvedConfig } from '../core/model.ts';
import type { EventSink, MetricSink, PoolEventType } from '../core/observability.ts';
import type { BackingPort, CapacityPort, PoolStore, ReadinessPort, RequestPort } from '../core/poolStore.ts';
import type { ProviderRegistry } from '../core/provider.ts';
import { CLAIM_TAKEOVER_MS, type Deadline, SLOT_LEASE_MS } from '../core/timing.ts';
import type { HostKeySource } from '../providers/aws/configSchema.ts';

/**
 * What most use cases use of the store: requests, backing nodes, capacity and readiness (all but the
 * reaper's own state): placing, readying and releasing a node touch all four (a request settling counts
 * its arrival; a release gives back a min-ready spare's seat and its place).
 */
export type ServeContext = Context<RequestPort & BackingPort & CapacityPort & ReadinessPort>;

/**
 * Everything a use case depends on, injected by the Lambda entry point or the embedded pool. `S` is what
 * it uses of the store: a use case asks for the ports (core/poolStore.ts) it and what it calls use, so
 * its signature says which aggregates it reads and writes; the handlers pass the whole store.
 */
export interface Context<S = PoolStore> {
  readonly store: S;
  readonly config: ResolvedConfig;
  readonly providers: ProviderRegistry;
  readonly clock: Clock;
  readonly log: Log;
  /** Scans a backing node's SSH host keys (host-key-checking); the real one does an SSH handshake. */
  readonly scanHostKeys?: (host: string, port: number, timeoutMs: number) => Promise<string[]>;
  /**
   * How a backing pool's backing nodes get their own SSH host keys before their nodes are handed out
   * (aws `host-keys`, resolved against the functions' network by awsContext; see HostKeyPlan). Unset, or
   * undefined for a pool: its provider reports them with the resource (local backing nodes) or none do.
   */
  readonly hostKeyPlan?: (backingPoolKey: string, backingLabel: string) => HostKeyPlan | undefined;
  /** Whether a backing node's connection port answers (boot-timeout); the real one opens a TCP connection. */
  readonly probePort?: (host: string, port: number, timeoutMs: number) => Promise<boolean>;
  /** Where pool events are published (EventBridge on AWS, a JSON-lines file locally). */
  readonly events?: EventSink;
  readonly metrics?: MetricSink;
  /**
   * Which backing node a node goes onto among those with a free slot: `fullest` (default: tighter
   * packing lets the others empty and go) or `oldest` (Nodepool's policy; for comparisons such as
   * `npm run cost`). With `oldest` the order holds within each page of candidates the index returns.
   */
  readonly placementPolicy?: 'fullest' | 'oldest';
  /**
   * Whether the pool learns node durations and places a node whose request gave no `expected-duration`
   * by them (shared/usecases/ready/estimates.ts). Unset: the configuration's `learned-durations`; `npm run
   * cost` sets it per policy.
   */
  readonly learnedDurations?: boolean;
  /**
   * The invocation's time (set per invocation by the handlers, from Lambda's remaining time or, in the
   * embedded pool, the delivery deadline): checks and placements end before it. Unset (a use case called
   * directly, the CLI): no bound but the use cases' own (DELIVERY_DEADLINE_MS, boot-timeout).
   */
  readonly deadline?: Deadline;
  /**
   * Every delivery that started before this instant is known dead, whatever its age: the embedded pool
   * sets its own start time, since deliveries run only in its process and the process before it is gone
   * (with its in-memory queue). Its claims and places are then taken over, or given back by the reaper,
   * at once instead of after CLAIM_TAKEOVER_MS / the slot lease. Unset on AWS, where many function
   * instances run at once and only age tells.
   */
  readonly deliveriesDeadBefore?: number;
  /**
   * A request released within this long of its placement teaches the arrival forecast's weeks ahead
   * nothing (shared/usecases/ready/forecasts.ts). Unset: QUICK_RELEASE_MS (30 s); the chaos run, whose jobs last
   * seconds where a CI job's last minutes, sets it in proportion.
   */
  readonly quickReleaseMs?: number;
}

/** How a backing node's host keys are learned (Context.hostKeyPlan). */
export interface HostKeyPlan {
  /**
   * `console`: the provider reports them (EC2's console output); the backing node is ready only once it
   * has, within boot-timeout. `scan`: one SSH scan when it becomes ready. `none`: not learned.
   */
  readonly source: HostKeySource;
  /**
   * Whether the functions have a network path to the backing nodes. Without one, host-key-checking's
   * scan at each allocation is replaced by the keys learned from the console.
   */
  readonly reachable: boolean;
}

/** How long the invocation's work may still go on (see Context.deadline); infinite when unbounded. */
export function timeLeft(ctx: Context<unknown>): number {
  return ctx.deadline ? ctx.deadline.remainingMs() : Number.POSITIVE_INFINITY;
}

/**
 * Publishes a pool event. Only the writer that won a state transition calls this, so an event is
 * published once per transition; a publishing failure is logged and never undoes the transition.
 */
export async function emit(
  ctx: Context<unknown>,
  type: PoolEventType,
  detail: Record<string, unknown>,
): Promise<void> {
  if (!ctx.events) return;
  try {
    await ctx.events.publish(type, detail);
  } catch (err) {
    ctx.log.warn('could not publish a pool event', { type, error: (err as Error).message });
  }
}

/**
 * Whether the delivery behind a claim or a max-servers place, which it took (or started) at `since`, is
 * known dead: another delivery of the same message may take the claim over (see CLAIM_TAKEOVER_MS), or
 * it started before `deadBefore` (Context.deliveriesDeadBefore).
 */
export function deliveryDead(since: number, now: number, deadBefore?: number): boolean {
  return now - since >= CLAIM_TAKEOVER_MS || (deadBefore !== undefined && since < deadBefore);
}

/** Whether a claim or place taken at `since` has gone unconfirmed past the slot lease: the reaper gives it back. */
export function leaseExpired(since: number, now: number): boolean {
  return now - since >= SLOT_LEASE_MS;
}

/** Whether durations are learned and placed by (Context.learnedDurations, else `learned-durations`). */
export function learnsDurations(ctx: Context<unknown>): boolean {
  return ctx.learnedDurations ?? ctx.config.learnedDurations;
}
