/**
 * Scale: the latency of one warm-path allocation (`requestNodes`, called directly) in a pool of 2,000
 * backing nodes vs one of 20, and a control pool of 200. The pools are tables of the same in-process
 * dynalite, pre-filled with ready backing records written as the store writes them (no provider, no
 * processes): 90 % full (out of the free index, as in a busy pool) and 10 % with 7 down to 1 of 8
 * slots used.
 * Each sample is timed alone, then its node is released (not timed) so every sample sees the same
 * pool; the pools' samples are interleaved, rotating which goes first.
 *
 * The control: the 20-node pool has 2 candidates with a free slot, so its free-index Query returns 2
 * items, while the 200- and 2,000-node pools fill the Query's page of 10. 2,000 vs 200 separates the
 * size of the table from the size of the answer.
 */
import { performance } from 'node:perf_hooks';
import {
  BatchWriteCommand,
  type BatchWriteCommandInput,
  type BatchWriteCommandOutput,
  DynamoDBDocumentClient,
} from '@aws-sdk/lib-dynamodb';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import type { MetastaticPool, ResolvedConfig } from '../shared/core/model.ts';
import { backingItem } from '../shared/store/table.ts';
import type { Context } from '../shared/usecases/context.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import {
  fmtMs,
  inParallel,
  quantile,
  readyBacking,
  round,
  type Summary,
  summarize,
  table,
  yesNo,
} from './common.ts';
import { contentionConfigYaml } from './contention.ts';
import { InstrumentedStore } from './storeFixture.ts';

export const SCALE = {
  small: 20,
  control: 200,
  large: 2000,
  slots: 8,
  /** Share of backing nodes with a free slot (the rest are full). */
  freeShare: 0.1,
  warmup: 10,
  samples: 100,
  /** BatchWriteItem calls (25 items each) in flight while filling a pool. */
  fillConcurrency: 4,
  aim: 1.3,
} as const;

const LABEL = 'small-node';

export interface ScaleCase {
  readonly backingNodes: number;
  readonly withFreeSlots: number;
  readonly latencyMs: Summary;
  readonly dynamodbCallsPerAllocation: number;
  /** Time in DynamoDB per allocation, by command (median over samples of the summed time, ms). */
  readonly dynamodbMsByCommand: Record<string, number>;
  /** Candidates the free-index Query returned (mean). */
  readonly candidatesPerQuery: number;
  readonly fillSeconds: number;
}

export interface ScaleFigures {
  readonly small: ScaleCase;
  readonly control: ScaleCase;
  readonly large: ScaleCase;
  /** Median large / median small. */
  readonly ratio: number;
  /** Median large / median control (both Queries return a full page). */
  readonly ratioToControl: number;
  readonly aim: number;
  readonly aimMet: boolean;
}

interface Pool {
  readonly ctx: Context;
  readonly n: number;
  readonly free: number;
  readonly fillSeconds: number;
  readonly times: number[];
  readonly byCommand: Map<string, number[]>;
  calls: number;
  candidates: number;
  seq: number;
}

async function fill(fx: InstrumentedStore, config: ResolvedConfig, n: number): Promise<Pool> {
  const pool = config.metastaticPools[0] as MetastaticPool;
  const tableName = `bench-scale-${n}`;
  const ctx = fx.context(await fx.store(tableName), config);
  const free = Math.max(1, Math.round(n * SCALE.freeShare));
  const t0 = performance.now();
  const day = 24 * 3_600_000;
  const start = Date.now() - day;
  // Spread the nodes with free slots evenly among the full ones, with 7, 6, ..., 1, 7, 6... of 8 slots
  // used: every pool's fullest candidate (the one claimed) holds 7, so the items read and written are
  // alike in every pool and only the number of candidates differs.
  const freeEvery = n / free;
  const ids = Array.from({ length: n }, (_, i) => i);
  let j = 0;
  const used = ids.map((i) =>
    i >= j * freeEvery && j < free ? SCALE.slots - 1 - (j++ % (SCALE.slots - 1)) : SCALE.slots,
  );
  // The items exactly as the store writes them (backingItem), 25 to a BatchWriteItem: createBacking
  // one by one would take most of the benchmark's time on the 2,000.
  const items = ids.map((i) =>
    backingItem(
      readyBacking({
        id: `bench-scale-${n}-${String(i).padStart(5, '0')}`,
        poolKey: pool.key,
        label: LABEL,
        backingPoolKey: 'local/main',
        backingLabel: 'large-node',
        slots: SCALE.slots,
        used: used[i] as number,
        launchedAt: start + Math.floor((i * day) / n),
      }),
    ),
  );
  const batches = Array.from({ length: Math.ceil(n / 25) }, (_, b) => items.slice(b * 25, b * 25 + 25));
  const doc = DynamoDBDocumentClient.from(fx.client, { marshallOptions: { removeUndefinedValues: true } });
  await inParallel(batches, SCALE.fillConcurrency, async (batch) => {
    let requests: BatchWriteCommandInput['RequestItems'] = {
      [tableName]: batch.map((Item) => ({ PutRequest: { Item } })),
    };
    while (requests && Object.keys(requests).length > 0) {
      const out: BatchWriteCommandOutput = await doc.send(new BatchWriteCommand({ RequestItems: requests }));
      requests = out.UnprocessedItems;
    }
  });
  const withFree = used.filter((u) => u < SCALE.slots).length;
  return {
    ctx,
    n,
    free: withFree,
    fillSeconds: (performance.now() - t0) / 1000,
    times: [],
    byCommand: new Map(),
    calls: 0,
    candidates: 0,
    seq: 0,
  };
}

