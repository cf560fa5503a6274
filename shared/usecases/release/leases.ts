import { ConflictError, HeldNodeError, PermanentError } from '../../core/errors.ts';
import {
  holdsAnything,
  LEASE_EXPIRED_REASON,
  lapseDecision,
  leaseLimitsOf,
  renewDecision,
} from '../../core/leases.ts';
import type { RequestRecord } from '../../core/records.ts';
import { type ServeContext, timeLeft } from '../context.ts';
import { failRequest } from '../place/requests.ts';
import { handOffFreedRoom } from './handOff.ts';
import { releaseNode } from './release.ts';

/** A renewal refused for good: an unknown or ended request, no lease, a lapsed one, a length out of bounds. */
export class LeaseRefusedError extends PermanentError {}

/** How many times a renewal reads again after another writer moved the lease between its read and write. */
const RENEW_ROUNDS = 3;

/**
 * Renews a request's lease from now: read, decide (core/leases.ts renewDecision), then one UpdateItem
 * conditioned on the expiry read and on the lease not being found lapsed, so a renewal and the reaper's
 * lapse race atomically (docs/table.md, "Leases"). An unknown or ended request is refused and nothing
 * is written to it: no node is revived. Returns the new expiry.
 */
export async function renewLease(
  ctx: ServeContext,
  requestId: string,
  asked?: number,
): Promise<{ readonly expiresAt: number; readonly seconds: number }> {
  for (let round = 0; round < RENEW_ROUNDS; round++) {
    const r = await ctx.store.getRequest(requestId);
    const now = ctx.clock.now();
    const decision = renewDecision(requestId, r, now, asked, leaseLimitsOf(ctx.config, r?.labels ?? []));
    if (decision.kind === 'refuse') throw new LeaseRefusedError(decision.reason);
    const read = r?.leaseExpiresAt as number;
    if (await ctx.store.renewLease(requestId, read, decision.seconds, decision.expiresAt, now)) {
      ctx.log.info('lease renewed', { requestId, expiresAt: decision.expiresAt, lease: decision.seconds });
      return { expiresAt: decision.expiresAt, seconds: decision.seconds };
    }
  }
  throw new ConflictError(`renewing the lease of request ${requestId}: it kept changing; retrying`);
}

export interface LeaseReport {
  /** Requests whose lease lapsed this run: their nodes were released (held ones kept), or they failed. */
  readonly expired: string[];
  /** False when the invocation ran short before every lapsed lease was seen: the next run goes on. */
  readonly complete: boolean;
}

/**
 * The reaper's lease step: reads only the leases that lapsed (the LEASE partition of the free index,
 * sorted by expiry), and for each (core/leases.ts lapseDecision) marks it lapsed, conditioned on the
 * expiry it read (a renewal that landed first wins, and the request is left alone), then releases every
 * node of the request with reason LEASE_EXPIRED_REASON (held nodes are kept: an operator's hold outranks a
 * lease) or fails it if not placed yet. A run cut short leaves the request marked, in the partition:
 * the next run finishes it.
 */
export async function endLapsedLeases(ctx: ServeContext): Promise<LeaseReport> {
  const expired: string[] = [];
  const now = ctx.clock.now();
  let cursor: Record<string, unknown> | undefined;
  do {
    if (timeLeft(ctx) <= 0) return { expired, complete: false };
    const page = await ctx.store.leasesBefore(now + 1, cursor);
    for (const r of page.items) {
      if (timeLeft(ctx) <= 0) return { expired, complete: false };
      if (await endLapsedLease(ctx, r, now)) expired.push(r.id);
    }
    cursor = page.cursor;
  } while (cursor);
  return { expired, complete: true };
}

/** One request of the lease partition: true when this run ended its lease. */
async function endLapsedLease(ctx: ServeContext, r: RequestRecord, now: number): Promise<boolean> {
  const decision = lapseDecision(r, now);
  if (decision.kind === 'keep') return false;
  if (decision.kind === 'drop') {
    if (r.leaseExpiresAt !== undefined) await ctx.store.dropLease(r.id, r.leaseExpiresAt);
    return false;
  }
  if (r.leaseLapsedAt === undefined && !(await ctx.store.lapseLease(r.id, decision.expiresAt, now))) {
    return false; // a renewal (or another run) moved the lease first: it is not lapsed any more
  }
  ctx.log.warn('lease expired: releasing the request', {
    requestId: r.id,
    expiredAt: decision.expiresAt,
  });
  // No hand-off of the freed room from here: waiting requests take it on their next receive.
  await releaseWhole(ctx, r.id, { force: false, reason: LEASE_EXPIRED_REASON, handOff: false });
  const after = await ctx.store.getRequest(r.id);
  // Held nodes stay until a forced release; the lease has nothing more to do for this request.
  if (after?.leaseExpiresAt !== undefined && !holdsUnheld(after)) {
    await ctx.store.dropLease(after.id, after.leaseExpiresAt);
  }
  return true;
}

/** Whether a request still holds something a release without force would end. */
function holdsUnheld(r: RequestRecord): boolean {
  if (r.state === 'requested') return true;
  return holdsAnything(r) && r.nodes.some((n) => (n.state === 'pending' || n.state === 'ready') && !n.held);
}

export interface RequestReleaseOutcome {
  /** Node ids released by this call. */
  readonly released: string[];
  /** Held nodes kept (release them with force). */
  readonly kept: string[];
  /** The request was still waiting to be placed: it ended failed with the reason instead. */
  readonly cancelled: boolean;
}

/**
 * Releases every node of a request, one node's release each (release.ts: its slot, its place, a
 * min-ready spare it took, the Node Released event), so a redelivery or a crash part-way is finished by
 * the next try. Held nodes are kept unless `force`. A request still waiting ends failed instead. An
 * ended request is left as it is (idempotent); an unknown one is refused.
 */
export async function releaseWhole(
  ctx: ServeContext,
  requestId: string,
  options: { readonly force: boolean; readonly reason?: string; readonly handOff?: boolean },
): Promise<RequestReleaseOutcome> {
  const r = await ctx.store.getRequest(requestId);
  if (!r) throw new PermanentError(`unknown request "${requestId}"`);
  if (r.state === 'requested') {
    const reason = options.reason ?? 'cancelled: the request was released before it was placed';
    const after = await failRequest(ctx, r.id, r.bodyHash, reason);
    if (after?.state === 'requested') {
      throw new ConflictError(`request ${requestId} changed while being released; retrying`);
    }
    if (after?.state === 'failed') return { released: [], kept: [], cancelled: true };
    return releaseWhole(ctx, requestId, options); // placed meanwhile: release its nodes
  }
  const released: string[] = [];
  const kept: string[] = [];
  for (const n of r.nodes) {
    if (n.state !== 'pending' && n.state !== 'ready') continue;
    try {
      const out = await releaseNode(ctx, n.id, options.force, options.reason);
      if (out.kind === 'released') {
        released.push(n.id);
        if (out.poolKey && options.handOff !== false)
          await handOffFreedRoom(ctx, out.poolKey, out.node.label);
      }
    } catch (err) {
      if (!(err instanceof HeldNodeError)) throw err;
      kept.push(n.id);
      ctx.log.info('held node kept: the request was released without force', { nodeId: n.id });
    }
  }
  return { released, kept, cancelled: false };
}
