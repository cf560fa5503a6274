import {
  type DurationEstimate,
  type Expected,
  expectedOf,
  keptSeconds,
  withDuration,
} from '../core/estimates.ts';
import { isSpareRequestId } from '../core/minReady.ts';
import type { PoolStore } from '../core/poolStore.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import { type Context, learnsDurations } from './context.ts';

/**
 * Learned duration estimates (core/estimates.ts) in the table: read when a node without a hint is placed,
 * written when a node is released.
 *
 * Reads go through a small cache per store (one per function instance), kept ESTIMATE_CACHE_MS: estimates
 * move slowly, and an allocation should not pay two more reads. A release updates the label's estimate
 * and, when the request named its requestor, the requestor's, each with a version-checked write from the
 * cached item (a conflict re-reads and tries again, MAX_LEARN_TRIES in all, then the duration is not
 * learned: the estimate is a tendency, not a ledger, and a release must not wait on it).
 */
export const ESTIMATE_CACHE_MS = 60_000;
export const MAX_LEARN_TRIES = 3;

interface Cached {
  readonly estimate: DurationEstimate | undefined;
  readonly readAt: number;
}

const caches = new WeakMap<PoolStore, Map<string, Cached>>();

function cacheOf(store: PoolStore): Map<string, Cached> {
  let cache = caches.get(store);
  if (!cache) {
    cache = new Map();
    caches.set(store, cache);
  }
  return cache;
}

const keyOf = (label: string, requestor?: string) =>
  requestor === undefined ? label : `${label}\n${requestor}`;

async function read(ctx: Context, label: string, requestor: string | undefined, fresh: boolean) {
  const cache = cacheOf(ctx.store);
  const key = keyOf(label, requestor);
  const now = ctx.clock.now();
  const hit = cache.get(key);
  if (!fresh && hit && now - hit.readAt < ESTIMATE_CACHE_MS) return hit.estimate;
  const estimate = await ctx.store.getEstimate(label, requestor);
  cache.set(key, { estimate, readAt: now });
  return estimate;
}

/**
 * The expected duration of a node of `label` for `requestor` when its request gave none (core/estimates.ts,
 * expectedOf), or undefined while too little is known. Best effort: a failed read is no estimate.
 */
export async function learnedDuration(
  ctx: Context,
  label: string,
  requestor: string | undefined,
): Promise<Expected | undefined> {
  try {
    const [all, own] = await Promise.all([
      read(ctx, label, undefined, false),
      requestor === undefined ? undefined : read(ctx, label, requestor, false),
    ]);
    return expectedOf(all, own);
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
export async function learnDuration(ctx: Context, request: RequestRecord, node: NodeRecord): Promise<void> {
  const seconds = keptSeconds(node);
  if (seconds === undefined || isSpareRequestId(request.id) || !learnsDurations(ctx)) return;
  for (const requestor of request.requestor === undefined ? [undefined] : [undefined, request.requestor]) {
    try {
      await learnOne(ctx, node.label, requestor, seconds);
    } catch (err) {
      ctx.log.warn('could not learn a node duration', { label: node.label, error: (err as Error).message });
    }
  }
}

async function learnOne(ctx: Context, label: string, requestor: string | undefined, seconds: number) {
  const cache = cacheOf(ctx.store);
  for (let attempt = 0; attempt < MAX_LEARN_TRIES; attempt++) {
    const prev = await read(ctx, label, requestor, attempt > 0);
    const next = withDuration(
      prev,
      { label, ...(requestor === undefined ? {} : { requestor }) },
      seconds,
      ctx.clock.now(),
    );
    if (await ctx.store.putEstimate(next)) {
      cache.set(keyOf(label, requestor), { estimate: next, readAt: ctx.clock.now() });
      return;
    }
  }
  ctx.log.debug('a duration was not learned: the estimate kept changing under us', { label });
}
