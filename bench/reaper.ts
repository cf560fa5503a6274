/**
 * Part 8: what one reaper run (`reap`, the whole use case) costs at fleet scale (issue 26, item 4): its
 * wall time with a simulated 10 ms per DynamoDB call and 100 ms per EC2 call, its DynamoDB and EC2 calls,
 * and the time of each of its steps, in a fleet of 2,000 backing nodes over 50 capacity sets and in one
 * of 20. Against the reaper function's timeout (core/timing.ts): the aim is half of it.
 *
 * The fleet: 25 backing pools (provider `local`, each with max-servers: a capacity set of backing nodes)
 * and 25 metastatic pools (each with max-servers: a capacity set of nodes), metastatic pool i packing
 * onto backing pool i. The backing nodes are spread round-robin over the pools:
 *   - ~88 % ready and holding 1 to 4 of their 4 slots (nodes on them, each with its place in its pool's
 *     set);
 *   - 10 % ready and empty past their grace-time (the reaper retires them: marked retiring, terminated
 *     in a batch, confirmed gone, stopped, their places freed);
 *   - 2 % launching (their resource pending, recorded a moment ago).
 * The items are written as the store writes them (backingItem, resourceItem; BatchWriteItem, 25 at a
 * time), the places as reserves leave them (one per set through the store, the rest copies of it:
 * testkit/heldPlaces.ts; so the capacity step finds every set consistent), and
 * every backing node's resource launched in the cost simulator's in-memory provider (so reconciliation
 * finds them all; the ready ones booted). No requests are written: a run with nothing expired reads
 * none (the request steps Query their partitions, which are empty).
 *
 * Latency: an SDK middleware sleeps 10 ms before every DynamoDB call (on top of in-process dynalite's
 * own time), and the provider wrapper sleeps 100 ms per EC2 call the real provider (Ec2Provider) would
 * make for each provider call: list = one DescribeInstances page per 1,000 instances, describeMany one
 * per 200 ids, terminateMany one TerminateInstances per 1,000 ids, describe / terminate / launch one.
 * One run, no deadline (the full cost), on each fleet; then, at 2,000, a second run on a fresh fleet
 * with the function's deadline (what one real invocation gets done).
 *
 *   npx tsx bench/reaper.ts      (this part alone; `npm run bench` runs it with the others)
 */
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import {
  BatchWriteCommand,
  type BatchWriteCommandInput,
  type BatchWriteCommandOutput,
  DynamoDBDocumentClient,
} from '@aws-sdk/lib-dynamodb';
import { stringify } from 'yaml';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { ManualClock } from '../shared/core/clock.ts';
import { nodeId, ownerToken } from '../shared/core/ids.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import type {
  BackingProvider,
  BackingResource,
  LaunchSpec,
  ReportedHostKeys,
} from '../shared/core/provider.ts';
import type { BackingRecord, RequestRecord } from '../shared/core/records.ts';
import { type Deadline, deadlineOf, FUNCTION_TIMEOUT_SECONDS, invocationFor } from '../shared/core/timing.ts';
import { DESCRIBE_BATCH_SIZE, LIST_PAGE_SIZE } from '../shared/providers/aws/ec2Provider.ts';
import { TERMINATE_BATCH_SIZE } from '../shared/providers/aws/terminateInstances.ts';
import { ensureTable } from '../shared/runtime/engines.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import { backingItem, keys, resourceItem } from '../shared/store/table.ts';
import type { Context } from '../shared/usecases/context.ts';
import { reap } from '../shared/usecases/reap/reap.ts';
import type { ReapReport } from '../shared/usecases/reap/reapReport.ts';
import { holdPlaces } from '../testkit/heldPlaces.ts';
import { startInProcessDynalite } from '../testkit/inProcessDynalite.ts';
import { inParallel, log, round, sleep, table, yesNo } from './common.ts';
import { SimProvider } from './cost/simProvider.ts';

