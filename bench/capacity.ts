/**
 * What DynamoDB would bill for an allocation and a release, and what one pool's hottest item allows
 * (issue 12): the real use cases (`requestNodes` on the warm path, `releaseNode`) against dynalite, which
 * reports ConsumedCapacity as DynamoDB computes it (per started KB of the larger of the item before and
 * after). A pool with max-servers 10,000 holds 20, then 5,000 live nodes' places (reserved through the
 * store); each sample allocates one node on a ready backing node with a free slot and releases it.
 * Separately, the backing pool's cap: taking and giving back one backing node's place with 20 and 2,000
 * backing nodes held.
 *
 * And issue 24's two figures: the read units of a delivery in a capped pool with 10, then 5,000 requests
 * waiting (its priority check read them all, defect 1), and the writes to the pool's counter item of one
 * allocation of a 64-node set (one per member, defect 5).
 *
 * Units are summed over every call of a sample (reads: GetItem, Query; writes: PutItem, UpdateItem,
 * DeleteItem, counting the ones whose condition failed, which DynamoDB bills too) and per item written,
 * to find the hottest item: DynamoDB allows about 1,000 write units per second on one item.
 */
import {
  BatchWriteCommand,
  type BatchWriteCommandInput,
  type BatchWriteCommandOutput,
  DynamoDBDocumentClient,
} from '@aws-sdk/lib-dynamodb';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { nodeId, ownerToken } from '../shared/core/ids.ts';
import type { RequestMessage } from '../shared/core/messages.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import type { RequestRecord } from '../shared/core/records.ts';
import { requestedRecord } from '../shared/core/request.ts';
import type { Key } from '../shared/store/capacitySets.ts';
import type { DynamoStore } from '../shared/store/dynamoStore.ts';
import { keys, requestItem } from '../shared/store/table.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import { largeNode, poolConfig, smallNode } from '../testkit/configs.ts';
import { holdPlaces } from '../testkit/heldPlaces.ts';
import { readyBacking, round, table, yesNo } from './common.ts';
import { InstrumentedStore } from './storeFixture.ts';

export const CAPACITY = {
  liveNodes: [20, 5_000] as const,
  backingNodes: [20, 2_000] as const,
  maxServers: 10_000,
  slots: 8,
  samples: 20,
  /** DynamoDB's write throughput on one item, units per second. */
  itemWriteUnitsPerSecond: 1_000,
  /** Requests waiting while a delivery is measured (issue 24, defect 1), and deliveries measured. */
  waiting: { counts: [10, 5_000] as const, samples: 10 },
  /** The node set whose allocation's counter writes are counted (issue 24, defect 5), and its samples. */
  nodeSet: { nodes: 64, samples: 2 },
  aims: { ratio: 1.2, unitsAt5000: 8, allocationsPerSecond: 500, waitingRatio: 1.5, counterWrites: 1 },
} as const;

const POOL = 'meta/main';
const BACKING_POOL = 'local/main';
const LABEL = 'small-node';

interface Units {
  read: number;
  write: number;
  /** Write units per item (`pk sk`). */
  readonly byItem: Map<string, number>;
  /** Write calls per item (`pk sk`), failed conditions included. */
  readonly writesByItem: Map<string, number>;
  /** Read calls (GetItem, Query, Scan). */
  reads: number;
}

export interface CapacityCase {
  readonly held: number;
  /** Per warm allocation, averaged over the samples. */
  readonly allocation: { readonly read: number; readonly write: number; readonly hottestItem: number };
  readonly release: { readonly read: number; readonly write: number; readonly hottestItem: number };
}

/** A delivery in a capped pool with `waiting` requests waiting (its priority check reads them). */
export interface WaitingCase {
  readonly waiting: number;
  /** Per delivery (a one-node request placed at once), averaged over the samples. */
  readonly readUnits: number;
  readonly readCalls: number;
}

/** One allocation of a node set in a pool with max-servers: what it writes to the pool's counter item. */
export interface NodeSetCase {
  readonly nodes: number;
  readonly counterWrites: number;
  readonly counterWriteUnits: number;
  readonly allocationWriteUnits: number;
}

export interface CapacityFigures {
  readonly pool: readonly CapacityCase[];
  readonly backingPool: readonly CapacityCase[];
  /** Issue 24 (absent from results written before it). */
  readonly waiting?: readonly WaitingCase[];
  readonly waitingRatio?: number;
  readonly nodeSet?: NodeSetCase;
  readonly ratio: number;
  readonly unitsAt5000: number;
  readonly allocationsPerSecond: number;
  readonly aimsMet: {
    readonly ratio: boolean;
    readonly unitsAt5000: boolean;
    readonly allocationsPerSecond: boolean;
    readonly waitingRatio?: boolean;
    readonly counterWrites?: boolean;
  };
}

