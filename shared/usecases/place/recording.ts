import { BusyError, DeadlineError, PermanentError, RetryableError } from '../../core/errors.ts';
import { supersedes } from '../../core/ids.ts';
import { isSpareRequestId } from '../../core/minReady.ts';
import { MetricName } from '../../core/observability.ts';
import type { RequestPort } from '../../core/poolStore.ts';
import { claimedPriorityOf } from '../../core/priority.ts';
import type { RequestRecord } from '../../core/records.ts';
import { CANCELLED_BEFORE_RECEIVED } from '../../core/request.ts';
import { DELIVERY_DEADLINE_MS } from '../../core/timing.ts';
import { AGAIN, retryOnConflict, unlessConflict } from '../conflicts.ts';
import { type Context, timeLeft } from '../context.ts';

/**
 * What one delivery of a request message knows of the stored request while it places it, and the
 * verdicts the stored request can give: placed already (AlreadyPlaced), another request's id
 * (IdReused), taken over by a later receive of the message (Superseded). See requestNodes.ts.
 */

/** The request id belongs to a request with another body; its nodes (same ids) are not ours to touch. */
export class IdReused extends PermanentError {
  constructor(
    readonly request: RequestRecord,
    sent: Pick<RequestRecord, 'labels' | 'requestor' | 'priority'>,
  ) {
    const differs = [
      request.labels.join('\n') !== sent.labels.join('\n') ? 'labels' : undefined,
      request.requestor !== sent.requestor ? 'requestor' : undefined,
      request.priority !== sent.priority ? 'priority' : undefined,
    ].filter((f) => f !== undefined);
    super(
      `request id "${request.id}" is already used by another request (labels ${request.labels.join(', ')}` +
        `${request.requestor === undefined ? '' : `, requestor ${request.requestor}`}` +
        `${request.priority === undefined ? '' : `, priority ${request.priority}`}); ` +
        `this one differs in ${differs.join(' and ') || 'its body'}: use a new id for a new request`,
    );
  }
}

/** The request was already placed (or ended) by an earlier or concurrent delivery. */
export class AlreadyPlaced extends Error {
  constructor(readonly request: RequestRecord) {
    super(`request ${request.id} is already ${request.state}`);
  }
}

/**
 * A delivery of a later receive of this message made itself the placer (Recording.fence) to take over
 * what this one holds: this one records nothing and gives back what is still its own.
 */
export class Superseded extends BusyError {
  constructor(readonly request: RequestRecord) {
    super(`request ${request.id} is being placed by a later delivery of its message; this one stops`);
  }
}

/**
 * A request by shape whose stored record holds other labels than this delivery chose for its shapes: a
 * concurrent first delivery chose differently and recorded first. This one gives back what it took and
 * comes back later, when it reads the stored choice (shared/usecases/place/shapes.ts).
 */
export class ChoseOtherLabels extends BusyError {
  constructor(readonly request: RequestRecord) {
    super(
      `request ${request.id} was recorded with other labels for its shapes by another delivery; retrying with those`,
    );
  }
}

/** What the stored request says about this delivery's work: it is someone else's to finish, or done. */
export const isStoredVerdict = (
  err: unknown,
): err is AlreadyPlaced | IdReused | Superseded | ChoseOtherLabels =>
  err instanceof AlreadyPlaced ||
  err instanceof IdReused ||
  err instanceof Superseded ||
  err instanceof ChoseOtherLabels;

/**
 * What this delivery knows of the stored request: nothing yet (the warm path writes it once, at the
 * end) or the `requested` record it wrote or found.
 */
export class Recording {
  private stored: RequestRecord | undefined;

  constructor(
    private readonly ctx: Context<RequestPort>,
    private readonly fresh: RequestRecord,
    /** This delivery's owner token: its claims and reservations carry it. */
    readonly owner: string,
    private readonly startedAt: number,
  ) {}

  /** The record to build the placed request from. */
  get base(): RequestRecord {
    return this.stored ?? this.fresh;
  }

  /** Creates the request's first record, counted as received; the existing record when there is one. */
  private async create(record: RequestRecord): Promise<RequestRecord | undefined> {
    const existing = await this.ctx.store.createRequest(record);
    if (!existing && !isSpareRequestId(this.base.id)) this.ctx.metrics?.count(MetricName.requestsReceived);
    if (!existing && record.priorityCeiling !== undefined) {
      this.ctx.log.warn("request priority clamped to its requestor's priority-ceiling", {
        requestId: record.id,
        requestor: record.requestor,
        claimedPriority: claimedPriorityOf(record),
        priority: record.priorityCeiling,
      });
    }
    return existing;
  }

