/**
 * Conditional-check conflicts per allocation under contention: rounds of concurrent `requestNodes`
 * calls (the request handler's use case, called directly) against a pool of ready backing nodes with
 * free slots, pre-created as records (no provider, no processes). Every ConditionalCheckFailedException
 * DynamoDB answers is counted by SDK middleware (bench/storeFixture.ts), per claimant too, so the
 * report can say which item the conflicts were on and which candidate every claimant tried first.
 * Everything is released between rounds (not counted).
 *
 * Then a model (bench-only, no core code changed): the same claim loop as placeNode's claimOn
 * (fullest first, conditional write, re-read on conflict, next candidate when it is full), but each
 * claimant starts at one of the top-k candidates chosen by a hash of its node id. k = 1 is the
 * current order, as a check that the model reproduces the real figure.
 */
import { createHash } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { compareCandidates, isClaimable, withClaimedSlot } from '../shared/core/backing.ts';
import { ConflictError } from '../shared/core/errors.ts';
import { nodeId } from '../shared/core/ids.ts';
import type { MetastaticLabel, MetastaticPool, ResolvedConfig } from '../shared/core/model.ts';
import type { BackingRecord } from '../shared/core/records.ts';
import { MAX_CONFLICT_RETRIES } from '../shared/usecases/conflicts.ts';
import type { Context } from '../shared/usecases/context.ts';
import { giveBackSlot } from '../shared/usecases/place/backingNodes.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import { poolConfig, smallNode } from '../testkit/configs.ts';
import { fmtMs, readyBacking, round, type Summary, summarize, table } from './common.ts';
import { type Claimant, InstrumentedStore, newClaimant } from './storeFixture.ts';

export const CONTENTION = {
  rounds: 20,
  concurrency: 16,
  backingNodes: 8,
  slots: 8,
  /** Rounds of each model variant (claims only). */
  modelRounds: 6,
  modelTopK: [1, 4, 8],
  aim: 0.5,
} as const;

const LABEL = 'small-node';
/** placeNode's page size (placement.ts CANDIDATES_PER_QUERY). */
const CANDIDATES_PER_QUERY = 10;

export const contentionConfigYaml = (slots: number) =>
  poolConfig({
    meta: { labels: [smallNode({ name: LABEL, 'max-parallel-jobs': slots, 'grace-time': 86400 })] },
  });

export interface ModelFigures {
  readonly topK: number;
  readonly allocations: number;
  readonly conflicts: number;
  readonly conflictsPerAllocation: number;
  readonly distinctFirstTargetsPerRound: number;
  /** Distinct backing nodes the round's claims landed on (mean): the packing cost of spreading. */
  readonly distinctLandedPerRound: number;
}

export interface ContentionFigures {
  readonly rounds: number;
  readonly concurrency: number;
  readonly backingNodes: number;
  readonly slotsPerBackingNode: number;
  /** Slots held by filler nodes at the start of every round, per backing node. */
  readonly fillerUsed: number[];
  readonly attempts: number;
  readonly allocations: number;
  readonly conflicts: number;
  readonly conflictsPerAllocation: number;
  /** Conflicts by `<command> <item kind>`. */
  readonly conflictsByTarget: Record<string, number>;
  /** Mean DynamoDB calls per successful allocation under contention (3 without contention). */
  readonly callsPerAllocation: number;
  readonly callsByCommand: Record<string, number>;
  /** Claimants whose first claim went to the round's most tried first candidate. */
  readonly sameFirstTargetShare: number;
  /** Distinct backing nodes tried first in a round (mean over rounds). */
  readonly distinctFirstTargetsPerRound: number;
  /** Distinct backing nodes the round's allocations landed on (mean over rounds). */
  readonly distinctLandedPerRound: number;
  /** Conflicts of one allocation: median / p90 and the maximum. */
  readonly conflictsPerClaimant: Summary;
  readonly maxConflictsOneClaimant: number;
  /** Wall time of a round of concurrent allocations, ms. */
  readonly roundMs: Summary;
  readonly launches: number;
  readonly aim: number;
  readonly aimMet: boolean;
  readonly model: ModelFigures[];
}

const fillerUsed = (i: number, n: number) => Math.floor((n - 1 - i) / 2) % CONTENTION.slots;

/** Seeds the backing nodes: ready, some slots held by fillers (3, 3, 2, 2, 1, 1, 0, 0 for 8 nodes). */
async function seed(ctx: Context, pool: MetastaticPool): Promise<number[]> {
  const used: number[] = [];
  const t0 = Date.now() - 3_600_000;
  for (let i = 0; i < CONTENTION.backingNodes; i++) {
    used.push(fillerUsed(i, CONTENTION.backingNodes));
    await ctx.store.createBacking(
      readyBacking({
        id: `bench-contention-${String(i).padStart(2, '0')}`,
        poolKey: pool.key,
        label: LABEL,
        backingPoolKey: 'local/main',
        backingLabel: 'large-node',
        slots: CONTENTION.slots,
        used: used[i] as number,
        launchedAt: t0 + i * 1000,
      }),
    );
  }
  return used;
}