/** Counts consumed capacity on the fixture's client while `work` runs. */
async function metered(fx: InstrumentedStore, work: () => Promise<unknown>): Promise<Units> {
  const units: Units = { read: 0, write: 0, byItem: new Map(), writesByItem: new Map(), reads: 0 };
  const name = `consumed-${Math.random()}`;
  fx.client.middlewareStack.add(
    (next, context) => async (args) => {
      const input = args.input as Record<string, unknown>;
      input.ReturnConsumedCapacity = 'TOTAL';
      const command = context.commandName ?? '';
      const itemOf = (i: Record<string, unknown>) => {
        const key = (i.Key ?? i.Item) as { pk?: unknown; sk?: unknown } | undefined;
        return `${JSON.stringify(key?.pk)} ${JSON.stringify(key?.sk)}`;
      };
      // A transaction writes each of its actions' items (a capacity set's counter and places).
      const items =
        command === 'TransactWriteItemsCommand'
          ? ((input.TransactItems ?? []) as Record<string, Record<string, unknown>>[]).map((a) =>
              itemOf(Object.values(a)[0] ?? {}),
            )
          : [itemOf(input)];
      if (/Get|Query|Scan/.test(command)) units.reads += 1;
      else for (const item of items) units.writesByItem.set(item, (units.writesByItem.get(item) ?? 0) + 1);
      const out = await next(args).catch((err: unknown) => {
        // A failed condition is billed as a write of the item (DynamoDB); dynalite does not report it.
        if ((err as Error).name === 'ConditionalCheckFailedException') units.write += 1;
        // A cancelled transaction: each item as a transactional write (2 units).
        if ((err as Error).name === 'TransactionCanceledException') units.write += 2 * items.length;
        throw err;
      });
      // One table's figure, or a list (a transaction's, per table).
      type Consumed = { CapacityUnits?: number };
      const consumed = (out.output as { ConsumedCapacity?: Consumed | Consumed[] }).ConsumedCapacity;
      const cu = (Array.isArray(consumed) ? consumed : [consumed]).reduce(
        (t, c) => t + (c?.CapacityUnits ?? 0),
        0,
      );
      if (/Get|Query|Scan/.test(command)) units.read += cu;
      else {
        units.write += cu;
        // DynamoDB reports a transaction's units per table, not per item: each item gets its share (the
        // items here are under 1 KB, 2 units each as a transactional write, so the shares are exact).
        for (const item of items) units.byItem.set(item, (units.byItem.get(item) ?? 0) + cu / items.length);
      }
      return out;
    },
    { step: 'initialize', name },
  );
  try {
    await work();
  } finally {
    fx.client.middlewareStack.remove(name);
  }
  return units;
}

const hottest = (u: Units) => Math.max(0, ...u.byItem.values());

function average(samples: readonly Units[]) {
  const n = samples.length;
  return {
    read: round(samples.reduce((s, u) => s + u.read, 0) / n, 2),
    write: round(samples.reduce((s, u) => s + u.write, 0) / n, 2),
    hottestItem: round(samples.reduce((s, u) => s + hottest(u), 0) / n, 2),
  };
}

/**
 * `held` places in a set, held by one owner, as reserves long finished leave them: the first reserved
 * through the store, the others copies of the place it wrote (testkit/heldPlaces.ts). A reserve per member
 * through the store (a transaction each, 2,000 one-member reserves in the backing pool) took most of
 * this part's time; the items are the same.
 */
async function fill(
  fx: InstrumentedStore,
  store: DynamoStore,
  set: Key,
  held: number,
  member: (i: number) => string,
) {
  const owner = ownerToken(Date.now());
  const doc = DynamoDBDocumentClient.from(fx.client, { marshallOptions: { removeUndefinedValues: true } });
  const members = Array.from({ length: held }, (_, i) => member(i));
  await holdPlaces(doc, store.tableName, store.capacity, set, members, () => owner);
}

/** The pool of every case: max-servers 10,000, label small-node with CAPACITY.slots slots per backing node. */
function capacityConfig(): ResolvedConfig {
  return parseConfigOrThrow(
    poolConfig({
      backing: { labels: [largeNode()] },
      meta: {
        pool: { 'max-servers': CAPACITY.maxServers },
        labels: [smallNode({ 'max-parallel-jobs': CAPACITY.slots, 'grace-time': 86_400 })],
      },
    }),
    'capacity.yaml',
  );
}

