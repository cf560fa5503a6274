/**
 * Part 6: what min-ready costs in backing nodes, before and after the reaper keeps the spares on the
 * fullest backing nodes (issue 24, defect 4). The real use cases (keepMinReady, requestNodes, releaseNode,
 * reap) on an in-process dynalite, with the cost simulator's in-memory provider (a launch boots when the
 * benchmark says so). No timing is measured: the figure is a count of backing nodes, in one run.
 *
 * The scenario, deterministic: min-ready M on a label of S slots fills M / S backing nodes with spares.
 * M requests take them all (each runs on its spare's slot) and the pool refills every seat, on new
 * backing nodes. Then every request but one per original backing node is released: each release ends
 * the spare it took, so each original backing node runs one request with S - 1 free slots, while the
 * refilled spares sit on backing nodes that run nothing else. Counted: live backing nodes, and those
 * held only by free spares (kept running by min-ready alone), before the reaper runs and after it ran
 * (its min-ready step moves spares; a second run retires the backing nodes that emptied).
 *
 *   npx tsx bench/spares.ts      (this part alone; `npm run bench` runs it with the others)
 */
import { pathToFileURL } from 'node:url';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { ManualClock } from '../shared/core/clock.ts';
import { isFreeSpare, isSpareRequestId } from '../shared/core/minReady.ts';
import type { BackingRecord } from '../shared/core/records.ts';
import { ensureTable } from '../shared/runtime/engines.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { resourceRunning } from '../shared/usecases/ready/fulfil.ts';
import { keepMinReady } from '../shared/usecases/ready/replenish.ts';
import { reap } from '../shared/usecases/reap/reap.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import { largeNode, poolConfig, smallNode } from '../testkit/configs.ts';
import { startInProcessDynalite } from '../testkit/inProcessDynalite.ts';
import { log, round, table } from './common.ts';
import { SimProvider, simRegistry } from './cost/simProvider.ts';

export const SPARES = { minReady: 16, slots: 4 } as const;

const LABEL = 'small-node';

/** Backing nodes at one moment. */
export interface SpareCount {
  /** Launching or ready. */
  readonly live: number;
  /** Live, holding slots, every one of them a free min-ready node: kept running by min-ready alone. */
  readonly sparesOnly: number;
  /** Free min-ready nodes (the label's min-ready, when every seat is filled). */
  readonly freeSpares: number;
}

export interface SparesFigures {
  readonly minReady: number;
  readonly slots: number;
  readonly before: SpareCount;
  readonly after: SpareCount;
  /** Spares the reaper moved. */
  readonly moved: number;
  /** after.sparesOnly / before.sparesOnly. */
  readonly ratio: number;
}

export async function measureSpares(progress: (line: string) => void = () => {}): Promise<SparesFigures> {
  const { minReady, slots } = SPARES;
  progress(`min-ready ${minReady} on ${slots} slots a backing node: taking, refilling, releasing...`);
  const engine = await startInProcessDynalite();
  try {
    await ensureTable(engine.client, 'spares');
    const config = parseConfigOrThrow(
      poolConfig({
        labels: [{ name: 'large-node' }, { name: LABEL, 'min-ready': minReady }],
        backing: { labels: [largeNode()] },
        meta: { labels: [smallNode({ name: LABEL, 'max-parallel-jobs': slots, 'grace-time': 0 })] },
      }),
      'bench-spares.yaml',
    );
    const clock = new ManualClock();
    const booting: string[] = [];
    const provider = new SimProvider({ clock, bootMs: 0, schedule: (_at, id) => void booting.push(id) });
    const ctx: Context = {
      store: new DynamoStore(engine.client, 'spares', clock),
      config,
      providers: simRegistry(
        provider,
        config.backingPools.map((p) => p.key),
      ),
      clock,
      log,
    };
    const bootAll = async () => {
      for (const id of booting.splice(0)) {
        const resource = provider.boot(id);
        if (resource) await resourceRunning(ctx, resource);
      }
    };
    await keepMinReady(ctx, LABEL);
    await bootAll();
    // Every spare taken (the request function refills the seats it took from, as here).
    for (let i = 0; i < minReady; i++) {
      await requestNodes(ctx, { kind: 'request', id: `job-${i}`, labels: [LABEL] });
      await keepMinReady(ctx, LABEL);
    }
    await bootAll();
    // One request kept per original backing node; the others released (their spares end with them).
    const kept = new Set<string>();
    for (let i = 0; i < minReady; i++) {
      const node = (await ctx.store.getRequest(`job-${i}`))?.nodes[0];
      if (!node?.backingNodeId || kept.has(node.backingNodeId)) await releaseNode(ctx, `job-${i}/0`);
      else kept.add(node.backingNodeId);
    }
    const before = await countOf(ctx);
    progress('the reaper runs (it moves spares), then again (it retires what emptied)...');
    clock.advance(1_000);
    const first = await reap(ctx);
    clock.advance(1_000);
    await reap(ctx);
    const after = await countOf(ctx);
    return {
      minReady,
      slots,
      before,
      after,
      moved: first.minReadyMoved,
      ratio: round(after.sparesOnly / Math.max(1, before.sparesOnly), 2),
    };
  } finally {
    await engine.close();
  }
}

async function countOf(ctx: Context): Promise<SpareCount> {
  const free = new Set(
    (await ctx.store.listRequests())
      .filter((r) => isSpareRequestId(r.id) && isFreeSpare(r.nodes[0]))
      .map((r) => r.nodes[0]?.id),
  );
  const live = (await ctx.store.listBacking()).filter((b) => b.state === 'launching' || b.state === 'ready');
  const sparesOnly = (b: BackingRecord) => b.used > 0 && Object.values(b.slotMap).every((id) => free.has(id));
  return { live: live.length, sparesOnly: live.filter(sparesOnly).length, freeSpares: free.size };
}

export function sparesReport(f: SparesFigures): string {
  return [
    `6. min-ready ${f.minReady} on ${f.slots} slots a backing node, after takes, refills and releases (bench/spares.ts)`,
    table(
      [
        [
          'before the reaper',
          String(f.before.live),
          String(f.before.sparesOnly),
          String(f.before.freeSpares),
        ],
        [
          `after it (moved ${f.moved})`,
          String(f.after.live),
          String(f.after.sparesOnly),
          String(f.after.freeSpares),
        ],
      ],
      ['', 'live backing nodes', 'held only by min-ready nodes', 'free min-ready nodes'],
    ),
  ].join('\n');
}

export function sparesSummary(f: SparesFigures) {
  return [
    {
      figure: `backing nodes held only by min-ready nodes, after / before the reaper keeps them on the fullest (min-ready ${f.minReady}, ${f.slots} slots)`,
      measured: `${f.ratio.toFixed(2)} (${f.after.sparesOnly} / ${f.before.sparesOnly}; live ${f.after.live} / ${f.before.live})`,
      aim: '-',
      met: '-',
    },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const figures = await measureSpares((line) => console.log(line));
  console.log(sparesReport(figures));
  console.log(
    table(
      sparesSummary(figures).map((r) => [r.figure, r.measured]),
      ['figure', 'measured'],
    ),
  );
}