export const REAPER = {
  /** Backing nodes in the fleet: the figure's and the small one beside it. */
  sizes: [20, 2_000] as const,
  /** Backing pools with max-servers, and as many metastatic pools with max-servers: 50 capacity sets. */
  pools: 25,
  slots: 4,
  idleShare: 0.1,
  launchingShare: 0.02,
  graceSeconds: 600,
  backingMaxServers: 1_000,
  nodeMaxServers: 10_000,
  /** Simulated latency of each call. */
  dynamodbMs: 10,
  ec2Ms: 100,
  /** The aim: half the reaper function's timeout. */
  aimSeconds: FUNCTION_TIMEOUT_SECONDS.reaper / 2,
  /** Capacity sets filled at once (distinct sets: they do not contend). */
  fillConcurrency: 8,
  /**
   * The scale-up case (issue 40, defect 3): as many backing nodes, this many of them launching, each for
   * a node, its instance running and its host keys not in its console output yet (every check reads it:
   * one GetConsoleOutput); and requests whose client lease lapsed, on ready backing nodes.
   */
  scaleUp: { backingNodes: 2_000, launching: 500, lapsedLeases: 20 },
} as const;

const DAY = 24 * 3_600_000;
const pad = (i: number) => String(i).padStart(2, '0');

/** The configuration: 25 local backing pools and 25 metastatic pools, max-servers on every one. */
export function reaperConfig(): ResolvedConfig {
  const range = Array.from({ length: REAPER.pools }, (_, i) => pad(i));
  return parseConfigOrThrow(
    stringify({
      providers: [
        {
          name: 'local',
          driver: 'local',
          pools: range.map((i) => ({
            name: `b-${i}`,
            'max-servers': REAPER.backingMaxServers,
            labels: [{ name: `large-${i}` }],
          })),
        },
        {
          name: 'meta',
          driver: 'metastatic',
          pools: range.map((i) => ({
            name: `m-${i}`,
            'max-servers': REAPER.nodeMaxServers,
            labels: [
              {
                name: `small-${i}`,
                'backing-label': `large-${i}`,
                'max-parallel-jobs': REAPER.slots,
                'grace-time': REAPER.graceSeconds,
              },
            ],
          })),
        },
      ],
    }),
    'bench-reaper.yaml',
  );
}

/** Calls one reaper run made: DynamoDB by command, EC2 by API (as Ec2Provider would make them). */
export interface RunCalls {
  readonly dynamodb: number;
  readonly dynamodbByCommand: Record<string, number>;
  readonly ec2: number;
  readonly ec2ByApi: Record<string, number>;
}

export interface ReaperCase {
  readonly backingNodes: number;
  readonly capacitySets: number;
  readonly ready: number;
  readonly idle: number;
  readonly launching: number;
  readonly nodes: number;
  /** Wall time of one `reap(ctx)`, seconds. */
  readonly seconds: number;
  readonly calls: RunCalls;
  /** Wall time of each of the run's steps (ReapReport.stepMs), seconds. */
  readonly stepSeconds: Record<string, number>;
  /** What the run did. */
  readonly retired: number;
  readonly stopped: number;
  readonly errors: number;
  readonly deferred: number;
  /** Seconds filling the fleet (not measured against anything). */
  readonly fillSeconds: number;
}

export interface ReaperFigures {
  readonly dynamodbMs: number;
  readonly ec2Ms: number;
  readonly functionTimeoutSeconds: number;
  readonly cases: readonly ReaperCase[];
  /** At the largest size, with the function's deadline: what one invocation gets through. */
  readonly bounded?: ReaperCase;
  readonly aimSeconds: number;
  readonly aimMet: boolean;
}

/** Counts and slows the provider's calls as EC2 would see them (see the file's comment). */
class Ec2Latency implements BackingProvider {
  readonly byApi = new Map<string, number>();
  readonly eventuallyConsistent = true;
  on = false;

  constructor(private readonly inner: SimProvider) {}