/** `count` ready backing nodes of the pool's label, none of their slots used. */
async function readyBackingNodes(store: DynamoStore, count: number): Promise<void> {
  for (let i = 1; i <= count; i++) {
    await store.createBacking(
      readyBacking({
        id: `bn-${i}`,
        poolKey: POOL,
        label: LABEL,
        backingPoolKey: BACKING_POOL,
        backingLabel: 'large-node',
        slots: CAPACITY.slots,
        used: 0,
        launchedAt: Date.now() - 60_000 - i,
      }),
    );
  }
}

async function poolCase(fx: InstrumentedStore, held: number): Promise<CapacityCase> {
  const store = await fx.store(`capacity-pool-${held}`);
  const ctx = fx.context(store, capacityConfig());
  await fill(fx, store, keys.poolNodes(POOL), held, (i) => nodeId(`live-${i}`, 0));
  await store.createBacking(
    readyBacking({
      id: 'bn-1',
      poolKey: POOL,
      label: LABEL,
      backingPoolKey: BACKING_POOL,
      backingLabel: 'large-node',
      slots: CAPACITY.slots,
      used: 0,
      launchedAt: Date.now() - 60_000,
    }),
  );
  const allocations: Units[] = [];
  const releases: Units[] = [];
  for (let s = 0; s < CAPACITY.samples; s++) {
    const id = `sample-${held}-${s}`;
    allocations.push(
      await metered(fx, async () => {
        const out = await requestNodes(ctx, { kind: 'request', id, labels: [LABEL] });
        if (out.kind !== 'placed' || out.request.state !== 'fulfilled')
          throw new Error(`${id} was not fulfilled at once`);
      }),
    );
    releases.push(await metered(fx, () => releaseNode(ctx, nodeId(id, 0))));
  }
  return { held, allocation: average(allocations), release: average(releases) };
}

async function backingPoolCase(fx: InstrumentedStore, held: number): Promise<CapacityCase> {
  const store = await fx.store(`capacity-backing-${held}`);
  await fill(fx, store, keys.backingPool(BACKING_POOL), held, (i) => nodeId(`live-${i}`, 0));
  const reserves: Units[] = [];
  const frees: Units[] = [];
  for (let s = 0; s < CAPACITY.samples; s++) {
    const id = `bn-sample-${s}`;
    reserves.push(
      await metered(fx, () =>
        store.reserveBackingPlace(BACKING_POOL, id, CAPACITY.maxServers, ownerToken(Date.now())),
      ),
    );
    frees.push(await metered(fx, () => store.freeBackingPlace(BACKING_POOL, id)));
  }
  return { held, allocation: average(reserves), release: average(frees) };
}

/**
 * Requests waiting as deliveries leave them when their pool is full, none of which a new one-node request
 * must let go first: half pairs (more nodes than it takes), half one-node requests served after it
 * (priority 200). The first of each through the store (which announces its waiting queue), the others
 * written as the store writes them (`requestItem`), 25 to a BatchWriteItem.
 */
async function fillWaiting(fx: InstrumentedStore, store: DynamoStore, count: number): Promise<void> {
  const doc = DynamoDBDocumentClient.from(fx.client, { marshallOptions: { removeUndefinedValues: true } });
  const at = Date.now() - 3_600_000;
  const records: RequestRecord[] = Array.from({ length: count }, (_, i) => {
    const m: RequestMessage =
      i % 2 === 0
        ? { kind: 'request', id: `pair-${i}`, labels: [LABEL, LABEL] }
        : { kind: 'request', id: `later-${i}`, labels: [LABEL], priority: 200 };
    return requestedRecord(m, at + i);
  });
  const [first, second, ...rest] = records;
  for (const r of [first, second]) if (r) await store.createRequest(r);
  for (let i = 0; i < rest.length; i += 25) {
    let items: BatchWriteCommandInput['RequestItems'] = {
      [store.tableName]: rest.slice(i, i + 25).map((r) => ({ PutRequest: { Item: requestItem(r) } })),
    };
    while (items && Object.keys(items).length > 0) {
      const out: BatchWriteCommandOutput = await doc.send(new BatchWriteCommand({ RequestItems: items }));
      items = out.UnprocessedItems;
    }
  }
}

