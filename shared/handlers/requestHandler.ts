import type { SQSRecord } from 'aws-lambda';
import { CapacityError, PermanentError, StoreRefusedError } from '../core/errors.ts';
import { nodeId, parseNodeId } from '../core/ids.ts';
import { withKeys } from '../core/log.ts';
import { type ParsedMessage, parseMessage } from '../core/messages.ts';
import { MetricName } from '../core/observability.ts';
import type { RequestRecord } from '../core/records.ts';
import { RENEW_RETRY_SECONDS } from '../core/timing.ts';
import type { Context } from '../usecases/context.ts';
import { requestNodes } from '../usecases/place/requestNodes.ts';
import { endRequestOf, recordFailure } from '../usecases/place/requests.ts';
import {
  afterCapacityWait,
  budgetPassed,
  type LastAttempts,
  type WaitingBudget,
} from '../usecases/place/waitingBudget.ts';
import { writeArrivals } from '../usecases/ready/forecasts.ts';
import type { SparesSeen } from '../usecases/ready/minReady.ts';
import { keepMinReady, labelsTaken } from '../usecases/ready/replenish.ts';
import { cancelRequest } from '../usecases/release/cancel.ts';
import { handOffFreedRoom } from '../usecases/release/handOff.ts';
import { releaseWhole, renewLease } from '../usecases/release/leases.ts';
import { releaseNode } from '../usecases/release/release.ts';
import { makeBatchHandler, type SqsBatchHandler } from './batchHandler.ts';

export interface RequestHandlerOptions {
  /**
   * The request queue's maxReceiveCount: a backstop, sized above the waiting budget (core/timing.ts
   * backstopReceiveCount). A request still waiting (for capacity, or after any other transient failure)
   * on its last receive is recorded as failed rather than left to the dead-letter queue, so every
   * request ends with a reason.
   */
  readonly maxReceiveCount?: number;
  /**
   * How long a request may wait for capacity, since it was first recorded (usecases/place/waitingBudget.ts),
   * and the queue's visibility timeout. Unset: only the receive count and the reaper's request-timeout
   * end a waiting request.
   */
  readonly waitingBudget?: WaitingBudget;
  /**
   * Keeps a waiting request's message away for `seconds` from now (SQS ChangeMessageVisibility on its
   * receipt handle), so a backlog of waiting requests does not cost a placement attempt each per
   * visibility timeout. Best effort: if it fails, the message comes back after the queue's timeout.
   */
  readonly backOff?: (record: SQSRecord, seconds: number) => Promise<void>;
  /**
   * Makes a message come back `seconds` from now (ChangeMessageVisibility): a lease renewal that failed
   * is retried within RENEW_RETRY_SECONDS, not the queue's visibility timeout. Best effort.
   */
  readonly retrySoon?: (record: SQSRecord, seconds: number) => Promise<void>;
  /**
   * Where every writer of the table counts its room-freeing writes (the embedded pool): a waiting
   * request's receive skips the placement attempt when nothing was freed since its last one.
   */
  readonly lastAttempts?: LastAttempts;
}

export type { SqsBatchHandler } from './batchHandler.ts';

/**
 * What every log line about a queue message carries: the message, and the request it is about (a
 * request's or cancel's id, a released node's request, or the id a rejected body carried).
 */
function messageKeys(record: SQSRecord, parsed: ParsedMessage): Record<string, string> {
  const keys: Record<string, string> = { messageId: record.messageId };
  if (!parsed.ok) {
    if (parsed.requestId) keys.requestId = parsed.requestId;
    return keys;
  }
  const m = parsed.message;
  if (m.kind !== 'release' || m.nodeId === undefined) return { ...keys, requestId: m.id as string };
  const requestId = parseNodeId(m.nodeId)?.requestId;
  return { ...keys, nodeId: m.nodeId, ...(requestId ? { requestId } : {}) };
}

/** The record's Context, whose log names the message and its request on every line (messageKeys). */
function messageContext(ctx: Context, record: SQSRecord, parsed: ParsedMessage): Context {
  return { ...ctx, log: withKeys(ctx.log, messageKeys(record, parsed)) };
}

/**
 * Records a message that cannot be a request under the request id it carries (if any), failed with the
 * reason, so its sender finds out. Idempotent: an id already taken is never overwritten. What is
 * recorded is bounded whatever the body held (labels: see parseMessage; the reason: core/text.ts).
 */
async function recordRejected(ctx: Context, parsed: Extract<ParsedMessage, { ok: false }>): Promise<void> {
  const id = parsed.requestId;
  if (!id) return;
  const labels = parsed.labels ?? [];
  const now = ctx.clock.now();
  await recordFailure(
    ctx,
    {
      id,
      labels,
      bodyHash: 'invalid',
      state: 'requested',
      createdAt: now,
      updatedAt: now,
      version: 0,
      nodes: labels.map((label, i) => ({ id: nodeId(id, i), label, state: 'requested' })),
    },
    parsed.reason,
  );
}

