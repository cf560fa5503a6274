import { compareCandidates, isClaimable } from '../../core/backing.ts';
import type { MetastaticPool } from '../../core/model.ts';
import type { BackingPort, Page } from '../../core/poolStore.ts';
import type { BackingRecord } from '../../core/records.ts';
import type { Context } from '../context.ts';

/** How many candidates one Query brings back; the first claimable one almost always wins. */
export const CANDIDATES_PER_QUERY = 10;

/**
 * How long the backing node a placement of this process just wrote is offered to the next placement of
 * the same label as its first candidate, before any Query: what a step already read is carried to the
 * next, not read again. The record is the claim's own answer (`ReturnValues: ALL_NEW`), so it is as fresh
 * as a consistent read, fresher than the `free` index, which is eventually consistent; what another
 * process did since shows up as a claim refused by its condition, and the placement then asks the index
 * as it would have.
 */
export const CLAIMED_REUSE_MS = 5_000;

/** A page of candidates; `remembered` when it is the backing node of the last placement (no Query). */
export interface Candidates extends Page<BackingRecord> {
  readonly remembered?: boolean;
}

interface Remembered {
  readonly record: BackingRecord;
  readonly at: number;
}

/** Per store (a process may hold several: tests, benchmarks), per pool and label. */
const rememberedByStore = new WeakMap<object, Map<string, Remembered>>();

const keyOf = (poolKey: string, label: string) => `${poolKey}#${label}`;

/**
 * Notes where a placement of `label` just went (the backing node as the claim or launch left it): the
 * next placement of the label in this process tries it first while it has a free slot, for
 * CLAIMED_REUSE_MS. A backing node with no free slot left is forgotten.
 */
export function rememberPlacement(
  ctx: Context<BackingPort>,
  pool: MetastaticPool,
  label: string,
  record: BackingRecord,
): void {
  let byKey = rememberedByStore.get(ctx.store);
  if (!byKey) {
    byKey = new Map();
    rememberedByStore.set(ctx.store, byKey);
  }
  const now = ctx.clock.now();
  if (isClaimable(record, now)) byKey.set(keyOf(pool.key, label), { record, at: now });
  else byKey.delete(keyOf(pool.key, label));
}

/**
 * A slot this process just freed on `record` (as the write left it): when that makes it fuller than the
 * remembered backing node of its label (a full one, now with a free slot), it is remembered instead, so
 * that fullest first still holds for what this process saw. Nothing is remembered from a release alone:
 * a placement of the label asks the index first.
 */
export function noteFreedSlot(ctx: Context<BackingPort>, record: BackingRecord): void {
  const byKey = rememberedByStore.get(ctx.store);
  const key = keyOf(record.poolKey, record.label);
  const seen = byKey?.get(key);
  const now = ctx.clock.now();
  if (!byKey || !seen || now - seen.at >= CLAIMED_REUSE_MS) return;
  if (seen.record.id === record.id || compareCandidates(record, seen.record) < 0) {
    if (isClaimable(record, now)) byKey.set(key, { record, at: now });
  }
}

/** Forgets the remembered backing node of a label (a claim on it was refused: it changed elsewhere). */
export function forgetPlacement(ctx: Context<BackingPort>, pool: MetastaticPool, label: string): void {
  rememberedByStore.get(ctx.store)?.delete(keyOf(pool.key, label));
}

/** The remembered backing node of a label as a one-candidate page, while recent and claimable. */
export function rememberedCandidates(
  ctx: Context<BackingPort>,
  pool: MetastaticPool,
  label: string,
): Candidates | undefined {
  const seen = rememberedByStore.get(ctx.store)?.get(keyOf(pool.key, label));
  if (!seen) return undefined;
  const now = ctx.clock.now();
  if (now - seen.at >= CLAIMED_REUSE_MS || !isClaimable(seen.record, now)) {
    forgetPlacement(ctx, pool, label);
    return undefined;
  }
  return { items: [seen.record], remembered: true };
}

/**
 * Asks for the first page of a label's candidates now, for a placeNode that comes after something else (a
 * capped pool's reservation): the Query goes out with that work, not after it, one round trip less in
 * sequence. Read-only, so a reservation that finds the pool full wastes one Query, nothing else. A
 * failure is left to placeNode's own Query (undefined), which reports it if it persists. The backing node
 * of this process's last placement of the label, if recent, is the page, with no Query (placeNode asks
 * the index instead when it orders candidates otherwise than fullest first).
 */
export function prefetchCandidates(
  ctx: Context<BackingPort>,
  pool: MetastaticPool,
  label: string,
): Promise<Candidates | undefined> {
  const remembered = rememberedCandidates(ctx, pool, label);
  if (remembered) return Promise.resolve(remembered);
  return ctx.store.findCandidates(pool.key, label, CANDIDATES_PER_QUERY).catch(() => undefined);
}
