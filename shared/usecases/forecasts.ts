import { type ArrivalModel, withArrivals } from '../core/forecast.ts';
import type { PoolStore } from '../core/poolStore.ts';
import type { Context } from './context.ts';

/**
 * Arrival forecasts (core/forecast.ts) in the table, for labels with `min-ready: auto`: one item per
 * label (`FORECAST#<label>`), written conditionally on its version, as the duration estimates are.
 *
 * The request function counts a request when it places it (once per request: placement is one
 * conditional write, so a redelivery is not counted again), in a buffer of its instance. An instance
 * writes a label's item at most once per FORECAST_WRITE_INTERVAL_MS, the first arrival after a quiet
 * interval at once: it reads the item (consistent read), adds its count (`withArrivals`: folding the
 * minutes that ended since the last write) and writes it conditional on the version it read; a conflict
 * reads and tries again, MAX_TRIES in all, then the count waits for the next write. So an item takes at
 * most one write per instance and interval whatever the request rate (the request function's
 * concurrency bounds the instances): no hot item. The reaper folds each label once a run, so a quiet
 * label's rate decays with no request at all, and writes out its own instance's buffer (the embedded
 * pool runs both in one process). Arrivals still buffered when an instance is retired are lost (at
 * most one interval's worth): the forecast is a tendency, not a ledger, and a request must not wait on it.
 */
export const FORECAST_WRITE_INTERVAL_MS = 10_000;
const MAX_TRIES = 3;

/** What an instance keeps of one label's forecast. */
interface Kept {
  /** Arrivals counted, not written yet. */
  pending: number;
  lastWriteAt?: number;
  writing: boolean;
}

const kept = new WeakMap<PoolStore, Map<string, Kept>>();

function keptOf(store: PoolStore, label: string): Kept {
  let entries = kept.get(store);
  if (!entries) {
    entries = new Map();
    kept.set(store, entries);
  }
  let entry = entries.get(label);
  if (!entry) {
    entry = { pending: 0, writing: false };
    entries.set(label, entry);
  }
  return entry;
}

/** Whether the pool forecasts arrivals of this label (it has `min-ready: auto`). */
export const forecasts = (ctx: Context, label: string): boolean => ctx.config.readyAuto?.has(label) === true;

/**
 * Counts one arrival of `label` (a request placed), and writes the count unless this instance wrote it
 * within the interval. Best effort and never thrown: the request is placed whatever happens here.
 */
export async function countArrival(ctx: Context, label: string): Promise<void> {
  if (!forecasts(ctx, label)) return;
  const entry = keptOf(ctx.store, label);
  entry.pending++;
  if (entry.writing) return; // the write under way started before this arrival: the next one takes it
  const now = ctx.clock.now();
  if (entry.lastWriteAt !== undefined && now - entry.lastWriteAt < FORECAST_WRITE_INTERVAL_MS) return;
  await write(ctx, label, entry);
}

/** Writes every label's buffered arrivals of this instance now (the reaper, in the embedded pool). */
export async function flushArrivals(ctx: Context): Promise<void> {
  const entries = kept.get(ctx.store);
  if (!entries) return;
  for (const [label, entry] of entries) {
    if (entry.pending > 0 && !entry.writing) await write(ctx, label, entry);
  }
}

/**
 * The reaper's fold of a label: the minutes that ended since the last write folded in (with this
 * instance's buffered arrivals), and the launch-to-ready time it saw recorded. Returns the model as
 * stored now (undefined: none yet and nothing to write). Throws what the store throws.
 */
export async function foldForecast(
  ctx: Context,
  label: string,
  launchToReadyS?: number,
): Promise<ArrivalModel | undefined> {
  return write(ctx, label, keptOf(ctx.store, label), launchToReadyS, true);
}

async function write(
  ctx: Context,
  label: string,
  entry: Kept,
  launchToReadyS?: number,
  rethrow = false,
): Promise<ArrivalModel | undefined> {
  entry.writing = true;
  entry.lastWriteAt = ctx.clock.now();
  const count = entry.pending;
  entry.pending = 0;
  let written = false;
  try {
    for (let attempt = 0; attempt < MAX_TRIES; attempt++) {
      const prev = await ctx.store.getForecast(label);
      let next = withArrivals(prev, label, count, ctx.clock.now());
      if (launchToReadyS !== undefined && launchToReadyS > 0 && prev?.launchToReadyS !== launchToReadyS) {
        const base = next ?? (prev ? { ...prev, version: prev.version + 1 } : undefined);
        next = base ? { ...base, launchToReadyS } : undefined;
      }
      if (!next) {
        written = true;
        return prev;
      }
      if (await ctx.store.putForecast(next)) {
        written = true;
        return next;
      }
    }
    ctx.log.debug('arrivals not recorded yet: the forecast kept changing under us', { label });
    return await ctx.store.getForecast(label);
  } catch (err) {
    if (rethrow) throw err;
    ctx.log.warn('could not record arrivals', { label, error: (err as Error).message });
    return undefined;
  } finally {
    entry.writing = false;
    if (!written) entry.pending += count; // conflicts or an error: they wait for the next write
  }
}
