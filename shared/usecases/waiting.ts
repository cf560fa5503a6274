import type { RequestMessage } from '../core/messages.ts';
import { requestTimeoutOf, shortestRequestTimeout } from '../core/pools.ts';
import type { RequestRecord } from '../core/records.ts';
import { type Context, timeLeft } from './context.ts';
import { failRequest } from './requests.ts';

/**
 * Requests still waiting to be placed (state `requested`). A waiting request lives on through its
 * message: each receive tries to place it again, and the receive that reaches the queue's
 * maxReceiveCount ends it. A request whose message is gone (the embedded pool's in-memory queue died
 * with its process, a message deleted by hand) would wait forever, so the reaper ends every request
 * still waiting past its request-timeout, whatever became of its message. They sit in the WAITING
 * partition of the reap index, oldest first (docs/table.md): the reaper reads only those old enough to
 * be due, never a Scan.
 */

export interface WaitingReport {
  /** Requests ended `failed` because their request-timeout passed. */
  readonly expired: string[];
  /** False when the invocation's time ran out before every due request was looked at. */
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
 */
export async function endExpiredRequests(ctx: Context): Promise<WaitingReport> {
  const expired: string[] = [];
  const now = ctx.clock.now();
  // Created at or before this instant: old enough for the shortest request-timeout.
  const due = now - shortestRequestTimeout(ctx.config) * 1000 + 1;
  let cursor: Record<string, unknown> | undefined;
  do {
    if (timeLeft(ctx) <= 0) return { expired, complete: false };
    const page = await ctx.store.waitingRequests(due, cursor);
    for (const r of page.items) {
      if (timeLeft(ctx) <= 0) return { expired, complete: false };
      const timeout = requestTimeoutOf(ctx.config, r.labels);
      const waited = now - r.createdAt;
      if (waited < timeout * 1000) continue; // a label with a longer request-timeout
      const reason = requestTimeoutReason(timeout, waited);
      const after = await failRequest(ctx, r.id, r.bodyHash, reason);
      if (after?.state === 'failed' && after.reason === reason) expired.push(r.id);
    }
    cursor = page.cursor;
  } while (cursor);
  return { expired, complete: true };
}

/**
 * The nodes of waiting requests that are not ready yet (the NodesWaiting gauge): one read of the
 * `WAITING` index partition, page by page. Undefined when the invocation runs out of time part-way: a
 * partial count would read as a drop.
 */
export async function nodesWaiting(ctx: Context): Promise<number | undefined> {
  let n = 0;
  let cursor: Record<string, unknown> | undefined;
  do {
    if (timeLeft(ctx) <= 0) return undefined;
    const page = await ctx.store.waitingRequests(Number.MAX_SAFE_INTEGER, cursor);
    for (const r of page.items)
      n += Math.max(0, r.labels.length - r.nodes.filter((x) => x.state === 'ready').length);
    cursor = page.cursor;
  } while (cursor);
  return n;
}

/** Every request still waiting to be placed, oldest first (e.g. to re-queue after the queue was lost). */
export async function waitingRequests(ctx: Context): Promise<RequestRecord[]> {
  const out: RequestRecord[] = [];
  let cursor: Record<string, unknown> | undefined;
  do {
    const page = await ctx.store.waitingRequests(Number.MAX_SAFE_INTEGER, cursor);
    out.push(...page.items);
    cursor = page.cursor;
  } while (cursor);
  return out;
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
