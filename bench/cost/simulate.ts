/**
 * The cost simulator: replays a trace through the REAL request, fulfil, release and reaper use cases
 * (shared/usecases) over a DynamoStore on dynalite, with a ManualClock as the virtual clock and the
 * in-process SimProvider as the backing provider. Nothing sleeps: events (arrivals, boots, job ends,
 * reaper runs) are taken from a priority queue in time order and the clock is set to each in turn.
 *
 * Also computes, from the trace alone, the two reference figures: one instance per job and the lower
 * bound (at each instant, per label, ceil(nodes in use / slots) backing nodes).
 */
import { DeleteTableCommand } from '@aws-sdk/client-dynamodb';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { CapacityError } from '../../shared/core/errors.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { PoolStore } from '../../shared/core/poolStore.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { writeArrivals } from '../../shared/usecases/ready/forecasts.ts';
import { resourceRunning } from '../../shared/usecases/ready/fulfil.ts';
import type { SparesSeen } from '../../shared/usecases/ready/minReady.ts';
import { keepMinReady, labelsTaken } from '../../shared/usecases/ready/replenish.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { poolConfig } from '../../testkit/configs.ts';
import type { InProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { mulberry32 } from './prng.ts';
import { EventQueue } from './queue.ts';
import { SimProvider, simRegistry } from './simProvider.ts';
import type { Job, Trace } from './traces.ts';

export type PlacementPolicy = 'fullest' | 'oldest';

export interface SimOptions {
  readonly policy: PlacementPolicy;
  /** max-parallel-jobs: slots per backing node. */
  readonly slots: number;
  readonly graceS: number;
  readonly minRetentionS: number;
  /** Launch to running, seconds. */
  readonly bootS: number;
  /**
   * The reaper runs on a grid of this many seconds (0: exactly when something is due). In `due` mode
   * only the grid instants where an idle backing node can have become due are simulated (after the
   * release that empties a backing node: release + grace-time; after a run: its nextCheckAt). That
   * retires every backing node at the same instant as a reaper running on every tick would; `periodic`
   * runs every tick (many more DynamoDB calls; the test checks that both agree).
   */
  readonly reaperTickS: number;
  readonly reaperMode: 'due' | 'periodic';
  /** The metastatic pool's max-servers (unset: unlimited). A full pool makes requests retry. */
  readonly maxServers?: number;
  /** A request that found no capacity (CapacityError) is retried this many seconds later. */
  readonly retryS: number;
  /**
   * What each request tells of its job's duration (`expected-duration`): nothing (default), the exact
   * duration, or the duration times a factor drawn per job, log-uniform in [0.5, 2] (a rough estimate).
   */
  readonly hints?: 'exact' | 'noisy';
  /**
   * Requests without a hint are placed by the duration the pool learned for their label and requestor
   * (Context.learnedDurations). Off in every other run, so fullest first is today's order without it.
   */
  readonly learned?: boolean;
  /**
   * Ready room held ahead of requests (issue 27): a static `min-ready`, or `min-ready: auto` at a
   * ready-target share with a max-ready cap. Unset: none (today's policy). With either, the reaper also
   * runs every `readinessTickS` (the deployed reaper's default rate, a minute) to refill and decide, a
   * request that took a ready node refills its label's seats at once (as the request function does),
   * and the run ends when the last job ends: the backing nodes still billed then (held by ready nodes,
   * which would be kept for the next requests) stop being billed there.
   */
  readonly readiness?:
    | { readonly kind: 'static'; readonly minReady: number }
    | { readonly kind: 'auto'; readonly share: number; readonly maxReady: number };
  readonly readinessTickS?: number;
  /**
   * Lambda's shape (issue 40): the request function runs in this many containers, each with its own
   * module state (its own DynamoStore on the shared client: caches, buffers, remembered candidates and
   * forecasts are kept per store), the fulfil function in one of its own and the reaper in another.
   * Unset: one process runs every handler on one store (the embedded pool; the engine floor). See
   * `Containers`.
   */
  readonly requestContainers?: number;
}

/**
 * A container idle this long is retired with its module state (what it buffered is lost), and the next
 * invocation starts a fresh one. Lambda keeps an idle container for minutes, not a documented time.
 */
export const CONTAINER_IDLE_MS = 10 * 60_000;

/** The deployed reaper's default rate (lib/metastaticPool.ts reaperRate): the readiness runs' tick. */
export const READINESS_TICK_S = 60;

/**
 * The `expected-duration` a job's request carries (seconds): the same for every try of that job. Noisy
 * hints are the duration times 2^u, u uniform in [-1, 1), drawn from the job's index.
 */
export function hintOf(job: Job, hints: SimOptions['hints']): number | undefined {
  if (hints === undefined) return undefined;
  const seconds = job.durationMs / 1000;
  if (hints === 'exact') return seconds;
  const u = mulberry32(0x9e3779b9 ^ job.index)() * 2 - 1;
  return Math.min(7 * 24 * 3600, seconds * 2 ** u);
}

export const DEFAULT_OPTIONS: SimOptions = {
  policy: 'fullest',
  slots: 4,
  graceS: 0,
  minRetentionS: 0,
  bootS: 60,
  reaperTickS: 10,
  reaperMode: 'due',
  retryS: 5,
};

/** A step function: value v[i] holds from t[i] (seconds since the trace start) to t[i + 1]. */
export interface Series {
  readonly t: number[];
  readonly v: number[];
}

export interface WaitStats {
  readonly mean: number;
  readonly p95: number;
  readonly max: number;
}

export interface PolicyResult {
  readonly instanceSeconds: number;
  readonly backingLaunched: number;
  /** Seconds from arrival to the job's node being ready. */
  readonly waitS: WaitStats;
  /** Requests served at once by a ready backing node (no wait). */
  readonly warmHits: number;
  readonly capacityRetries: number;
  readonly dynamodbCalls: number;
  /**
   * Placements whose first page of free candidates came back full (>= 10 backing nodes with a free
   * slot): with `oldest`, the order then holds only among those 10 (see Context.placementPolicy).
   */
  readonly fullCandidatePages: number;
  /** Requests whose node was a ready node the pool held for them (min-ready), of warmHits. */
  readonly spareHits?: number;
  readonly wallMs: number;
  /**
   * Where the cost above the lower bound goes. idleSeconds: backing nodes billed while empty (grace,
   * min-retention, the reaper's grid). heldBoundSeconds: the lower bound computed on the slots as the
   * simulation held them (arrival to release, waits included), so heldBound - lowerBound is what
   * waiting for boots costs, and cost - heldBound - idle is fragmentation: partly filled backing nodes
   * that a packer able to move running nodes would have merged.
   */
  readonly gap: { readonly idleSeconds: number; readonly heldBoundSeconds: number };
  /** Billed backing nodes over time (absent when not asked for). */
  readonly backing?: Series;
  /** Nodes whose job is running, over time. */
  readonly inUse?: Series;
}

export interface BoundResult {
  readonly instanceSeconds: number;
  readonly series: Series;
}

/**
 * The real store, wrapped to count free-index pages that came back full (see PolicyResult): every other
 * call goes to the store untouched.
 */
function countingFullPages(store: PoolStore): { store: PoolStore; fullPages: () => number } {
  let full = 0;
  const findCandidates: PoolStore['findCandidates'] = async (...args) => {
    const out = await store.findCandidates(...args);
    if (out.cursor) full++;
    return out;
  };
  const wrapped = new Proxy(store, {
    get: (target, prop) => (prop === 'findCandidates' ? findCandidates : Reflect.get(target, prop, target)),
  });
  return { store: wrapped, fullPages: () => full };
}

/** The pool's configuration: one metastatic label per trace label, all on one backing label. */
export function configYaml(labels: readonly string[], o: SimOptions): string {
  const ready = o.readiness;
  return poolConfig({
    labels:
      ready === undefined
        ? undefined
        : [
            { name: 'large' },
            ...labels.map((name) =>
              ready.kind === 'static'
                ? { name, 'min-ready': ready.minReady }
                : { name, 'min-ready': 'auto', 'ready-target': ready.share, 'max-ready': ready.maxReady },
            ),
          ],
    backing: { name: 'sim', labels: [{ name: 'large' }] },
    meta: {
      pool: { 'max-servers': o.maxServers },
      labels: labels.map((name) => ({
        name,
        'backing-label': 'large',
        'max-parallel-jobs': o.slots,
        'grace-time': o.graceS,
        'min-retention-time': o.minRetentionS,
      })),
    },
  });
}

export const POOL_KEY = 'meta/main';

type SimEvent =
  | { readonly kind: 'boot'; readonly resourceId: string }
  | { readonly kind: 'end'; readonly job: Job }
  | { readonly kind: 'arrival'; readonly job: Job }
  | { readonly kind: 'reap' };

/** At the same instant: boots, then job ends, then arrivals, then the reaper. */
export const EVENT_RANK = { boot: 0, end: 1, arrival: 2, reap: 3 } as const;

export const requestIdOf = (j: Job) => `job-${j.index}`;

let tableSeq = 0;

/** Runs the trace through the real use cases with the given pool settings. */
export async function simulate(
  engine: InProcessDynalite,
  trace: Trace,
  options: SimOptions,
  opts: { series?: boolean } = {},
): Promise<PolicyResult> {
  const wallStart = performance.now();
  const callsStart = engine.calls();
  const tableName = `cost-${process.pid}-${++tableSeq}`;
  await ensureTable(engine.client, tableName);
  try {
    const result = await run(engine, tableName, trace, options, opts.series ?? true);
    return { ...result, dynamodbCalls: engine.calls() - callsStart, wallMs: performance.now() - wallStart };
  } finally {
    await engine.client.send(new DeleteTableCommand({ TableName: tableName })).catch(() => undefined);
  }
}

async function run(
  engine: InProcessDynalite,
  tableName: string,
  trace: Trace,
  o: SimOptions,
  withSeries: boolean,
): Promise<Omit<PolicyResult, 'dynamodbCalls' | 'wallMs'>> {
  const labels = [...new Set(trace.jobs.map((j) => j.label))].sort();
  const config = parseConfigOrThrow(configYaml(labels, o), 'cost-sim.yaml');
  const clock = new ManualClock();
  const epoch = clock.now();
  const queue = new EventQueue<SimEvent>((e) => EVENT_RANK[e.kind]);
  const provider = new SimProvider({
    clock,
    bootMs: o.bootS * 1000,
    schedule: (at, resourceId) => queue.push(at - epoch, { kind: 'boot', resourceId }),
  });
  const providers = simRegistry(
    provider,
    config.backingPools.map((p) => p.key),
  );
  const fullPages: (() => number)[] = [];
  /** A process's context: its own store, so its own module state (caches and buffers keyed by store). */
  const newContext = (): Context => {
    const observed = countingFullPages(new DynamoStore(engine.client, tableName));
    fullPages.push(observed.fullPages);
    return {
      store: observed.store,
      config,
      providers,
      clock,
      log: silentLog,
      placementPolicy: o.policy,
      learnedDurations: o.learned === true,
    };
  };
  const containers = new Containers(newContext, clock, o.requestContainers);

  const tickMs = o.reaperTickS * 1000;
  const onGrid = (t: number) => (tickMs > 0 ? Math.ceil(t / tickMs) * tickMs : t);
  const reapsAt = new Set<number>();
  const scheduleReap = (t: number) => {
    const at = onGrid(t);
    if (reapsAt.has(at)) return;
    reapsAt.add(at);
    queue.push(at, { kind: 'reap' });
  };

  /** The backing node each placed job's node is on. */
  const placedOn = new Map<number, string>();
  /** Jobs whose node waits for its backing node to boot, by backing node id. */
  const waiting = new Map<string, Job[]>();
  /** Slots held per backing node, and since when an empty one is empty (for the idle time). */
  const held = new Map<string, number>();
  const emptySince = new Map<string, number>();
  let idleMs = 0;
  const waits: number[] = [];
  const inUseDeltas: [number, number][] = [];
  const heldDeltas: LabelDelta[] = [];
  let warmHits = 0;
  let spareHits = 0;
  let capacityRetries = 0;
  let ended = 0;

  const start = (job: Job, now: number) => {
    waits.push((now - job.arrivalMs) / 1000);
    inUseDeltas.push([now, 1]);
    queue.push(now + job.durationMs, { kind: 'end', job });
  };

  for (const job of trace.jobs) queue.push(job.arrivalMs, { kind: 'arrival', job });
  if (o.reaperMode === 'periodic') scheduleReap(0);
  // Ready room: the reaper also runs on the deployed rate, from the first arrival, to refill and decide.
  const readinessMs = (o.readinessTickS ?? READINESS_TICK_S) * 1000;
  const readinessTicks = new Set<number>();
  const readinessTick = (t: number) => {
    const at = Math.ceil(t / readinessMs) * readinessMs;
    if (readinessTicks.has(at)) return;
    readinessTicks.add(at);
    scheduleReap(at);
  };
  if (o.readiness) readinessTick(trace.jobs[0]?.arrivalMs ?? 0);

  for (let q = queue.pop(); q; q = queue.pop()) {
    const now = q.at;
    clock.set(epoch + now);
    const e = q.event;
    if (e.kind === 'arrival') {
      const job = e.job;
      let placed: RequestRecord;
      let seen: SparesSeen | undefined;
      // One invocation of the request function: the request, the refill of what it took, the end.
      const ctx = containers.request();
      try {
        const hint = hintOf(job, o.hints);
        const out = await requestNodes(ctx, {
          kind: 'request',
          id: requestIdOf(job),
          labels: [job.label],
          ...(job.requestor === undefined ? {} : { requestor: job.requestor }),
          ...(hint === undefined ? {} : { 'expected-duration': hint }),
        });
        if (out.kind !== 'placed') {
          throw new Error(
            `job ${job.index}: request ${out.kind} (${out.request.reason ?? out.request.state})`,
          );
        }
        placed = out.request;
        seen = out.spares;
      } catch (err) {
        if (!(err instanceof CapacityError)) throw err;
        capacityRetries++;
        queue.push(now + o.retryS * 1000, { kind: 'arrival', job });
        continue;
      }
      const node = placed.nodes[0];
      const backingId = node?.backingNodeId;
      if (!node || !backingId) throw new Error(`job ${job.index}: placed without a backing node`);
      placedOn.set(job.index, backingId);
      heldDeltas.push({ t: now, label: job.label, d: 1 });
      held.set(backingId, (held.get(backingId) ?? 0) + 1);
      const idleFrom = emptySince.get(backingId);
      if (idleFrom !== undefined) {
        idleMs += now - idleFrom;
        emptySince.delete(backingId);
      }
      if (placed.state === 'fulfilled') {
        warmHits++;
        if (node.spare !== undefined) spareHits++;
        start(job, now);
        // The request function refills the seats of the labels whose ready nodes it took, at once,
        // starting from what the take read and wrote (requestHandler.ts replenishTaken).
        for (const label of labelsTaken(placed)) {
          const kept = await keepMinReady(ctx, label, seen ? { taken: { seen, taker: placed } } : {});
          if (kept.errors.length > 0) throw new Error(`min-ready refill: ${kept.errors.join('; ')}`);
        }
      } else if (node.state === 'pending') {
        waiting.set(backingId, [...(waiting.get(backingId) ?? []), job]);
      } else {
        throw new Error(`job ${job.index}: request ${placed.state}, node ${node.state}`);
      }
      // The end of the invocation (the request handler's): the arrivals it counted go to the table.
      await writeArrivals(ctx);
    } else if (e.kind === 'boot') {
      // The provider's `running` event, handled as the fulfil flow would.
      const resource = provider.boot(e.resourceId);
      if (!resource) continue;
      const out = await resourceRunning(containers.fulfil(), resource);
      if (out.kind !== 'ready') throw new Error(`boot of ${e.resourceId}: ${JSON.stringify(out)}`);
      const jobs = waiting.get(out.backingNodeId) ?? [];
      waiting.delete(out.backingNodeId);
      // Ready nodes the pool made for itself (min-ready) are made ready with the jobs' nodes.
      if (o.readiness ? out.nodesReady < jobs.length : out.nodesReady !== jobs.length) {
        throw new Error(
          `backing node ${out.backingNodeId} made ${out.nodesReady} node(s) ready; ${jobs.length} waited on it`,
        );
      }
      for (const job of jobs) start(job, now);
    } else if (e.kind === 'end') {
      const ctx = containers.request();
      const out = await releaseNode(ctx, `${requestIdOf(e.job)}/0`);
      if (out.kind !== 'released') throw new Error(`job ${e.job.index}: release ${out.kind}`);
      await writeArrivals(ctx);
      inUseDeltas.push([now, -1]);
      heldDeltas.push({ t: now, label: e.job.label, d: -1 });
      ended++;
      if (o.readiness && ended === trace.jobs.length) {
        // The last job ended: what ready room still holds is not billed beyond the trace.
        for (const r of await provider.list()) await provider.terminate(r.resourceId);
        break;
      }
      const backingId = placedOn.get(e.job.index) as string;
      const left = (held.get(backingId) ?? 0) - 1;
      held.set(backingId, left);
      if (left === 0) {
        emptySince.set(backingId, now);
        // Only an empty backing node can retire: its grace-time ends then.
        if (o.reaperMode === 'due') scheduleReap(now + o.graceS * 1000);
      }
    } else {
      reapsAt.delete(now);
      const report = await reap(containers.reaper());
      if (report.errors.length > 0) throw new Error(`reaper: ${report.errors.join('; ')}`);
      if (o.reaperMode === 'due') {
        if (report.nextCheckAt !== undefined) scheduleReap(report.nextCheckAt - epoch);
      } else if (ended < trace.jobs.length || (await provider.list()).length > 0) {
        scheduleReap(now + Math.max(tickMs, 1000));
      }
      if (o.readiness && readinessTicks.delete(now)) readinessTick(now + readinessMs);
    }
  }

  const resources = provider.all();
  const live = resources.filter((r) => r.terminatedAt === undefined);
  if (live.length > 0 || ended !== trace.jobs.length || waiting.size > 0) {
    throw new Error(
      `simulation ended with ${live.length} live backing node(s), ${trace.jobs.length - ended} job(s) unfinished`,
    );
  }
  const backingDeltas: [number, number][] = [];
  let instanceMs = 0;
  for (const r of resources) {
    const end = (r.terminatedAt as number) - epoch;
    instanceMs += end - (r.launchedAt - epoch);
    backingDeltas.push([r.launchedAt - epoch, 1], [end, -1]);
    const idleFrom = emptySince.get(r.backingNodeId);
    if (idleFrom !== undefined) idleMs += end - idleFrom;
  }
  return {
    instanceSeconds: instanceMs / 1000,
    backingLaunched: resources.length,
    waitS: waitStats(waits),
    warmHits,
    capacityRetries,
    fullCandidatePages: fullPages.reduce((n, f) => n + f(), 0),
    ...(o.readiness ? { spareHits } : {}),
    gap: { idleSeconds: idleMs / 1000, heldBoundSeconds: packedBound(heldDeltas, o.slots).instanceSeconds },
    ...(withSeries ? { backing: stepSeries(backingDeltas), inUse: stepSeries(inUseDeltas) } : {}),
  };
}

/**
 * Which process handles an invocation. One process (no `requestContainers`): every handler on one
 * context, as the embedded pool runs them. Otherwise Lambda's shape: `requestContainers` request
 * containers taking the request function's invocations in turn (Lambda reuses warm containers without
 * saying which; in turn spreads a burst over all of them, where buffers kept per container matter most),
 * one fulfil container and one reaper container; each container is retired after CONTAINER_IDLE_MS
 * without an invocation, with its module state, and the next invocation starts a fresh one.
 */
class Containers {
  private readonly requests: { ctx: Context; lastAt: number }[] = [];
  private readonly others = new Map<'fulfil' | 'reaper', { ctx: Context; lastAt: number }>();
  private next = 0;
  private readonly one: Context | undefined;

  constructor(
    private readonly make: () => Context,
    private readonly clock: ManualClock,
    count: number | undefined,
  ) {
    if (count === undefined) this.one = make();
    else {
      if (!Number.isInteger(count) || count < 1) throw new Error(`requestContainers must be >= 1: ${count}`);
      for (let i = 0; i < count; i++) this.requests.push({ ctx: make(), lastAt: clock.now() });
    }
  }

  request(): Context {
    if (this.one) return this.one;
    const i = this.next;
    this.next = (this.next + 1) % this.requests.length;
    return this.warm(this.requests[i] as { ctx: Context; lastAt: number });
  }

  fulfil(): Context {
    return this.other('fulfil');
  }

  reaper(): Context {
    return this.other('reaper');
  }

  private other(kind: 'fulfil' | 'reaper'): Context {
    if (this.one) return this.one;
    let c = this.others.get(kind);
    if (!c) {
      c = { ctx: this.make(), lastAt: this.clock.now() };
      this.others.set(kind, c);
    }
    return this.warm(c);
  }

  /** The container, replaced by a fresh one if it was idle long enough to be retired. */
  private warm(c: { ctx: Context; lastAt: number }): Context {
    const now = this.clock.now();
    if (now - c.lastAt >= CONTAINER_IDLE_MS) c.ctx = this.make();
    c.lastAt = now;
    return c.ctx;
  }
}

// ---- the reference figures ------------------------------------------------------------------------

/**
 * One instance per job (GitHub runners on AWS): each job launches its own instance, waits the boot,
 * runs, and the instance is terminated when the job ends. Billed: boot + duration, per job.
 */
export function perJob(trace: Trace, bootS: number): PolicyResult {
  const bootMs = bootS * 1000;
  const backing: [number, number][] = [];
  const inUse: [number, number][] = [];
  let ms = 0;
  for (const j of trace.jobs) {
    ms += bootMs + j.durationMs;
    backing.push([j.arrivalMs, 1], [j.arrivalMs + bootMs + j.durationMs, -1]);
    inUse.push([j.arrivalMs + bootMs, 1], [j.arrivalMs + bootMs + j.durationMs, -1]);
  }
  return {
    instanceSeconds: ms / 1000,
    backingLaunched: trace.jobs.length,
    waitS: waitStats(trace.jobs.map(() => bootS)),
    warmHits: 0,
    capacityRetries: 0,
    dynamodbCalls: 0,
    fullCandidatePages: 0,
    wallMs: 0,
    gap: { idleSeconds: 0, heldBoundSeconds: 0 },
    backing: stepSeries(backing),
    inUse: stepSeries(inUse),
  };
}

/**
 * The lower bound: at each instant, per label, ceil(nodes in use / slots) backing nodes, each job in
 * use from its arrival for its duration (no wait, no boot). Every simulated policy holds a slot on a
 * billed backing node over at least that interval (the slot is claimed at arrival and freed at the
 * job's end, arrival + wait + duration), so none can cost less, instant by instant, unless
 * max-servers delays placements.
 */
export function lowerBound(trace: Trace, slots: number): BoundResult {
  const deltas: LabelDelta[] = [];
  for (const j of trace.jobs) {
    deltas.push(
      { t: j.arrivalMs, label: j.label, d: 1 },
      { t: j.arrivalMs + j.durationMs, label: j.label, d: -1 },
    );
  }
  return packedBound(deltas, slots);
}

interface LabelDelta {
  readonly t: number;
  readonly label: string;
  readonly d: number;
}

/** Sum over labels of ceil(nodes / slots), as nodes come and go: its integral and its series. */
function packedBound(deltas: readonly LabelDelta[], slots: number): BoundResult {
  const events = [...deltas].sort((a, b) => a.t - b.t || a.d - b.d);
  const perLabel = new Map<string, number>();
  let machines = 0;
  let ms = 0;
  let last = events[0]?.t ?? 0;
  const changes: [number, number][] = [];
  for (const e of events) {
    ms += machines * (e.t - last);
    last = e.t;
    const before = perLabel.get(e.label) ?? 0;
    const after = before + e.d;
    perLabel.set(e.label, after);
    const change = Math.ceil(after / slots) - Math.ceil(before / slots);
    machines += change;
    if (change !== 0) changes.push([e.t, change]);
  }
  return { instanceSeconds: ms / 1000, series: stepSeries(changes) };
}

// ---- helpers --------------------------------------------------------------------------------------

export function waitStats(waits: readonly number[]): WaitStats {
  if (waits.length === 0) return { mean: 0, p95: 0, max: 0 };
  const sorted = [...waits].sort((a, b) => a - b);
  const mean = sorted.reduce((s, x) => s + x, 0) / sorted.length;
  const p95 = sorted[Math.min(sorted.length - 1, Math.ceil(0.95 * sorted.length) - 1)] as number;
  return { mean, p95, max: sorted[sorted.length - 1] as number };
}

/** Turns (ms, delta) pairs into a step function in seconds, one point per instant. */
export function stepSeries(deltas: readonly (readonly [number, number])[]): Series {
  const sorted = [...deltas].sort((a, b) => a[0] - b[0]);
  const t: number[] = [0];
  const v: number[] = [0];
  let value = 0;
  for (const [ms, d] of sorted) {
    value += d;
    const s = ms / 1000;
    if (t[t.length - 1] === s) v[v.length - 1] = value;
    else {
      t.push(s);
      v.push(value);
    }
  }
  return { t, v };
}

/** Integral of a step series (value-seconds). */
export function integral(s: Series): number {
  let sum = 0;
  for (let i = 0; i + 1 < s.t.length; i++) {
    sum += (s.v[i] as number) * ((s.t[i + 1] as number) - (s.t[i] as number));
  }
  return sum;
}