async function waitingCase(fx: InstrumentedStore, waiting: number): Promise<WaitingCase> {
  const store = await fx.store(`capacity-waiting-${waiting}`);
  const ctx = fx.context(store, capacityConfig());
  await readyBackingNodes(store, 1);
  await fillWaiting(fx, store, waiting);
  const samples: Units[] = [];
  for (let s = 0; s < CAPACITY.waiting.samples; s++) {
    const id = `sample-${waiting}-${s}`;
    samples.push(
      await metered(fx, async () => {
        const out = await requestNodes(ctx, { kind: 'request', id, labels: [LABEL] });
        if (out.kind !== 'placed' || out.request.state !== 'fulfilled')
          throw new Error(`${id} was not fulfilled at once`);
      }),
    );
    await releaseNode(ctx, nodeId(id, 0));
  }
  const n = samples.length;
  return {
    waiting,
    readUnits: round(samples.reduce((t, u) => t + u.read, 0) / n, 2),
    readCalls: round(samples.reduce((t, u) => t + u.reads, 0) / n, 2),
  };
}

async function nodeSetCase(fx: InstrumentedStore): Promise<NodeSetCase> {
  const { nodes, samples: count } = CAPACITY.nodeSet;
  const store = await fx.store(`capacity-node-set-${nodes}`);
  const ctx = fx.context(store, capacityConfig());
  await readyBackingNodes(store, Math.ceil(nodes / CAPACITY.slots));
  const counter = keys.poolNodes(POOL);
  const counterItem = `${JSON.stringify(counter.pk)} ${JSON.stringify(counter.sk)}`;
  // The pool's first reservation creates its counter item (once): not what is measured.
  await requestNodes(ctx, { kind: 'request', id: 'first', labels: [LABEL] });
  await releaseNode(ctx, nodeId('first', 0));
  const samples: Units[] = [];
  for (let s = 0; s < count; s++) {
    const id = `set-${s}`;
    samples.push(
      await metered(fx, async () => {
        const out = await requestNodes(ctx, { kind: 'request', id, labels: Array(nodes).fill(LABEL) });
        if (out.kind !== 'placed' || out.request.state !== 'fulfilled')
          throw new Error(`${id} was not fulfilled at once`);
      }),
    );
    for (let i = 0; i < nodes; i++) await releaseNode(ctx, nodeId(id, i));
  }
  const mean = (f: (u: Units) => number) => round(samples.reduce((t, u) => t + f(u), 0) / samples.length, 2);
  return {
    nodes,
    counterWrites: mean((u) => u.writesByItem.get(counterItem) ?? 0),
    counterWriteUnits: mean((u) => u.byItem.get(counterItem) ?? 0),
    allocationWriteUnits: mean((u) => u.write),
  };
}

export async function measureCapacity(progress: (line: string) => void): Promise<CapacityFigures> {
  const fx = await InstrumentedStore.start();
  try {
    const pool: CapacityCase[] = [];
    for (const held of CAPACITY.liveNodes) {
      progress(`capacity: pool with ${held} live nodes`);
      pool.push(await poolCase(fx, held));
    }
    const backingPool: CapacityCase[] = [];
    for (const held of CAPACITY.backingNodes) {
      progress(`capacity: backing pool with ${held} backing nodes`);
      backingPool.push(await backingPoolCase(fx, held));
    }
    const waiting: WaitingCase[] = [];
    for (const n of CAPACITY.waiting.counts) {
      progress(`capacity: a delivery with ${n} requests waiting`);
      waiting.push(await waitingCase(fx, n));
    }
    progress(`capacity: allocations of a ${CAPACITY.nodeSet.nodes}-node set`);
    const nodeSet = await nodeSetCase(fx);
    const [few, many] = waiting as [WaitingCase, WaitingCase];
    const waitingRatio = round(many.readUnits / few.readUnits, 2);
    const [small, large] = pool as [CapacityCase, CapacityCase];
    const ratio = round(large.allocation.write / small.allocation.write, 2);
    const unitsAt5000 = large.allocation.write;
    const allocationsPerSecond = Math.floor(CAPACITY.itemWriteUnitsPerSecond / large.allocation.hottestItem);
    return {
      pool,
      backingPool,
      ratio,
      unitsAt5000,
      allocationsPerSecond,
      waiting,
      waitingRatio,
      nodeSet,
      aimsMet: {
        ratio: ratio <= CAPACITY.aims.ratio,
        unitsAt5000: unitsAt5000 <= CAPACITY.aims.unitsAt5000,
        allocationsPerSecond: allocationsPerSecond >= CAPACITY.aims.allocationsPerSecond,
        waitingRatio: waitingRatio <= CAPACITY.aims.waitingRatio,
        counterWrites: nodeSet.counterWrites <= CAPACITY.aims.counterWrites,
      },
    };
  } finally {
    await fx.close();
  }
}