/** Why a request whose message was dead-lettered ends: its last delivery died before it could say. */
export const DEAD_LETTERED_REASON =
  'its message went to the dead-letter queue: every delivery failed, the last one before it could record why';

/**
 * The request function on its own dead-letter queue. A message lands there when its last delivery
 * failed without a word (a crash, a timeout), so the request would stay waiting forever: a request is
 * ended as failed with DEAD_LETTERED_REASON (unless it was placed or ended meanwhile), a release is tried
 * once more, and a body that is no valid message is recorded under its request id (if any) with the
 * reason, as its first delivery should have. What fails here stays in the dead-letter queue and comes
 * back (its alarm shows it); what it records is bounded, so no message fails here for its size.
 */
export function makeDeadLetterHandler(context: Context): SqsBatchHandler {
  const recordHandler = async (record: SQSRecord, batchCtx: Context): Promise<void> => {
    const parsed = parseMessage(record.body);
    const ctx = messageContext(batchCtx, record, parsed);
    try {
      if (!parsed.ok) {
        // Rejected on its first delivery, which records it; if that record never got written (the
        // deliveries failed), it is written here: a request id the sender waits on always gets an answer.
        await recordRejected(ctx, parsed);
        return;
      }
      const m = parsed.message;
      if (m.kind === 'request') {
        await endRequestOf(ctx, m, DEAD_LETTERED_REASON);
        ctx.log.warn('dead-lettered request handled (ended unless placed or ended before)');
      } else if (m.kind === 'cancel') {
        await cancelRequest(ctx, m.id, m.reason);
      } else if (m.kind === 'renew') {
        await renewLease(ctx, m.id, m.lease);
      } else if (m.nodeId === undefined) {
        await releaseWhole(ctx, m.id as string, { force: m.force ?? false, handOff: false });
      } else {
        await releaseNode(ctx, m.nodeId, m.force ?? false);
      }
    } catch (err) {
      if (err instanceof PermanentError) {
        ctx.log.warn('rejected dead-lettered message', { reason: err.message });
        return;
      }
      // Its last chance failed too: say so, or only the queue's alarm would.
      ctx.log.error('dead-lettered message not handled; it stays in the dead-letter queue', {
        error: (err as Error).message,
      });
      throw err;
    }
  };
  // The arrivals its placements counted (and its quick releases took back) go to the table before the
  // container is frozen: the reaper runs in another (shared/usecases/ready/forecasts.ts).
  return makeBatchHandler(context, recordHandler, { inOrder: true, atEnd: writeArrivals });
}

/**
 * Records how long the request has waited, since it was sent, each time it finds no capacity (the
 * `CapacityWait` metric; `RequestsWaitingAlarm` watches its maximum). SQS's own queue-age metric cannot:
 * it leaves out a message received three times or more, and a waiting request is received every
 * visibility timeout.
 */
function reportCapacityWait(ctx: Context, record: SQSRecord): void {
  const sent = Number(record.attributes?.SentTimestamp);
  if (!Number.isFinite(sent) || sent <= 0) return;
  ctx.metrics?.milliseconds(MetricName.capacityWait, Math.max(0, ctx.clock.now() - sent));
}

/**
 * Refills the min-ready seats of the labels whose ready nodes the request took, at once rather than at
 * the reaper's next run. Best effort: the request is placed whatever happens here, and the reaper
 * refills what this leaves.
 */
async function replenishTaken(ctx: Context, r: RequestRecord, seen: SparesSeen | undefined): Promise<void> {
  for (const label of labelsTaken(r)) {
    try {
      // Started from what the take read and wrote (SparesSeen), not read again.
      const report = await keepMinReady(ctx, label, seen ? { taken: { seen, taker: r } } : {});
      if (report.errors.length > 0)
        ctx.log.warn('min-ready refill incomplete', { label, errors: report.errors });
    } catch (err) {
      ctx.log.warn('min-ready refill failed; the reaper refills it', {
        label,
        error: (err as Error).message,
      });
    }
  }
}

/**
 * The request function: one SQS batch of request/release messages, in order (see makeBatchHandler). Each
 * record is handled alone; Powertools' batch processor reports the failed ones so only they come back.
 * Bad input is recorded (under its request id when it has one) and consumed; transient failures are
 * retried by SQS.
 */
