import { PermanentError } from '../../core/errors.ts';
import { isSpareRequestId } from '../../core/minReady.ts';
import type { RequestRecord } from '../../core/records.ts';
import { CANCELLED_BEFORE_RECEIVED, failedRequest } from '../../core/request.ts';

export { CANCELLED_BEFORE_RECEIVED } from '../../core/request.ts';

import { boundedReason } from '../../core/text.ts';
import { AGAIN, retryOnConflict } from '../conflicts.ts';
import type { ServeContext } from '../context.ts';
import { failNodes, requestSettled } from '../place/requests.ts';

/** What became of a cancel: the request as it is now, and whether this cancel ended it. */
export interface CancelOutcome {
  readonly request: RequestRecord;
  readonly cancelled: boolean;
}

/**
 * Ends a request that is not fulfilled yet, with `cancelled[: reason]`. Waiting (`requested`): one
 * version-checked write makes it `failed`; a delivery placing it at that moment loses its own
 * version-checked write and gives back what it claimed, as when a request times out. Placed (`pending`):
 * it fails with all its live nodes, which give back their slots and places (failNodes). Not received
 * yet: recorded as cancelled (CANCELLED_BEFORE_RECEIVED), so its message places nothing when it comes.
 * Fulfilled or failed: left as it is (release a fulfilled request's nodes instead). Idempotent; every
 * end it makes publishes the usual Request Failed event. The pool's own min-ready requests are refused
 * (PermanentError): they end with their seat or their taker, never by a cancel.
 */
export async function cancelRequest(
  ctx: ServeContext,
  requestId: string,
  why?: string,
): Promise<CancelOutcome> {
  // The message schema refuses these ids already; this holds for every other caller too.
  if (isSpareRequestId(requestId)) {
    throw new PermanentError(
      `request ${requestId} is one of the pool's own min-ready requests: it cannot be cancelled`,
    );
  }
  const reason = boundedReason(why ? `cancelled: ${why}` : 'cancelled');
  const step = await retryOnConflict(`cancelling request ${requestId}`, async () => {
    const r = await ctx.store.getRequest(requestId);
    const now = ctx.clock.now();
    if (!r) {
      const tombstone: RequestRecord = {
        id: requestId,
        labels: [],
        bodyHash: CANCELLED_BEFORE_RECEIVED,
        state: 'failed',
        reason,
        createdAt: now,
        updatedAt: now,
        version: 0,
        nodes: [],
      };
      if (await ctx.store.createRequest(tombstone)) return AGAIN; // recorded meanwhile: read it
      return { kind: 'ended' as const, request: tombstone };
    }
    if (r.state === 'requested') {
      const next = failedRequest(r, reason, now);
      await ctx.store.putRequest(next, r.version); // placed or ended meanwhile: LostWriteError, look again
      return { kind: 'ended' as const, request: next };
    }
    if (r.state === 'pending') return { kind: 'placed' as const, request: r };
    return { kind: 'over' as const, request: r };
  });
  if (step.kind === 'ended') {
    ctx.log.warn('request cancelled', { requestId, reason });
    await requestSettled(ctx, step.request);
    return { request: step.request, cancelled: true };
  }
  if (step.kind === 'placed') {
    await failNodes(ctx, requestId, reason, () => true);
    const now = await ctx.store.getRequest(requestId);
    const request = now ?? step.request;
    return { request, cancelled: request.state === 'failed' && request.reason === reason };
  }
  ctx.log.info('cancel of a request already ended: left as it is', { requestId, state: step.request.state });
  return { request: step.request, cancelled: false };
}