async function sample(fx: InstrumentedStore, p: Pool, keep: boolean): Promise<void> {
  const id = `scale-${p.n}-${p.seq++}`;
  const before = [...fx.calls.values()].reduce((a, b) => a + b, 0);
  const spent = new Map<string, number>();
  let candidates = 0;
  fx.onCall = (command, ms, output) => {
    spent.set(command, (spent.get(command) ?? 0) + ms);
    if (command === 'Query') candidates += (output as { Items?: unknown[] }).Items?.length ?? 0;
  };
  fx.counting = true;
  const t0 = performance.now();
  const out = await requestNodes(p.ctx, { kind: 'request', id, labels: [LABEL] });
  const t1 = performance.now();
  fx.counting = false;
  fx.onCall = undefined;
  if (out.kind !== 'placed' || out.request.state !== 'fulfilled') {
    throw new Error(`scale: request ${id} was not fulfilled at once (${out.kind}, ${out.request.state})`);
  }
  if (keep) {
    p.times.push(t1 - t0);
    p.calls += [...fx.calls.values()].reduce((a, b) => a + b, 0) - before;
    p.candidates += candidates;
    for (const [command, ms] of spent) p.byCommand.set(command, [...(p.byCommand.get(command) ?? []), ms]);
  }
  for (const n of out.request.nodes) await releaseNode(p.ctx, n.id);
}

export async function measureScale(progress: (line: string) => void): Promise<ScaleFigures> {
  const fx = await InstrumentedStore.start();
  try {
    const config = parseConfigOrThrow(contentionConfigYaml(SCALE.slots), 'bench.yaml');
    progress(
      `scale: filling pools of ${SCALE.small}, ${SCALE.control} and ${SCALE.large} ready backing nodes...`,
    );
    const small = await fill(fx, config, SCALE.small);
    const control = await fill(fx, config, SCALE.control);
    const large = await fill(fx, config, SCALE.large);
    progress(`scale: ${SCALE.warmup} + ${SCALE.samples} interleaved single allocations per pool...`);
    const pools = [small, control, large];
    for (let i = 0; i < SCALE.warmup + SCALE.samples; i++) {
      const keep = i >= SCALE.warmup;
      for (let j = 0; j < pools.length; j++) await sample(fx, pools[(i + j) % pools.length] as Pool, keep);
    }
    if (fx.launches > 0) throw new Error(`scale: ${fx.launches} launch(es) asked of the provider`);
    const result = (p: Pool): ScaleCase => ({
      backingNodes: p.n,
      withFreeSlots: p.free,
      latencyMs: summarize(p.times),
      dynamodbCallsPerAllocation: round(p.calls / p.times.length, 2),
      dynamodbMsByCommand: Object.fromEntries(
        [...p.byCommand.entries()].sort().map(([c, ms]) => [c, round(quantile(ms, 0.5), 2)]),
      ),
      candidatesPerQuery: round(p.candidates / p.times.length, 2),
      fillSeconds: round(p.fillSeconds, 2),
    });
    const ratio = round(quantile(large.times, 0.5) / quantile(small.times, 0.5), 2);
    return {
      small: result(small),
      control: result(control),
      large: result(large),
      ratio,
      ratioToControl: round(quantile(large.times, 0.5) / quantile(control.times, 0.5), 2),
      aim: SCALE.aim,
      aimMet: ratio <= SCALE.aim,
    };
  } finally {
    await fx.close();
  }
}

export function scaleReport(f: ScaleFigures): string {
  const cases = [f.small, f.control, f.large];
  const row = (label: string, pick: (c: ScaleCase) => string) => [label, ...cases.map(pick)];
  const commands = [...new Set(cases.flatMap((c) => Object.keys(c.dynamodbMsByCommand)))].sort();
  const rows: string[][] = [
    row('backing nodes with a free slot', (c) => String(c.withFreeSlots)),
    row('allocation latency, ms (median / p90)', (c) => fmtMs(c.latencyMs)),
    row('DynamoDB calls per allocation', (c) => String(c.dynamodbCallsPerAllocation)),
    ...commands.map((cmd) =>
      row(`  ms in ${cmd} (median)`, (c) => (c.dynamodbMsByCommand[cmd] ?? 0).toFixed(2)),
    ),
    row('candidates the free-index Query returned', (c) => String(c.candidatesPerQuery)),
    row('fill time, s (BatchWriteItem)', (c) => c.fillSeconds.toFixed(2)),
  ];
  return [
    `Scale: single warm-path allocations (${SCALE.samples} per pool after ${SCALE.warmup} warm-up, interleaved)`,
    table(rows, ['', ...cases.map((c) => `${c.backingNodes} backing nodes`)]),
    `ratio of medians ${f.large.backingNodes} vs ${f.small.backingNodes}: ${f.ratio.toFixed(2)} ` +
      `(aim <= ${f.aim}: ${yesNo(f.aimMet)}); ${f.large.backingNodes} vs ${f.control.backingNodes} (control): ${f.ratioToControl.toFixed(2)}`,
  ].join('\n');
}
