import { type ArrivalCount, type ArrivalModel, withArrivals } from '../../core/forecast.ts';
import { isSpareRequestId } from '../../core/minReady.ts';
import type { ReadinessPort } from '../../core/poolStore.ts';
import type { NodeRecord, RequestRecord } from '../../core/records.ts';
import { type Context, timeLeft } from '../context.ts';

/**
 * Arrival forecasts (core/forecast.ts) in the table, for labels with `min-ready: auto`: one item per
 * label (`FORECAST#<label>`), written conditionally on its version, as the duration estimates are.
 *
 * The request function counts a request when it places it (once per request: placement is one
 * conditional write, so a redelivery is not counted again), per requestor, in a buffer of its container
 * (module state, kept per store). It writes the buffer at the end of each invocation (`writeArrivals`,
 * called by the request handler once its batch is done): it reads the item (consistent read), adds its
 * counts (`withArrivals`: folding the minutes that ended, each requestor at most
 * REQUESTOR_ARRIVALS_PER_MINUTE a minute) and writes it conditional on the version it read; a conflict
 * reads and tries again, MAX_TRIES in all, then the counts wait for the next write.
 *
 * On Lambda a container is frozen between invocations and the reaper runs in another one: a count left in
 * a buffer is seen only when that container is invoked again, and is lost when it is retired, so the
 * buffer cannot wait for a later placement. Written at the end of the invocation, a burst is in the table
 * as soon as its invocations end. The writes stay bounded: a container writes a label's item at most once
 * per FORECAST_WRITE_INTERVAL_MS (1 s) whatever the request rate, so one item takes at most about one
 * write a second per container (the request function's concurrency bounds the containers): no hot item.
 * What an invocation counted within a second of that container's last write waits for its next
 * invocation; a container retired before it loses it (at most a second's worth of arrivals of one
 * container). The alternative, one atomic ADD per arrival into a per-minute item, needs no read but makes
 * one write per request and an item per minute; the forecast is a tendency, not a ledger, and a request
 * must not wait on it.
 *
 * A request released within QUICK_RELEASE_MS of its placement is taken back (`takeBackQuickRelease`,
 * called by the release): counted when it was placed (nobody knew then how long it would be kept), it
 * counts for the next minutes' ready room but teaches the weekly profile nothing, so a burst of requests
 * placed and released at once does not hold ready room at that hour for weeks.
 *
 * The reaper folds each label once a run, so a quiet label's rate decays with no request at all, and
 * writes out its own process's buffer first (`flushArrivals`: the embedded pool runs every handler in one
 * process).
 */
export const FORECAST_WRITE_INTERVAL_MS = 1_000;
const MAX_TRIES = 3;
/**
 * A request released within this long of its placement is a quick release: taken back from what its
 * label's forecast learns for the weeks ahead. A CI job rarely gives its node back within 30 s of asking
 * for it (it has to log in, run and report); the cost traces' jobs all keep theirs longer.
 */
export const QUICK_RELEASE_MS = 30_000;
/** Requestors a buffer keeps apart (per label); the arrivals of more in one interval count as anonymous. */
const MAX_BUFFERED_REQUESTORS = 100;

/** What a container keeps of one label's forecast. */
interface Kept {
  /** Arrivals counted and not written yet, per requestor (undefined: none named); < 0: taken back. */
  readonly pending: Map<string | undefined, number>;
  lastWriteAt?: number;
  writing: boolean;
}

const kept = new WeakMap<ReadinessPort, Map<string, Kept>>();

function keptOf(store: ReadinessPort, label: string): Kept {
  let entries = kept.get(store);
  if (!entries) {
    entries = new Map();
    kept.set(store, entries);
  }
  let entry = entries.get(label);
  if (!entry) {
    entry = { pending: new Map(), writing: false };
    entries.set(label, entry);
  }
  return entry;
}

/** Adds `count` to a buffer; a requestor beyond the bound: positive counts as anonymous, a take-back dropped. */
function add(pending: Map<string | undefined, number>, requestor: string | undefined, count: number): void {
  let key = requestor;
  if (!pending.has(key) && pending.size >= MAX_BUFFERED_REQUESTORS) {
    if (count < 0) return; // no take-back from someone else's count
    key = undefined;
  }
  const next = (pending.get(key) ?? 0) + count;
  if (next === 0) pending.delete(key);
  else pending.set(key, next);
}