function firstTargets(claimants: readonly Claimant[]): { top: number; distinct: number } {
  const counts = new Map<string, number>();
  for (const c of claimants) {
    const first = c.backingWrites[0];
    if (first) counts.set(first, (counts.get(first) ?? 0) + 1);
  }
  return { top: Math.max(0, ...counts.values()), distinct: counts.size };
}

function hash32(s: string): number {
  return createHash('sha1').update(s).digest().readUInt32BE(0);
}

/**
 * The model's claim: claimOn's loop (conditional write; on conflict re-read and retry the same
 * candidate; when it is no longer claimable, the next one), starting at one of the top-k candidates
 * picked by a hash of the node id. Returns the backing node claimed.
 */
async function modelClaim(
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  node: string,
  topK: number,
): Promise<string | undefined> {
  const { items } = await ctx.store.findCandidates(pool.key, label.name, CANDIDATES_PER_QUERY);
  const sorted = items.sort(compareCandidates);
  const top = Math.min(topK, sorted.length);
  const start = top > 0 ? hash32(node) % top : 0;
  const order = [...sorted.slice(start, top), ...sorted.slice(0, start), ...sorted.slice(top)];
  for (const candidate of order) {
    let b: BackingRecord | undefined = candidate;
    for (let i = 0; i < MAX_CONFLICT_RETRIES && b; i++) {
      const now = ctx.clock.now();
      if (!isClaimable(b, now)) break;
      const { next } = withClaimedSlot(b, node, now, node);
      try {
        await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
        return b.id;
      } catch (err) {
        if (!(err instanceof ConflictError)) throw err;
        b = await ctx.store.getBacking(b.id);
      }
    }
  }
  return undefined;
}

async function runModel(
  fx: InstrumentedStore,
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  topK: number,
): Promise<ModelFigures> {
  let allocations = 0;
  let conflicts = 0;
  const distinct: number[] = [];
  const landedOn: number[] = [];
  for (let r = 0; r < CONTENTION.modelRounds; r++) {
    const claimants = Array.from({ length: CONTENTION.concurrency }, (_, i) =>
      newClaimant(nodeId(`model-k${topK}-${r}-${i}`, 0)),
    );
    fx.counting = true;
    const landed = await Promise.all(
      claimants.map((c) => fx.scope.run(c, () => modelClaim(ctx, pool, label, c.id, topK))),
    );
    fx.counting = false;
    for (const c of claimants) conflicts += c.conflicts;
    distinct.push(firstTargets(claimants).distinct);
    landedOn.push(new Set(landed.filter((b) => b !== undefined)).size);
    for (const [i, backingId] of landed.entries()) {
      if (!backingId) continue;
      allocations++;
      await giveBackSlot(ctx, backingId, (claimants[i] as Claimant).id);
    }
  }
  return {
    topK,
    allocations,
    conflicts,
    conflictsPerAllocation: round(conflicts / Math.max(1, allocations), 2),
    distinctFirstTargetsPerRound: round(distinct.reduce((a, b) => a + b, 0) / distinct.length, 2),
    distinctLandedPerRound: round(landedOn.reduce((a, b) => a + b, 0) / landedOn.length, 2),
  };
}