  private async calls(api: string, n: number): Promise<void> {
    if (!this.on || n === 0) return;
    this.byApi.set(api, (this.byApi.get(api) ?? 0) + n);
    await sleep(REAPER.ec2Ms * n);
  }

  async launch(spec: LaunchSpec): Promise<{ resourceId: string }> {
    await this.calls('RunInstances', 1);
    return this.inner.launch(spec);
  }

  async describe(resourceId: string): Promise<BackingResource | undefined> {
    await this.calls('DescribeInstances', 1);
    return this.inner.describe(resourceId);
  }

  async describeMany(resourceIds: readonly string[]): Promise<Map<string, BackingResource>> {
    await this.calls('DescribeInstances', Math.ceil(new Set(resourceIds).size / DESCRIBE_BATCH_SIZE));
    const found = new Map<string, BackingResource>();
    for (const id of resourceIds) {
      const r = await this.inner.describe(id);
      if (r) found.set(id, r);
    }
    return found;
  }

  async terminate(resourceId: string): Promise<void> {
    await this.calls('TerminateInstances', 1);
    await this.inner.terminate(resourceId);
  }

  async terminateMany(resourceIds: readonly string[]): Promise<void> {
    await this.calls('TerminateInstances', Math.ceil(new Set(resourceIds).size / TERMINATE_BATCH_SIZE));
    for (const id of resourceIds) await this.inner.terminate(id);
  }

  async list(): Promise<BackingResource[]> {
    const all = await this.inner.list();
    await this.calls('DescribeInstances', Math.max(1, Math.ceil(all.length / LIST_PAGE_SIZE)));
    return all;
  }

  /** A console output with no host keys yet (cloud-init prints them a minute or more after boot). */
  async reportedHostKeys(): Promise<ReportedHostKeys> {
    await this.calls('GetConsoleOutput', 1);
    return { kind: 'none' };
  }
}

interface Fleet {
  readonly ctx: Context;
  readonly clock: ManualClock;
  readonly ec2: Ec2Latency;
  readonly counts: Pick<ReaperCase, 'ready' | 'idle' | 'launching' | 'nodes'>;
  readonly fillSeconds: number;
}

/**
 * How a fleet is made besides its size: how many launching (default REAPER.launchingShare of it), whether
 * their instances run already and each holds a node (a scale-up: the default is a moment after the
 * launch, pending and empty), and how many ready nodes' requests have a client lease that lapsed.
 */
interface FleetShape {
  readonly launching?: number;
  readonly scaleUp?: boolean;
  readonly lapsedLeases?: number;
}

