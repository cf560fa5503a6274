import {
  anonymousPart,
  type DurationEstimate,
  type Expected,
  expectedOf,
  isExpired,
  keptSeconds,
  type Taught,
  withDurations,
} from '../../core/estimates.ts';
import { isSpareRequestId } from '../../core/minReady.ts';
import type { ReadinessPort } from '../../core/poolStore.ts';
import type { NodeRecord, RequestRecord } from '../../core/records.ts';
import { type Context, learnsDurations } from '../context.ts';

/**
 * Learned duration estimates (core/estimates.ts) in the table: read when a node without a hint is placed,
 * written when a node is released.
 *
 * Reads for placement go through a small cache per store (one per function instance), kept
 * ESTIMATE_CACHE_MS: estimates move slowly, and an allocation should not pay two more reads.
 *
 * A release adds its duration to the estimate's buffer in this instance (the label's, and the
 * requestor's when the request named one). An instance writes an estimate at most once per
 * ESTIMATE_WRITE_INTERVAL_MS, the first duration after a quiet interval at once: it reads the item
 * (consistent read), folds every buffered duration into it and writes it conditional on the version it
 * read; a conflict reads and tries again, MAX_LEARN_TRIES in all, then the durations wait for the next
 * write. So a write is never made from a copy another instance has moved past, and an item takes at
 * most one write per instance and interval whatever the rate of releases (the request function's
 * concurrency bounds the instances): no hot item. Durations still buffered when an instance is retired
 * are lost: the estimate is a tendency, not a ledger, and a release must not wait on it.
 */
export const ESTIMATE_CACHE_MS = 60_000;
export const ESTIMATE_WRITE_INTERVAL_MS = 60_000;
export const MAX_LEARN_TRIES = 3;
/** Estimates an instance keeps in memory (cached reads and buffers), at most: the least recently used go. */
const MAX_KEPT = 1_000;
/** Durations one estimate's buffer holds, at most (the latest). */
const MAX_BUFFERED = 1_000;

/** What an instance keeps of one estimate (label, or label and requestor). */
interface Kept {
  /** As last read or written, and when (the cache). */
  estimate?: DurationEstimate | undefined;
  readAt?: number;
  /** Durations not written yet (and who taught each), and when this instance last began writing them. */
  readonly pending: Taught[];
  lastWriteAt?: number;
  writing: boolean;
}

const kept = new WeakMap<ReadinessPort, Map<string, Kept>>();

/** The estimate's entry, made the most recently used; the least recently used go beyond MAX_KEPT. */
function keptOf(store: ReadinessPort, key: string): Kept {
  let entries = kept.get(store);
  if (!entries) {
    entries = new Map();
    kept.set(store, entries);
  }
  const entry = entries.get(key) ?? { pending: [], writing: false };
  entries.delete(key);
  entries.set(key, entry);
  for (const [oldest, e] of entries) {
    if (entries.size <= MAX_KEPT) break;
    if (!e.writing) entries.delete(oldest);
  }
  return entry;
}

/** How many estimates the instance using `store` keeps in memory (bounded by MAX_KEPT). */
export function cachedEstimates(store: ReadinessPort): number {
  return kept.get(store)?.size ?? 0;
}

const keyOf = (label: string, requestor?: string) =>
  requestor === undefined ? label : `${label}\n${requestor}`;

async function read(ctx: Context<ReadinessPort>, label: string, requestor: string | undefined) {
  const entry = keptOf(ctx.store, keyOf(label, requestor));
  const now = ctx.clock.now();
  if (entry.readAt === undefined || now - entry.readAt >= ESTIMATE_CACHE_MS) {
    entry.estimate = await ctx.store.getEstimate(label, requestor);
    entry.readAt = now;
  }
  return entry.estimate && !isExpired(entry.estimate, now) ? entry.estimate : undefined;
}

/**
 * The expected duration of a node of `label` for `requestor` when its request gave none (core/estimates.ts,
 * expectedOf), or undefined while too little is known. Best effort: a failed read is no estimate.
 */
export async function learnedDuration(
  ctx: Context<ReadinessPort>,
  label: string,
  requestor: string | undefined,
): Promise<Expected | undefined> {
  try {
    const [all, own] = await Promise.all([
      read(ctx, label, undefined),
      requestor === undefined ? undefined : read(ctx, label, requestor),
    ]);
    return expectedOf(all, requestor === undefined ? anonymousPart(all) : own);
  } catch (err) {
    ctx.log.warn('could not read a duration estimate; placing without one', {
      label,
      error: (err as Error).message,
    });
    return undefined;
  }
}

/**
 * Learns how long a released node was kept, when the pool learns durations (`learned-durations`). Best
 * effort and never thrown: the release is done whatever happens here. Min-ready nodes (the pool's own)
 * and nodes never ready teach nothing.
 */
export async function learnDuration(
  ctx: Context<ReadinessPort>,
  request: RequestRecord,
  node: NodeRecord,
): Promise<void> {
  const seconds = keptSeconds(node);
  if (seconds === undefined || isSpareRequestId(request.id) || !learnsDurations(ctx)) return;
  for (const requestor of request.requestor === undefined ? [undefined] : [undefined, request.requestor]) {
    try {
      await learnOne(ctx, node.label, requestor, { seconds, from: request.requestor });
    } catch (err) {
      ctx.log.warn('could not learn a node duration', { label: node.label, error: (err as Error).message });
    }
  }
}

/** Buffers a duration, and writes the estimate unless this instance wrote it within the interval. */
async function learnOne(
  ctx: Context<ReadinessPort>,
  label: string,
  requestor: string | undefined,
  taught: Taught,
) {
  const entry = keptOf(ctx.store, keyOf(label, requestor));
  entry.pending.push(taught);
  if (entry.pending.length > MAX_BUFFERED) entry.pending.shift();
  const now = ctx.clock.now();
  if (entry.writing) return; // the write under way started before this duration: the next one takes it
  if (entry.lastWriteAt !== undefined && now - entry.lastWriteAt < ESTIMATE_WRITE_INTERVAL_MS) return;
  entry.writing = true;
  entry.lastWriteAt = now;
  const durations = entry.pending.splice(0);
  const key = { label, ...(requestor === undefined ? {} : { requestor }) };
  let written = false;
  try {
    for (let attempt = 0; attempt < MAX_LEARN_TRIES && !written; attempt++) {
      const prev = await ctx.store.getEstimate(label, requestor);
      const next = withDurations(prev, key, durations, ctx.clock.now());
      if (!next) return;
      written = await ctx.store.putEstimate(next);
      if (written) {
        entry.estimate = next;
        entry.readAt = ctx.clock.now();
      }
    }
    if (!written) ctx.log.debug('durations not learned yet: the estimate kept changing under us', { label });
  } finally {
    entry.writing = false;
    // Not written (conflicts, an error): they wait for this instance's next write.
    const room = MAX_BUFFERED - entry.pending.length;
    if (!written && room > 0) entry.pending.unshift(...durations.slice(Math.max(0, durations.length - room)));
  }
}