export function makeRequestHandler(context: Context, options: RequestHandlerOptions = {}): SqsBatchHandler {
  const recordHandler = async (record: SQSRecord, batchCtx: Context): Promise<void> => {
    const parsed = parseMessage(record.body);
    const ctx = messageContext(batchCtx, record, parsed);
    if (!parsed.ok) {
      ctx.log.warn('rejected message', { reason: parsed.reason });
      await recordRejected(ctx, parsed);
      return;
    }
    const m = parsed.message;
    const receives = Number(record.attributes?.ApproximateReceiveCount ?? '1');
    try {
      if (m.kind === 'request') {
        // Nothing freed since this process last tried it (the attempt could only fail the same way), or
        // its budget passed since (it ends without one): the last attempt's outcome stands.
        const budget = options.waitingBudget;
        const due = budget
          ? (w: { createdAt: number; labels: readonly string[] }) => budgetPassed(ctx, w, budget)
          : undefined;
        const unchanged = options.lastAttempts?.unchanged(ctx, m, due);
        if (unchanged) throw unchanged;
        // Which receive of which message: a redelivery takes over what an earlier receive left at once.
        const place = () => requestNodes(ctx, m, { messageId: record.messageId, receiveCount: receives });
        const out = options.lastAttempts ? await options.lastAttempts.attempt(ctx, m, place) : await place();
        if (out.kind === 'placed') await replenishTaken(ctx, out.request, out.spares);
      } else if (m.kind === 'cancel') {
        await cancelRequest(ctx, m.id, m.reason);
      } else if (m.kind === 'renew') {
        await renewLease(ctx, m.id, m.lease);
      } else if (m.nodeId === undefined) {
        // Every node of the request, each released as one node is (the freed room handed off).
        await releaseWhole(ctx, m.id as string, { force: m.force ?? false });
      } else {
        const released = await releaseNode(ctx, m.nodeId, m.force ?? false);
        if (released.kind === 'released' && released.poolKey) {
          await handOffFreedRoom(ctx, released.poolKey, released.node.label);
        }
      }
    } catch (err) {
      if (err instanceof StoreRefusedError && m.kind === 'request') {
        // Refused as invalid, it would be refused on every receive: the request ends now, with the reason
        // (recorded without what the table refused, if that was in its own record).
        ctx.log.warn('request ended: the table refused a write', { reason: err.message });
        await endRequestOf(ctx, m, err.message);
        return;
      }
      if (err instanceof PermanentError) {
        ctx.log.warn('rejected message', { reason: err.message });
        return;
      }
      if (err instanceof CapacityError) {
        reportCapacityWait(ctx, record);
        if (m.kind === 'request' && err.waiting && options.waitingBudget) {
          const after = await afterCapacityWait(ctx, m, err.waiting, options.waitingBudget, err.message);
          if (after.kind === 'ended') {
            ctx.log.info('request ended: its waiting budget passed', { reason: after.reason });
            return;
          }
          await backOff(ctx, record, after.visibilitySeconds);
        }
      }
      const last = options.maxReceiveCount !== undefined && receives >= options.maxReceiveCount;
      if (last && m.kind === 'request') {
        // Its last receive: the request ends here, with the reason, rather than in the dead-letter queue.
        const why = err instanceof CapacityError ? 'no capacity' : 'gave up';
        await endRequestOf(ctx, m, `${why} after ${receives} attempts: ${(err as Error).message}`);
        return;
      }
      if (m.kind === 'renew') await retrySoon(ctx, record);
      ctx.log.info('message will be retried', { receives, reason: (err as Error).message });
      throw err;
    }
  };
  /** Keeps the message away as long as its wait says (the queue's own timeout needs no call). */
  const backOff = async (ctx: Context, record: SQSRecord, seconds: number): Promise<void> => {
    if (!options.backOff || seconds === options.waitingBudget?.visibilitySeconds) return;
    try {
      await options.backOff(record, seconds);
    } catch (err) {
      ctx.log.warn('could not back off a waiting request; it comes back after the visibility timeout', {
        seconds,
        error: (err as Error).message,
      });
    }
  };
  /** A renewal that failed comes back within seconds: its lease must not lapse waiting for it. */
  const retrySoon = async (ctx: Context, record: SQSRecord): Promise<void> => {
    if (!options.retrySoon) return;
    try {
      await options.retrySoon(record, RENEW_RETRY_SECONDS);
    } catch (err) {
      ctx.log.warn(
        'could not make a failed renewal come back soon; it comes back after the visibility timeout',
        {
          error: (err as Error).message,
        },
      );
    }
  };
  // The arrivals its placements counted (and its quick releases took back) go to the table before the
  // container is frozen: the reaper runs in another (shared/usecases/ready/forecasts.ts).
  return makeBatchHandler(context, recordHandler, { inOrder: true, atEnd: writeArrivals });
}
