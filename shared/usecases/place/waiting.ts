import type { RequestMessage } from '../../core/messages.ts';
import type { MetastaticPool } from '../../core/model.ts';
import type { Page, PageCursor } from '../../core/poolStore.ts';
import { requestTimeoutOf, shortestRequestTimeout } from '../../core/pools.ts';
import { servedBefore, waitingAhead } from '../../core/priority.ts';
import type { RequestRecord } from '../../core/records.ts';
import { QUEUE_FORGET_MS, queueAsksFor, queueFits } from '../../core/waitingQueue.ts';
import { type ServeContext, timeLeft } from '../context.ts';
import { failRequest } from './requests.ts';

/**
 * Requests still waiting to be placed (state `requested`). A waiting request lives on through its
 * message: each receive tries to place it again, and the receive that reaches the queue's
 * maxReceiveCount ends it. A request whose message is gone (the embedded pool's in-memory queue died
 * with its process, a message deleted by hand) would wait forever, so the reaper ends every request
 * still waiting past its request-timeout, whatever became of its message. They wait in queues, one per
 * node-set shape, each a partition of the reap index in service order (core/waitingQueue.ts,
 * docs/table.md): the reaper reads every queue the registry names, never a Scan.
 */

export interface WaitingReport {
  /** Requests ended `failed` because their request-timeout passed. */
  readonly expired: string[];
  /** False when the invocation's time ran out before every waiting request was looked at. */
  readonly complete: boolean;
}

/** Why a request that waited past its request-timeout ends. */
export function requestTimeoutReason(timeoutSeconds: number, waitedMs: number): string {
  return `request-timeout of ${timeoutSeconds}s passed: still not placed ${Math.floor(waitedMs / 1000)}s after it was recorded`;
}

/**
 * Ends, as failed with the reason, every waiting request older than its request-timeout (a reaper step).
 * Idempotent and safe against a delivery placing the request at the same time: the end is one
 * version-checked write from `requested` (failRequest), so either the placement or the end wins, and a
 * delivery that loses gives back what it took.
 *
 * On the way it moves the requests an earlier version recorded waiting to their queues, and forgets the
 * queues it found empty that nobody announced for QUEUE_FORGET_MS. Each queue is read whole: it is in
 * service order, not by age, so no key condition picks the old ones out (the NodesWaiting gauge reads
 * them all too).
 */
export async function endExpiredRequests(ctx: ServeContext): Promise<WaitingReport> {
  const expired: string[] = [];
  const now = ctx.clock.now();
  const shortest = shortestRequestTimeout(ctx.config) * 1000;
  const endIfDue = async (r: RequestRecord) => {
    const waited = now - r.createdAt;
    if (waited < shortest) return false;
    const timeout = requestTimeoutOf(ctx.config, r.labels);
    if (waited < timeout * 1000) return false; // a label with a longer request-timeout
    const reason = requestTimeoutReason(timeout, waited);
    const after = await failRequest(ctx, r.id, r.bodyHash, reason);
    if (after?.state === 'failed' && after.reason === reason) expired.push(r.id);
    return true;
  };
  let cursor: PageCursor | undefined;
  do {
    if (timeLeft(ctx) <= 0) return { expired, complete: false };
    const page = await ctx.store.legacyWaiting(cursor);
    for (const r of page.items) {
      if (timeLeft(ctx) <= 0) return { expired, complete: false };
      if (!(await endIfDue(r))) await ctx.store.requeueWaiting(r);
    }
    cursor = page.cursor;
  } while (cursor);
  for (const q of await ctx.store.waitingQueues()) {
    let empty = true;
    cursor = undefined;
    do {
      if (timeLeft(ctx) <= 0) return { expired, complete: false };
      const page = await ctx.store.waitingInQueue(q, cursor);
      if (page.items.length > 0) empty = false;
      for (const r of page.items) {
        if (timeLeft(ctx) <= 0) return { expired, complete: false };
        await endIfDue(r);
      }
      cursor = page.cursor;
    } while (cursor);
    if (empty && now - q.registeredAt >= QUEUE_FORGET_MS) await ctx.store.forgetQueue(q);
  }
  return { expired, complete: true };
}

/**
 * Calls `visit` with every waiting request, queue by queue (each in service order), then those an
 * earlier version recorded. False when the invocation ran out of time part-way (`timed`).
 */