/** One fleet of `n` backing nodes on its own table (see the file's comment). */
async function buildFleet(
  engine: Awaited<ReturnType<typeof startInProcessDynalite>>,
  config: ResolvedConfig,
  n: number,
  tableName: string,
  shape: FleetShape = {},
): Promise<Fleet> {
  const t0 = performance.now();
  const clock = new ManualClock(Date.now());
  const now = clock.now();
  await ensureTable(engine.client, tableName);
  const store = new DynamoStore(engine.client, tableName, clock);
  const sim = new SimProvider({ clock, bootMs: 0, schedule: () => {} });
  const ec2 = new Ec2Latency(sim);
  const backingKeys = new Set(config.backingPools.map((p) => p.key));
  const ctx: Context = {
    store,
    config,
    providers: {
      forPool(poolKey) {
        if (!backingKeys.has(poolKey)) throw new Error(`unknown backing pool ${poolKey}`);
        return ec2;
      },
      forResource: (id) => (id.startsWith('sim-') ? ec2 : undefined),
    },
    clock,
    log,
  };
  const idle = Math.max(1, Math.round(n * REAPER.idleShare));
  const launching = shape.launching ?? Math.max(1, Math.round(n * REAPER.launchingShare));
  const leased: RequestRecord[] = [];
  const records: BackingRecord[] = [];
  /** Node places per metastatic pool, and backing places per backing pool. */
  const nodePlaces = new Map<string, string[]>();
  const backingPlaces = new Map<string, string[]>();
  for (let i = 0; i < n; i++) {
    const p = i % REAPER.pools;
    const meta = config.metastaticPools[p];
    const backing = config.backingPools[p];
    if (!meta || !backing) throw new Error(`reaper bench: pool ${p} missing from the configuration`);
    const id = `bn-${String(i).padStart(5, '0')}`;
    // Which kind, spread evenly: the first `launching` of every n/launching, then `idle` likewise.
    const kind =
      i % Math.round(n / launching) === 0 ? 'launching' : i % Math.round(n / idle) === 1 ? 'idle' : 'ready';
    const launchedAt = kind === 'launching' ? now - 20_000 : now - DAY + Math.floor((i * DAY) / (2 * n));
    clock.set(launchedAt);
    const { resourceId } = await sim.launch({
      backingNodeId: id,
      attempt: 1,
      poolKey: backing.key,
      label: `large-${pad(p)}`,
      slots: REAPER.slots,
    });
    if (kind !== 'launching' || shape.scaleUp) sim.boot(resourceId);
    const used = kind === 'ready' ? 1 + (i % REAPER.slots) : kind === 'launching' && shape.scaleUp ? 1 : 0;
    const slotMap: Record<string, string> = {};
    for (let s = 0; s < used; s++) slotMap[String(s)] = nodeId(`req-${id}-${s}`, 0);
    if (kind === 'ready' && leased.length < (shape.lapsedLeases ?? 0)) {
      // Slot 0's node: its request's client lease lapsed a moment ago (the reaper releases it).
      leased.push({
        id: `req-${id}-0`,
        labels: [`small-${pad(p)}`],
        bodyHash: 'bench',
        state: 'fulfilled',
        poolKey: meta.key,
        createdAt: now - 600_000,
        updatedAt: now - 600_000,
        version: 1,
        nodes: [
          {
            id: nodeId(`req-${id}-0`, 0),
            label: `small-${pad(p)}`,
            state: 'ready',
            backingNodeId: id,
            slot: 0,
            host: `10.${Math.floor(i / 250) % 250}.${i % 250}.1`,
            port: 22,
          },
        ],
        lease: 60,
        leaseExpiresAt: now - 1_000,
      });
    }
    nodePlaces.set(meta.key, [...(nodePlaces.get(meta.key) ?? []), ...Object.values(slotMap)]);
    backingPlaces.set(backing.key, [...(backingPlaces.get(backing.key) ?? []), id]);
    const base = {
      id,
      poolKey: meta.key,
      label: `small-${pad(p)}`,
      backingPoolKey: backing.key,
      backingLabel: `large-${pad(p)}`,
      slots: REAPER.slots,
      used,
      slotMap,
      version: 1,
      attempt: 1,
      resourceId,
      resourceRecordedAt: launchedAt + 1_000,
      launchedAt,
    } as const;
    records.push(
      kind === 'launching'
        ? { ...base, state: 'launching', lastUsedAt: launchedAt }
        : {
            ...base,
            state: 'ready',
            host: `10.${Math.floor(i / 250) % 250}.${i % 250}.1`,
            port: 22,
            attributes: { zone: 'bench-a', cores: 16 },
            runningAt: launchedAt + 25_000,
            readyAt: launchedAt + 30_000,
            // Idle ones emptied well past their grace-time; the others were used a moment ago.
            lastUsedAt: kind === 'idle' ? now - (REAPER.graceSeconds + 600) * 1000 : now - 60_000,
          },
    );
  }
  clock.set(now);
  // The records and their resource pointers exactly as the store writes them, 25 to a BatchWriteItem.
  const items = records.flatMap((b) => [
    backingItem(b),
    resourceItem(b.resourceId as string, b.id, b.resourceRecordedAt as number),
  ]);
  const doc = DynamoDBDocumentClient.from(engine.client, {
    marshallOptions: { removeUndefinedValues: true },
  });
  const batches = Array.from({ length: Math.ceil(items.length / 25) }, (_, b) =>
    items.slice(b * 25, b * 25 + 25),
  );
  await inParallel(batches, 4, async (batch) => {
    let requests: BatchWriteCommandInput['RequestItems'] = {
      [tableName]: batch.map((Item) => ({ PutRequest: { Item } })),
    };
    while (requests && Object.keys(requests).length > 0) {
      const out: BatchWriteCommandOutput = await doc.send(new BatchWriteCommand({ RequestItems: requests }));
      requests = out.UnprocessedItems;
    }
  });
  // The places: each backing node's in its backing pool's set, each node's in its pool's set, held by
  // deliveries long finished. One per set reserved through the store, the others copies of the place it
  // wrote (testkit/heldPlaces.ts): the items the store makes, at a fraction of the calls.
  const owner = ownerToken(now - 3_600_000);
  const sets = [
    ...[...backingPlaces].map(([pool, ids]) => [keys.backingPool(pool), ids] as const),
    ...[...nodePlaces].map(([pool, ids]) => [keys.poolNodes(pool), ids] as const),
  ];
  await inParallel(sets, REAPER.fillConcurrency, async ([set, ids]) => {
    await holdPlaces(doc, tableName, store.capacity, set, ids, () => owner);
  });
  for (const r of leased) await store.createRequest(r);
  const count = (k: BackingRecord['state'], used?: boolean) =>
    records.filter((b) => b.state === k && (used === undefined || b.used > 0 === used)).length;
  return {
    ctx,
    clock,
    ec2,
    counts: {
      ready: count('ready', true),
      idle: count('ready', false),
      launching: count('launching'),
      nodes: [...nodePlaces.values()].reduce((s, ids) => s + ids.length, 0),
    },
    fillSeconds: (performance.now() - t0) / 1000,
  };
}