/** Whether the pool forecasts arrivals of this label (it has `min-ready: auto`). */
export const forecasts = (ctx: Context<ReadinessPort>, label: string): boolean =>
  ctx.config.readyAuto?.has(label) === true;

/**
 * Counts one arrival of `label` (a request placed) by `requestor`, in this container's buffer: written
 * at the end of the invocation (writeArrivals), never here, so the placement does not wait on it.
 */
export async function countArrival(
  ctx: Context<ReadinessPort>,
  label: string,
  requestor?: string,
): Promise<void> {
  if (!forecasts(ctx, label)) return;
  add(keptOf(ctx.store, label).pending, requestor, 1);
}

/**
 * A node just released (by this call: once per node): if its request was placed less than
 * QUICK_RELEASE_MS ago, its arrival is taken back from what the forecast learns for the weeks ahead
 * (withArrivals), written with this container's next write. The pool's own ready nodes were never counted.
 */
export function takeBackQuickRelease(
  ctx: Context<ReadinessPort>,
  request: RequestRecord,
  node: NodeRecord,
): void {
  if (!forecasts(ctx, node.label) || isSpareRequestId(request.id) || request.placedAt === undefined) return;
  if (ctx.clock.now() - request.placedAt >= (ctx.quickReleaseMs ?? QUICK_RELEASE_MS)) return;
  add(keptOf(ctx.store, node.label).pending, request.requestor, -1);
}

/**
 * The end of an invocation of the request function: writes every label's buffered arrivals of this
 * container, unless it wrote that label within FORECAST_WRITE_INTERVAL_MS (those wait for its next
 * invocation) or the invocation's time is up. Best effort and never thrown: the requests are placed
 * whatever happens here.
 */
export async function writeArrivals(ctx: Context<ReadinessPort>): Promise<void> {
  const entries = kept.get(ctx.store);
  if (!entries) return;
  for (const [label, entry] of entries) {
    if (entry.pending.size === 0 || entry.writing || timeLeft(ctx) <= 0) continue;
    const now = ctx.clock.now();
    if (entry.lastWriteAt !== undefined && now - entry.lastWriteAt < FORECAST_WRITE_INTERVAL_MS) continue;
    await write(ctx, label, entry);
  }
}

/** Writes every label's buffered arrivals of this process now (the reaper, in the embedded pool). */
export async function flushArrivals(ctx: Context<ReadinessPort>): Promise<void> {
  const entries = kept.get(ctx.store);
  if (!entries) return;
  for (const [label, entry] of entries) {
    if (entry.pending.size > 0 && !entry.writing) await write(ctx, label, entry);
  }
}

/**
 * The reaper's fold of a label: the minutes that ended since the last write folded in (with this
 * process's buffered arrivals), and the launch-to-ready time it saw recorded. Returns the model as
 * stored now (undefined: none yet and nothing to write). Throws what the store throws.
 */
export async function foldForecast(
  ctx: Context<ReadinessPort>,
  label: string,
  launchToReadyS?: number,
): Promise<ArrivalModel | undefined> {
  return write(ctx, label, keptOf(ctx.store, label), launchToReadyS, true);
}

async function write(
  ctx: Context<ReadinessPort>,
  label: string,
  entry: Kept,
  launchToReadyS?: number,
  rethrow = false,
): Promise<ArrivalModel | undefined> {
  entry.writing = true;
  entry.lastWriteAt = ctx.clock.now();
  const counts: ArrivalCount[] = [...entry.pending].map(([requestor, count]) => ({ requestor, count }));
  entry.pending.clear();
  let written = false;
  try {
    for (let attempt = 0; attempt < MAX_TRIES; attempt++) {
      const prev = await ctx.store.getForecast(label);
      let next = withArrivals(prev, label, counts, ctx.clock.now());
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
    // Conflicts or an error: they wait for the next write.
    if (!written) for (const { requestor, count } of counts) add(entry.pending, requestor, count);
  }
}