export async function measureContention(progress: (line: string) => void): Promise<ContentionFigures> {
  const fx = await InstrumentedStore.start();
  try {
    const config: ResolvedConfig = parseConfigOrThrow(contentionConfigYaml(CONTENTION.slots), 'bench.yaml');
    const pool = config.metastaticPools[0] as MetastaticPool;
    const label = pool.labels.get(LABEL) as MetastaticLabel;
    const ctx = fx.context(await fx.store('bench-contention'), config);
    const used = await seed(ctx, pool);

    progress(
      `contention: ${CONTENTION.rounds} rounds x ${CONTENTION.concurrency} concurrent requestNodes on ` +
        `${CONTENTION.backingNodes} ready backing nodes x ${CONTENTION.slots} slots...`,
    );
    const all: Claimant[] = [];
    const roundMs: number[] = [];
    let attempts = 0;
    let sameFirst = 0;
    const distinctFirst: number[] = [];
    const distinctLanded: number[] = [];
    fx.resetCounts();
    for (let r = 0; r < CONTENTION.rounds; r++) {
      const claimants = Array.from({ length: CONTENTION.concurrency }, (_, i) =>
        newClaimant(`contention-${r}-${i}`),
      );
      attempts += claimants.length;
      fx.counting = true;
      const t0 = performance.now();
      const outcomes = await Promise.all(
        claimants.map((c) =>
          fx.scope.run(c, () => requestNodes(ctx, { kind: 'request', id: c.id, labels: [LABEL] })),
        ),
      );
      roundMs.push(performance.now() - t0);
      fx.counting = false;
      const { top, distinct } = firstTargets(claimants);
      sameFirst += top;
      distinctFirst.push(distinct);
      const landed = new Set<string>();
      for (const [i, o] of outcomes.entries()) {
        const c = claimants[i] as Claimant;
        if (o.kind === 'placed' && o.request.state === 'fulfilled') {
          all.push(c);
          landed.add(o.request.nodes[0]?.backingNodeId ?? '');
        }
        for (const n of o.request.nodes) {
          if (n.state === 'ready' || n.state === 'pending') await releaseNode(ctx, n.id);
        }
      }
      distinctLanded.push(landed.size);
    }
    const conflicts = [...fx.conflicts.values()].reduce((a, b) => a + b, 0);
    const allocations = all.length;
    const calls = [...fx.calls.values()].reduce((a, b) => a + b, 0);
    const perClaimant = all.map((c) => c.conflicts);
    const conflictsPerAllocation = round(conflicts / Math.max(1, allocations), 2);
    const callsByCommand = Object.fromEntries(
      [...fx.calls.entries()].sort().map(([k, v]) => [k, round(v / Math.max(1, allocations), 2)]),
    );
    const conflictsByTarget = Object.fromEntries([...fx.conflicts.entries()].sort());

    const model: ModelFigures[] = [];
    for (const k of CONTENTION.modelTopK) {
      progress(`contention model: claims spread over the top ${k} candidate(s) by node-id hash...`);
      fx.resetCounts();
      model.push(await runModel(fx, ctx, pool, label, k));
    }
    const mean = (xs: readonly number[]) => round(xs.reduce((a, b) => a + b, 0) / xs.length, 2);
    return {
      rounds: CONTENTION.rounds,
      concurrency: CONTENTION.concurrency,
      backingNodes: CONTENTION.backingNodes,
      slotsPerBackingNode: CONTENTION.slots,
      fillerUsed: used,
      attempts,
      allocations,
      conflicts,
      conflictsPerAllocation,
      conflictsByTarget,
      callsPerAllocation: round(calls / Math.max(1, allocations), 2),
      callsByCommand,
      sameFirstTargetShare: round(sameFirst / attempts, 3),
      distinctFirstTargetsPerRound: mean(distinctFirst),
      distinctLandedPerRound: mean(distinctLanded),
      conflictsPerClaimant: summarize(perClaimant),
      maxConflictsOneClaimant: Math.max(0, ...perClaimant),
      roundMs: summarize(roundMs),
      launches: fx.launches,
      aim: CONTENTION.aim,
      aimMet: conflictsPerAllocation <= CONTENTION.aim,
      model,
    };
  } finally {
    await fx.close();
  }
}

export function contentionReport(f: ContentionFigures): string {
  const rows: string[][] = [
    ['allocations (successful / attempted)', `${f.allocations} / ${f.attempts}`, '', ''],
    ['ConditionalCheckFailedException responses', String(f.conflicts), '', ''],
    ...Object.entries(f.conflictsByTarget).map(([target, n]) => [`  on ${target}`, String(n), '', '']),
    ['conflicts per allocation', f.conflictsPerAllocation.toFixed(2), `<= ${f.aim}`, f.aimMet ? 'yes' : 'NO'],
    [
      '  per claimant: median / p90 / max',
      `${f.conflictsPerClaimant.median} / ${f.conflictsPerClaimant.p90} / ${f.maxConflictsOneClaimant}`,
      '',
      '',
    ],
    [
      'claimants whose first claim hit the same candidate',
      `${(f.sameFirstTargetShare * 100).toFixed(1)} %`,
      '',
      '',
    ],
    ['distinct candidates tried first, per round', f.distinctFirstTargetsPerRound.toFixed(2), '', ''],
    ['distinct backing nodes landed on, per round', f.distinctLandedPerRound.toFixed(2), '', ''],
    [
      'DynamoDB calls per allocation under contention',
      `${f.callsPerAllocation.toFixed(2)} (${Object.entries(f.callsByCommand)
        .map(([c, n]) => `${c} ${n}`)
        .join(', ')})`,
      '',
      '',
    ],
    ['round of concurrent allocations, ms (median / p90)', fmtMs(f.roundMs), '', ''],
    ['launches asked of the provider', String(f.launches), '', ''],
  ];
  const modelRows = f.model.map((m) => [
    m.topK === 1 ? 'top-1 = fullest first (model of placeNode)' : `top-${m.topK} by hash of the node id`,
    m.conflictsPerAllocation.toFixed(2),
    m.distinctFirstTargetsPerRound.toFixed(2),
    m.distinctLandedPerRound.toFixed(2),
    `${m.allocations}`,
  ]);
  return [
    `Conditional-check conflicts at ${f.concurrency}-way contention (${f.rounds} rounds x ${f.concurrency} concurrent ` +
      `requestNodes; ${f.backingNodes} ready backing nodes x ${f.slotsPerBackingNode} slots, ${f.fillerUsed.join('/')} held by fillers)`,
    table(rows, ['', 'measured', 'aim', 'met']),
    '',
    `Model (bench-only claim loop, no request writes; ${CONTENTION.modelRounds} rounds x ${f.concurrency} each): where each claimant starts`,
    table(modelRows, [
      'first candidate',
      'conflicts/allocation',
      'distinct first',
      'distinct landed',
      'allocations',
    ]),
  ].join('\n');
}