  /** Makes sure a `requested` record exists; throws AlreadyPlaced if a delivery got further. */
  async ensure(): Promise<void> {
    if (this.stored) return;
    const recorded = { ...this.fresh, placer: this.owner };
    const existing = await this.create(recorded);
    this.stored = existing ? this.adopt(existing) : recorded;
  }

  /**
   * Makes this delivery the request's placer before it takes over what an earlier receive of its message
   * holds (supersedes): a conditional write of the `requested` record (created if need be) naming it.
   * Every write of a placement is conditioned on the record (version, or its absence), and a delivery
   * that finds a later receive's placer stops (Superseded), so the earlier delivery, even if it still
   * runs, can no longer record nodes on claims this one took over and may give back. Throws AlreadyPlaced
   * when a delivery placed it meanwhile, Superseded when a still later receive is the placer.
   */
  async fence(): Promise<void> {
    await retryOnConflict(`taking over the placement of request ${this.fresh.id}`, async () => {
      const existing = await this.ctx.store.getRequest(this.fresh.id);
      if (!existing) {
        const fenced = { ...this.fresh, placer: this.owner };
        if (await this.create(fenced)) return AGAIN; // created meanwhile: read it
        this.stored = fenced;
        return true;
      }
      const base = this.adopt(existing);
      if (base.placer === this.owner) {
        this.stored = base;
        return true;
      }
      const fenced = {
        ...base,
        placer: this.owner,
        updatedAt: this.ctx.clock.now(),
        version: base.version + 1,
      };
      await this.ctx.store.putRequest(fenced, base.version);
      this.stored = fenced;
      this.ctx.log.info('a later delivery of the message takes over the placement', {
        requestId: base.id,
        from: base.placer,
      });
      return true;
    });
  }

  /** Writes the placed request; returns the winner instead when another delivery placed it first. */
  async write(next: (base: RequestRecord) => RequestRecord): Promise<RequestRecord | undefined> {
    // Past the deadline our claims may be taken over as abandoned: record nothing built on them.
    if (this.ctx.clock.now() - this.startedAt > DELIVERY_DEADLINE_MS) {
      throw new RetryableError(
        `placing request ${this.fresh.id} took over ${DELIVERY_DEADLINE_MS / 1000} s; retrying it`,
      );
    }
    // Nor this close to the end of the invocation: the delivery stops cleanly (giving its claims back)
    // rather than be killed with them held.
    if (timeLeft(this.ctx) <= 0) {
      throw new DeadlineError(`placing request ${this.fresh.id} ran out of invocation time; retrying it`);
    }
    return retryOnConflict(`writing request ${this.fresh.id}`, async () => {
      const base = this.base;
      const placed = next(base);
      let existing: RequestRecord | undefined;
      if (this.stored) {
        if (await unlessConflict(() => this.ctx.store.putRequest(placed, base.version))) return undefined;
        existing = await this.ctx.store.getRequest(this.fresh.id);
      } else {
        existing = await this.create(placed);
        if (!existing) return undefined;
      }
      if (!existing) throw new RetryableError(`request ${this.fresh.id} vanished while being placed`);
      try {
        this.stored = this.adopt(existing); // a waiting record: place onto it
      } catch (err) {
        if (err instanceof AlreadyPlaced) return err.request;
        throw err;
      }
      return AGAIN;
    });
  }

  /** Throws AlreadyPlaced or IdReused when the stored request (if any) is not ours to place. */
  async checkStored(): Promise<RequestRecord | undefined> {
    const existing = await this.ctx.store.getRequest(this.fresh.id);
    if (existing) this.adopt(existing);
    return existing;
  }

  private adopt(existing: RequestRecord): RequestRecord {
    // Cancelled before its message was received: this is that message, and the request has ended.
    if (existing.bodyHash === CANCELLED_BEFORE_RECEIVED) throw new AlreadyPlaced(existing);
    if (existing.bodyHash !== this.fresh.bodyHash) throw new IdReused(existing, this.fresh);
    if (existing.state !== 'requested') throw new AlreadyPlaced(existing);
    if (existing.labels.join('\n') !== this.fresh.labels.join('\n')) throw new ChoseOtherLabels(existing);
    if (existing.placer !== undefined && supersedes(existing.placer, this.owner))
      throw new Superseded(existing);
    return existing;
  }
}