/** One measured run on a fleet: latency on, calls counted; `ctx` replaces parts of the fleet's context. */
async function measureRun(
  fleet: Fleet,
  dynamodb: Map<string, number>,
  setSlow: (on: boolean) => void,
  deadline: Deadline | undefined,
  ctx: Partial<Context> = {},
): Promise<{ seconds: number; report: ReapReport; calls: RunCalls }> {
  dynamodb.clear();
  fleet.ec2.byApi.clear();
  fleet.ec2.on = true;
  setSlow(true);
  const t0 = performance.now();
  const report = await reap({ ...fleet.ctx, ...ctx, ...(deadline ? { deadline } : {}) });
  const seconds = (performance.now() - t0) / 1000;
  setSlow(false);
  fleet.ec2.on = false;
  const sorted = (m: Map<string, number>) => Object.fromEntries([...m.entries()].sort());
  const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
  return {
    seconds,
    report,
    calls: {
      dynamodb: sum(dynamodb),
      dynamodbByCommand: sorted(dynamodb),
      ec2: sum(fleet.ec2.byApi),
      ec2ByApi: sorted(fleet.ec2.byApi),
    },
  };
}

/** A deadline on the wall clock: the reaper function's timeout less the invocation's safety margin. */
function wallDeadline(): Deadline {
  const start = performance.now();
  return deadlineOf(
    invocationFor({ now: () => performance.now() - start }, FUNCTION_TIMEOUT_SECONDS.reaper * 1000),
  );
}

/**
 * An in-process dynalite whose calls, once `setSlow(true)`, each wait REAPER.dynamodbMs (a network round
 * trip) and are counted by command in `dynamodb`.
 */
async function slowedEngine() {
  const engine = await startInProcessDynalite();
  const dynamodb = new Map<string, number>();
  let slow = false;
  engine.client.middlewareStack.add(
    (next, context) => async (args) => {
      if (!slow) return next(args);
      const name = (context.commandName ?? 'unknown').replace(/Command$/, '');
      dynamodb.set(name, (dynamodb.get(name) ?? 0) + 1);
      await sleep(REAPER.dynamodbMs);
      return next(args);
    },
    { step: 'initialize', name: 'benchReaperLatency' },
  );
  const setSlow = (on: boolean) => {
    slow = on;
  };
  return { engine, dynamodb, setSlow };
}