/** The summary rows, with the figure names the issue asks for. */
export function capacitySummary(c: CapacityFigures) {
  const [small, large] = c.pool as [CapacityCase, CapacityCase];
  return [
    {
      figure: 'write capacity units per allocation, 5,000 vs 20 live nodes',
      measured: `${c.ratio.toFixed(2)} (${large.allocation.write} / ${small.allocation.write})`,
      aim: `<= ${CAPACITY.aims.ratio}`,
      met: yesNo(c.aimsMet.ratio),
    },
    {
      figure: 'write capacity units per allocation at 5,000 live nodes',
      measured: String(c.unitsAt5000),
      aim: `<= ${CAPACITY.aims.unitsAt5000}`,
      met: yesNo(c.aimsMet.unitsAt5000),
    },
    {
      figure: 'allocations per second one pool sustains under DynamoDB per-item limits',
      measured: `${c.allocationsPerSecond} (hottest item: ${large.allocation.hottestItem} WCU per allocation)`,
      aim: `>= ${CAPACITY.aims.allocationsPerSecond}`,
      met: yesNo(c.aimsMet.allocationsPerSecond),
    },
    ...issue24Summary(c),
  ];
}

/** Issue 24's rows, when the figures have them. */
function issue24Summary(c: CapacityFigures) {
  const [few, many] = c.waiting ?? [];
  const rows = [];
  if (few && many && c.waitingRatio !== undefined) {
    rows.push({
      figure: `read units per delivery at ${few.waiting} vs ${many.waiting.toLocaleString('en-US')} waiting`,
      measured: `${c.waitingRatio.toFixed(2)} (${many.readUnits} / ${few.readUnits})`,
      aim: `<= ${CAPACITY.aims.waitingRatio}`,
      met: yesNo(c.waitingRatio <= CAPACITY.aims.waitingRatio),
    });
  }
  if (c.nodeSet) {
    rows.push({
      figure: `counter writes per allocation of a ${c.nodeSet.nodes}-node set`,
      measured: `${c.nodeSet.counterWrites} (${c.nodeSet.counterWriteUnits} WCU)`,
      aim: `<= ${CAPACITY.aims.counterWrites}`,
      met: yesNo(c.nodeSet.counterWrites <= CAPACITY.aims.counterWrites),
    });
  }
  return rows;
}

export function capacityReport(c: CapacityFigures): string {
  const rows = (cases: readonly CapacityCase[], what: string) =>
    cases.map((k) => [
      `${what} ${k.held}`,
      `${k.allocation.write}`,
      `${k.allocation.read}`,
      `${k.allocation.hottestItem}`,
      `${k.release.write}`,
      `${k.release.read}`,
      `${k.release.hottestItem}`,
    ]);
  const waiting = (c.waiting ?? []).map((w) => [`${w.waiting}`, `${w.readUnits}`, `${w.readCalls}`]);
  const more = [
    waiting.length > 0
      ? `\n\nA delivery in a capped pool (a one-node request placed at once; mean of ${CAPACITY.waiting.samples})\n${table(
          waiting,
          ['requests waiting', 'read units', 'read calls'],
        )}`
      : '',
    c.nodeSet
      ? `\n\nAllocation of a ${c.nodeSet.nodes}-node set (mean of ${CAPACITY.nodeSet.samples}): ${c.nodeSet.counterWrites} writes of the pool's counter item (${c.nodeSet.counterWriteUnits} WCU), ${c.nodeSet.allocationWriteUnits} WCU in all`
      : '',
  ].join('');
  return `Capacity units (ConsumedCapacity, per operation, mean of ${CAPACITY.samples})\n${table(
    [...rows(c.pool, 'pool: live nodes'), ...rows(c.backingPool, 'backing pool: backing nodes')],
    [
      'case',
      'alloc WCU',
      'alloc RCU',
      'alloc hottest item WCU',
      'release WCU',
      'release RCU',
      'release hottest WCU',
    ],
  )}${more}`;
}

// `tsx bench/capacity.ts`: this part alone, printed.
if (import.meta.url === `file://${process.argv[1]}`) {
  const figures = await measureCapacity((line) => process.stderr.write(`${line}\n`));
  console.log(capacityReport(figures));
  for (const r of capacitySummary(figures))
    console.log(`${r.figure}: ${r.measured} (aim ${r.aim}: ${r.met})`);
}