async function eachWaiting(
  ctx: ServeContext,
  visit: (r: RequestRecord) => void,
  timed: boolean,
): Promise<boolean> {
  const pages: Array<(cursor?: PageCursor) => Promise<Page<RequestRecord>>> = [
    ...(await ctx.store.waitingQueues()).map((q) => (c?: PageCursor) => ctx.store.waitingInQueue(q, c)),
    (c?: PageCursor) => ctx.store.legacyWaiting(c),
  ];
  for (const read of pages) {
    let cursor: PageCursor | undefined;
    do {
      if (timed && timeLeft(ctx) <= 0) return false;
      const page = await read(cursor);
      for (const r of page.items) visit(r);
      cursor = page.cursor;
    } while (cursor);
  }
  return true;
}

/**
 * The nodes of waiting requests that are not ready yet (the NodesWaiting gauge): one read of every
 * waiting queue, page by page. Undefined when the invocation runs out of time part-way: a partial count
 * would read as a drop.
 */
export async function nodesWaiting(ctx: ServeContext): Promise<number | undefined> {
  let n = 0;
  const complete = await eachWaiting(
    ctx,
    (r) => {
      n += Math.max(0, r.labels.length - r.nodes.filter((x) => x.state === 'ready').length);
    },
    true,
  );
  return complete ? n : undefined;
}

/** Every request still waiting to be placed, oldest first (e.g. to re-queue after the queue was lost). */
export async function waitingRequests(ctx: ServeContext): Promise<RequestRecord[]> {
  const out: RequestRecord[] = [];
  await eachWaiting(ctx, (r) => out.push(r), false);
  return out.sort((a, b) => a.createdAt - b.createdAt || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

/**
 * The waiting request `me` must let go first in `pool`, if any (waitingAhead, core/priority.ts), read
 * without reading every waiting request: one item per queue whose requests fit where `me` would go, the
 * first of it served before `me` (the registry of queues, then those queries, at once). Exact: a queue's
 * first served before `me` is the best placed of its requests that could be ahead. `pool` offers every
 * label of `me` (it is one of its eligiblePools), so `me`'s own queue is among those read.
 *
 * Where `me` waits already, its stored record says since when (a redelivery's own record says now): it
 * is in its own queue, which fits `me`. If it is that queue's first, nothing of its queue is ahead and
 * the others are compared with it; if another request is first there, that one is ahead of it whatever
 * its age, and so is the best of all the firsts.
 */
export async function firstWaitingAhead(
  ctx: ServeContext,
  me: RequestRecord,
  pool: MetastaticPool,
): Promise<RequestRecord | undefined> {
  const queues = (await ctx.store.waitingQueues({ reuse: true })).filter((q) => queueFits(q, me, pool));
  // Each queue's first whatever its place (not the first served before `me`): the same answer, since
  // nothing of a queue is served before `me` unless its first is, and an empty queue can be known
  // without a read for a moment (firstWaiting `reuse`).
  const firsts = (
    await Promise.all(queues.map((q) => ctx.store.firstWaiting(q, undefined, { reuse: true })))
  ).filter((r): r is RequestRecord => r !== undefined);
  const self = firsts.find((r) => r.id === me.id && r.bodyHash === me.bodyHash) ?? me;
  return waitingAhead(self, firsts, pool);
}

/**
 * The first waiting request, by priority, that asks for `label` and can be placed in `pool` (the hand-off
 * of a freed place): the first of each queue that does, one item each.
 */
export async function firstWaitingFor(
  ctx: ServeContext,
  label: string,
  pool: MetastaticPool,
): Promise<RequestRecord | undefined> {
  const queues = (await ctx.store.waitingQueues({ reuse: true })).filter((q) => queueAsksFor(q, label, pool));
  const firsts = await Promise.all(queues.map((q) => ctx.store.firstWaiting(q, undefined, { reuse: true })));
  let best: RequestRecord | undefined;
  for (const r of firsts) if (r && (!best || servedBefore(r, best))) best = r;
  return best;
}

/**
 * The message that asked for a waiting request: sending it again continues the request under the same
 * id (same body: the stored request is adopted, not rejected as a reused id).
 */
export function requestMessageOf(r: RequestRecord): RequestMessage {
  return {
    kind: 'request',
    id: r.id,
    // A request by shape is sent by shape again: the stored labels chosen for it are adopted.
    ...(r.shapes === undefined ? { labels: r.labels } : { shapes: r.shapes }),
    ...(r.requestor === undefined ? {} : { requestor: r.requestor }),
    ...(r.priority === undefined ? {} : { priority: r.priority }),
    ...(r.expectedDuration === undefined ? {} : { 'expected-duration': r.expectedDuration }),
    // The stored record (and its lease) is adopted; the length is sent only so the message says it.
    ...(r.lease === undefined ? {} : { lease: r.lease }),
  };
}