export async function measureReaper(progress: (line: string) => void = () => {}): Promise<ReaperFigures> {
  const { engine, dynamodb, setSlow } = await slowedEngine();
  try {
    const config = reaperConfig();
    const caseOf = (n: number, fleet: Fleet, run: Awaited<ReturnType<typeof measureRun>>): ReaperCase => ({
      backingNodes: n,
      capacitySets:
        config.backingPools.filter((p) => p.maxServers !== undefined).length +
        config.metastaticPools.filter((p) => p.maxServers !== undefined).length,
      ...fleet.counts,
      seconds: round(run.seconds, 2),
      calls: run.calls,
      stepSeconds: Object.fromEntries(
        Object.entries(run.report.stepMs ?? {}).map(([step, ms]) => [step, round(ms / 1000, 2)]),
      ),
      retired: run.report.retired.length,
      stopped: run.report.stopped.length,
      errors: run.report.errors.length,
      deferred: run.report.deferred,
      fillSeconds: round(fleet.fillSeconds, 1),
    });
    const cases: ReaperCase[] = [];
    for (const n of REAPER.sizes) {
      progress(`reaper: filling a fleet of ${n} backing nodes over ${REAPER.pools * 2} capacity sets...`);
      const fleet = await buildFleet(engine, config, n, `bench-reaper-${n}`);
      progress(
        `reaper: one run on ${n} (${REAPER.dynamodbMs} ms per DynamoDB call, ${REAPER.ec2Ms} ms per EC2 call)...`,
      );
      const run = await measureRun(fleet, dynamodb, setSlow, undefined);
      for (const e of run.report.errors.slice(0, 5)) log.warn(`reaper bench: run error: ${e}`);
      cases.push(caseOf(n, fleet, run));
    }
    const largest = REAPER.sizes[REAPER.sizes.length - 1] as number;
    const big = cases.find((c) => c.backingNodes === largest) as ReaperCase;
    let bounded: ReaperCase | undefined;
    if (big.seconds * 1000 > FUNCTION_TIMEOUT_SECONDS.reaper * 1000) {
      progress(`reaper: the run took longer than the function's timeout; again with its deadline...`);
      const fleet = await buildFleet(engine, config, largest, `bench-reaper-${largest}-bounded`);
      bounded = caseOf(largest, fleet, await measureRun(fleet, dynamodb, setSlow, wallDeadline()));
    }
    return {
      dynamodbMs: REAPER.dynamodbMs,
      ec2Ms: REAPER.ec2Ms,
      functionTimeoutSeconds: FUNCTION_TIMEOUT_SECONDS.reaper,
      cases,
      ...(bounded ? { bounded } : {}),
      aimSeconds: REAPER.aimSeconds,
      aimMet: big.seconds < REAPER.aimSeconds,
    };
  } finally {
    await engine.close();
  }
}

/** The scale-up case's figures (issue 40, defect 3). */
export interface ScaleUpFigures {
  readonly dynamodbMs: number;
  readonly ec2Ms: number;
  readonly functionTimeoutSeconds: number;
  readonly backingNodes: number;
  readonly launching: number;
  readonly idle: number;
  readonly lapsedLeases: number;
  /** Wall time of the run, seconds, with the function's deadline (one real invocation). */
  readonly seconds: number;
  readonly stepSeconds: Record<string, number>;
  readonly calls: RunCalls;
  /** Launching backing nodes checked this run (one GetConsoleOutput each). */
  readonly checked: number;
  readonly retired: number;
  readonly stopped: number;
  readonly leasesExpired: number;
  readonly errors: number;
  readonly deferred: number;
  readonly fillSeconds: number;
  readonly aimSeconds: number;
  /** Within the aim, with every idle backing node retired and every lapsed lease ended in the run. */
  readonly aimMet: boolean;
}

