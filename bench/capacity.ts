/**
 * What DynamoDB would bill for an allocation and a release, and what one pool's hottest item allows
 * (issue 12): the real use cases (`requestNodes` on the warm path, `releaseNode`) against dynalite, which
 * reports ConsumedCapacity as DynamoDB computes it (per started KB of the larger of the item before and
 * after). A pool with max-servers 10,000 holds 20, then 5,000 live nodes' places (reserved through the
 * store); each sample allocates one node on a ready backing node with a free slot and releases it.
 * Separately, the backing pool's cap: taking and giving back one backing node's place with 20 and 2,000
 * backing nodes held.
 *
 * Units are summed over every call of a sample (reads: GetItem, Query; writes: PutItem, UpdateItem,
 * DeleteItem, counting the ones whose condition failed, which DynamoDB bills too) and per item written,
 * to find the hottest item: DynamoDB allows about 1,000 write units per second on one item.
 */
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { nodeId, ownerToken } from '../shared/core/ids.ts';
import type { DynamoStore } from '../shared/store/dynamoStore.ts';
import { releaseNode } from '../shared/usecases/release.ts';
import { requestNodes } from '../shared/usecases/requestNodes.ts';
import { largeNode, poolConfig, smallNode } from '../testkit/configs.ts';
import { readyBacking, round, table, yesNo } from './common.ts';
import { InstrumentedStore } from './storeFixture.ts';

export const CAPACITY = {
  liveNodes: [20, 5_000] as const,
  backingNodes: [20, 2_000] as const,
  maxServers: 10_000,
  slots: 8,
  samples: 20,
  /** Places reserved per store call while filling (a node set at most 64). */
  fillBatch: 50,
  /** DynamoDB's write throughput on one item, units per second. */
  itemWriteUnitsPerSecond: 1_000,
  aims: { ratio: 1.2, unitsAt5000: 8, allocationsPerSecond: 200 },
} as const;

const POOL = 'meta/main';
const BACKING_POOL = 'local/main';
const LABEL = 'small-node';

interface Units {
  read: number;
  write: number;
  /** Write units per item (`pk sk`). */
  readonly byItem: Map<string, number>;
}

export interface CapacityCase {
  readonly held: number;
  /** Per warm allocation, averaged over the samples. */
  readonly allocation: { readonly read: number; readonly write: number; readonly hottestItem: number };
  readonly release: { readonly read: number; readonly write: number; readonly hottestItem: number };
}

export interface CapacityFigures {
  readonly pool: readonly CapacityCase[];
  readonly backingPool: readonly CapacityCase[];
  readonly ratio: number;
  readonly unitsAt5000: number;
  readonly allocationsPerSecond: number;
  readonly aimsMet: {
    readonly ratio: boolean;
    readonly unitsAt5000: boolean;
    readonly allocationsPerSecond: boolean;
  };
}

/** Counts consumed capacity on the fixture's client while `work` runs. */
async function metered(fx: InstrumentedStore, work: () => Promise<unknown>): Promise<Units> {
  const units: Units = { read: 0, write: 0, byItem: new Map() };
  const name = `consumed-${Math.random()}`;
  fx.client.middlewareStack.add(
    (next, context) => async (args) => {
      const input = args.input as Record<string, unknown>;
      input.ReturnConsumedCapacity = 'TOTAL';
      const out = await next(args).catch((err: unknown) => {
        // A failed condition is billed as a write of the item (DynamoDB); dynalite does not report it.
        if ((err as Error).name === 'ConditionalCheckFailedException') units.write += 1;
        throw err;
      });
      const consumed = (out.output as { ConsumedCapacity?: { CapacityUnits?: number } }).ConsumedCapacity;
      const cu = consumed?.CapacityUnits ?? 0;
      const command = context.commandName ?? '';
      if (/Get|Query|Scan/.test(command)) units.read += cu;
      else {
        units.write += cu;
        const key = (input.Key ?? input.Item) as { pk?: unknown; sk?: unknown } | undefined;
        const item = `${JSON.stringify(key?.pk)} ${JSON.stringify(key?.sk)}`;
        units.byItem.set(item, (units.byItem.get(item) ?? 0) + cu);
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

async function fill(
  store: DynamoStore,
  held: number,
  reserve: (members: string[], owner: string) => Promise<unknown>,
) {
  const owner = ownerToken(Date.now());
  for (let i = 0; i < held; i += CAPACITY.fillBatch) {
    const members = Array.from({ length: Math.min(CAPACITY.fillBatch, held - i) }, (_, j) =>
      nodeId(`live-${i + j}`, 0),
    );
    await reserve(members, owner);
  }
  void store;
}

async function poolCase(fx: InstrumentedStore, held: number): Promise<CapacityCase> {
  const store = await fx.store(`capacity-pool-${held}`);
  const config = parseConfigOrThrow(
    poolConfig({
      backing: { labels: [largeNode()] },
      meta: {
        pool: { 'max-servers': CAPACITY.maxServers },
        labels: [smallNode({ 'max-parallel-jobs': CAPACITY.slots, 'grace-time': 86_400 })],
      },
    }),
    'capacity.yaml',
  );
  const ctx = fx.context(store, config);
  await fill(store, held, (members, owner) =>
    store.reserveNodePlaces(POOL, members, CAPACITY.maxServers, owner),
  );
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
  await fill(store, held, async (members, owner) => {
    for (const m of members) await store.reserveBackingPlace(BACKING_POOL, m, CAPACITY.maxServers, owner);
  });
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
      aimsMet: {
        ratio: ratio <= CAPACITY.aims.ratio,
        unitsAt5000: unitsAt5000 <= CAPACITY.aims.unitsAt5000,
        allocationsPerSecond: allocationsPerSecond >= CAPACITY.aims.allocationsPerSecond,
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
  ];
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
  )}`;
}

// `tsx bench/capacity.ts`: this part alone, printed.
if (import.meta.url === `file://${process.argv[1]}`) {
  const figures = await measureCapacity((line) => process.stderr.write(`${line}\n`));
  console.log(capacityReport(figures));
  for (const r of capacitySummary(figures))
    console.log(`${r.figure}: ${r.measured} (aim ${r.aim}: ${r.met})`);
}