/**
 * One reaper run during a scale-up (issue 40, defect 3): REAPER.scaleUp's fleet, its launching backing
 * nodes' instances running with no host keys in their console output yet (host keys from the console, as
 * where the functions cannot reach the instances), some lapsed client leases, the same simulated latency;
 * with the reaper function's deadline, on a clock that moves with the wall clock (the run's checks of
 * launching backing nodes stop after RUNNING_CHECKS_MS of it).
 */
export async function measureScaleUp(progress: (line: string) => void = () => {}): Promise<ScaleUpFigures> {
  const { engine, dynamodb, setSlow } = await slowedEngine();
  try {
    const { backingNodes, launching, lapsedLeases } = REAPER.scaleUp;
    progress(
      `reaper: a scale-up of ${launching} launching among ${backingNodes} backing nodes, ${lapsedLeases} lapsed leases...`,
    );
    const fleet = await buildFleet(engine, reaperConfig(), backingNodes, 'bench-reaper-scale-up', {
      launching,
      scaleUp: true,
      lapsedLeases,
    });
    const start = fleet.clock.now();
    const t0 = performance.now();
    const clock = { now: () => start + (performance.now() - t0) };
    progress('reaper: one run during the scale-up, with the function deadline...');
    const run = await measureRun(fleet, dynamodb, setSlow, wallDeadline(), {
      clock,
      hostKeyPlan: () => ({ source: 'console', reachable: false }),
    });
    for (const e of run.report.errors.slice(0, 5)) log.warn(`reaper bench: run error: ${e}`);
    const seconds = round(run.seconds, 2);
    const retired = run.report.retired.length;
    const leasesExpired = run.report.leasesExpired?.length ?? 0;
    return {
      dynamodbMs: REAPER.dynamodbMs,
      ec2Ms: REAPER.ec2Ms,
      functionTimeoutSeconds: FUNCTION_TIMEOUT_SECONDS.reaper,
      backingNodes,
      launching: fleet.counts.launching,
      idle: fleet.counts.idle,
      lapsedLeases,
      seconds,
      stepSeconds: Object.fromEntries(
        Object.entries(run.report.stepMs ?? {}).map(([step, ms]) => [step, round(ms / 1000, 2)]),
      ),
      calls: run.calls,
      checked: run.calls.ec2ByApi.GetConsoleOutput ?? 0,
      retired,
      stopped: run.report.stopped.length,
      leasesExpired,
      errors: run.report.errors.length,
      deferred: run.report.deferred,
      fillSeconds: round(fleet.fillSeconds, 1),
      aimSeconds: REAPER.aimSeconds,
      aimMet: seconds <= REAPER.aimSeconds && retired === fleet.counts.idle && leasesExpired === lapsedLeases,
    };
  } finally {
    await engine.close();
  }
}

export function scaleUpReport(f: ScaleUpFigures): string {
  const steps = Object.entries(f.stepSeconds).map(([step, s]) => [`  ${step}`, s.toFixed(2)]);
  return [
    `8b. One reaper run during a scale-up: ${f.launching} of ${f.backingNodes} backing nodes launching, their instances running without host keys in the console output yet, ${f.ec2Ms} ms per EC2 call and ${f.dynamodbMs} ms per DynamoDB call, the function's ${f.functionTimeoutSeconds} s deadline (bench/reaper.ts)`,
    table(
      [
        ['run wall time, s', f.seconds.toFixed(2)],
        ...steps,
        ['launching checked (GetConsoleOutput)', `${f.checked} of ${f.launching}`],
        ['idle retired / stopped', `${f.retired} of ${f.idle} / ${f.stopped}`],
        ['lapsed leases ended', `${f.leasesExpired} of ${f.lapsedLeases}`],
        ['DynamoDB / EC2 calls', `${f.calls.dynamodb} / ${f.calls.ec2}`],
        ['errors / deferred', `${f.errors} / ${f.deferred}`],
        ['fill time, s (not measured)', f.fillSeconds.toFixed(1)],
      ],
      ['', 'scale-up'],
    ),
    `aim <= ${f.aimSeconds} s with retirement and lease expiry done in the same run: ${yesNo(f.aimMet)}`,
  ].join('\n');
}

export function scaleUpSummary(f: ScaleUpFigures) {
  return [
    {
      figure: `reaper run seconds with ${f.launching} backing nodes launching`,
      measured: `${f.seconds.toFixed(1)} (retired ${f.retired}/${f.idle}, leases ended ${f.leasesExpired}/${f.lapsedLeases}, checked ${f.checked})`,
      aim: `<= ${f.aimSeconds}`,
      met: yesNo(f.aimMet),
    },
  ];
}

export function reaperReport(f: ReaperFigures): string {
  const cases = [...f.cases, ...(f.bounded ? [f.bounded] : [])];
  const names = cases.map((c) =>
    c === f.bounded
      ? `${c.backingNodes} (deadline ${f.functionTimeoutSeconds} s)`
      : `${c.backingNodes} backing nodes`,
  );
  const steps = [...new Set(cases.flatMap((c) => Object.keys(c.stepSeconds)))];
  const commands = [...new Set(cases.flatMap((c) => Object.keys(c.calls.dynamodbByCommand)))].sort();
  const apis = [...new Set(cases.flatMap((c) => Object.keys(c.calls.ec2ByApi)))].sort();
  const row = (label: string, pick: (c: ReaperCase) => string) => [label, ...cases.map(pick)];
  return [
    `8. One reaper run, ${f.dynamodbMs} ms per DynamoDB call and ${f.ec2Ms} ms per EC2 call simulated (bench/reaper.ts)`,
    table(
      [
        row('capacity sets (max-servers)', (c) => String(c.capacitySets)),
        row(
          'ready with nodes / idle past grace / launching',
          (c) => `${c.ready} / ${c.idle} / ${c.launching}`,
        ),
        row('nodes (places held)', (c) => String(c.nodes)),
        row('run wall time, s', (c) => c.seconds.toFixed(2)),
        ...steps.map((s) => row(`  ${s}`, (c) => (c.stepSeconds[s] ?? 0).toFixed(2))),
        row('DynamoDB calls', (c) => String(c.calls.dynamodb)),
        ...commands.map((cmd) => row(`  ${cmd}`, (c) => String(c.calls.dynamodbByCommand[cmd] ?? 0))),
        row('EC2 calls', (c) => String(c.calls.ec2)),
        ...apis.map((api) => row(`  ${api}`, (c) => String(c.calls.ec2ByApi[api] ?? 0))),
        row('retired / stopped this run', (c) => `${c.retired} / ${c.stopped}`),
        row('errors / deferred', (c) => `${c.errors} / ${c.deferred}`),
        row('fill time, s (not measured)', (c) => c.fillSeconds.toFixed(1)),
      ],
      ['', ...names],
    ),
    `the reaper function's timeout: ${f.functionTimeoutSeconds} s; aim < ${f.aimSeconds} s at ${
      f.cases[f.cases.length - 1]?.backingNodes
    }: ${yesNo(f.aimMet)}`,
  ].join('\n');
}

export function reaperSummary(f: ReaperFigures) {
  const big = f.cases[f.cases.length - 1];
  return [
    {
      figure: 'reaper run seconds at 2,000 backing nodes and 50 capacity sets',
      measured: big ? big.seconds.toFixed(1) : '-',
      aim: `< ${f.aimSeconds}`,
      met: yesNo(f.aimMet),
    },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  if (process.argv.includes('--scale-up')) {
    const scaleUp = await measureScaleUp((line) => console.log(line));
    console.log(scaleUpReport(scaleUp));
    process.exit(0);
  }
  const figures = await measureReaper((line) => console.log(line));
  console.log(reaperReport(figures));
  console.log(
    table(
      reaperSummary(figures).map((r) => [r.figure, r.measured, r.aim, r.met]),
      ['figure', 'measured', 'aim', 'met'],
    ),
  );
}
