import { z } from 'zod';
import { contentHash, nodeId, parseNodeId, SPARE_ID_PREFIX } from './ids.ts';
import type { RequestMessage } from './messages.ts';
import type { NodeRecord, RequestRecord } from './records.ts';
import { boundedReason } from './text.ts';

/**
 * min-ready (Nodepool's top-level `labels[].min-ready`): the pool keeps that many nodes of a label
 * ready and unassigned, and a request takes one of them before anything else.
 *
 * A ready node kept this way (a spare) is the one node of an ordinary request the pool makes for
 * itself, placed like any other (slot claim, max-servers place, launch): its request id names the
 * label, a seat and a generation. Each label has `min-ready` seats; a seat holds one generation at a
 * time, and only a conditional advance of the seat's generation (from the one read) lets a new spare be
 * made for it. So however many replenishers run at once, a label never has more live, untaken spares
 * than seats: the no-overshoot invariant.
 *
 * A request takes a spare with one conditional write of the spare's request (its node records who took
 * it, `takenBy`); the taker's node records the spare (`spare`) and uses its slot and its place in
 * max-servers, which stay under the spare's node id: nothing moves between items, so there is nothing a
 * crash could leave half moved. Releasing or failing the taker's node ends the spare's node too. A spare
 * taken by a delivery that did not record it (it lost its request to another delivery) is returned,
 * free again: its seat has not moved on, since a seat moves on from a taken spare only once the taker
 * records it. One taken by a delivery that died before recording it is ended by the replenisher once
 * that delivery is known dead.
 */

/**
 * The priority a spare's request records (part of its body, so kept as it was). Spares wait behind every
 * request (Nodepool serves min-ready requests last, too), but not by this number: core/priority.ts
 * serves the pool's own requests in a class after every other, whatever a request's priority. It is
 * beyond any priority a message may give (MAX_PRIORITY), so it never reads as a client's.
 */
export const SPARE_PRIORITY = 1_000_000_000;

export const SPARE_REQUESTOR = 'metastatic min-ready';

const readableLabel = /^[A-Za-z0-9._-]{1,80}$/;

/** The request id of a label's spare for one seat and generation (within the request id pattern). */
export function spareRequestId(label: string, seat: number, gen: number): string {
  const name = readableLabel.test(label) ? label : `h${contentHash(label).slice(0, 16)}`;
  return `${SPARE_ID_PREFIX}${name}:${seat}:${gen}`;
}

/** The spare's one node. */
export function spareNodeId(label: string, seat: number, gen: number): string {
  return nodeId(spareRequestId(label, seat, gen), 0);
}

export function isSpareRequestId(id: string): boolean {
  return id.startsWith(SPARE_ID_PREFIX);
}

/** The request the pool makes for a seat's spare: one node of the label, served after every other. */
export function spareMessage(label: string, seat: number, gen: number): RequestMessage {
  return {
    kind: 'request',
    id: spareRequestId(label, seat, gen),
    labels: [label],
    requestor: SPARE_REQUESTOR,
    priority: SPARE_PRIORITY,
  };
}

/** A spare ready to be taken: ready, taken by no one, and not held by an operator (held: theirs). */
export function isFreeSpare(n: NodeRecord | undefined): n is NodeRecord {
  return n !== undefined && n.state === 'ready' && n.takenBy === undefined && !n.held;
}

/** A spare's request with its node taken by `taker` (a delivery `by`, at `at`): the next version. */
export function takenSpare(spare: RequestRecord, taker: string, by: string, at: number): RequestRecord {
  const [node, ...rest] = spare.nodes;
  if (!isFreeSpare(node)) throw new Error(`spare ${spare.id} is not free`);
  return {
    ...spare,
    nodes: [{ ...node, takenBy: { node: taker, by, at } }, ...rest],
    updatedAt: at,
    version: spare.version + 1,
  };
}

/**
 * The taker's node on the spare it took: ready at once, on the spare's slot, with its connection
 * details; it records the spare, whose slot and place it uses.
 */
export function nodeOnSpare(n: NodeRecord, spare: NodeRecord, now: number): NodeRecord {
  const { takenBy: _t, held: _h, reason: _r, releasedAt: _x, movedFrom: _m, ...details } = spare;
  return { ...details, id: n.id, label: n.label, state: 'ready', attempts: 1, readyAt: now, spare: spare.id };
}

/**
 * What becomes of a seat whose current spare is `spare` (its request as read; undefined when there is
 * none yet), given the taker's request where the spare was taken:
 * - `make`: no spare yet, or one still waiting to be placed: place it (again);
 * - `keep`: a live spare (pending or ready, untaken), or one taken by a delivery that may still record it;
 * - `advance`: the spare ended, or was taken and the taker recorded it: the seat moves on, a new spare;
 * - `orphan`: taken by a delivery known dead that never recorded it: end the spare, then advance.
 */
export type SeatStep = 'make' | 'keep' | 'advance' | 'orphan';

export function seatStep(
  spare: RequestRecord | undefined,
  taker: RequestRecord | undefined,
  takerDead: (since: number) => boolean,
): SeatStep {
  if (!spare || spare.state === 'requested') return 'make';
  const node = spare.nodes[0];
  if (spare.state === 'failed' || !node || node.state === 'released' || node.state === 'failed') {
    return 'advance';
  }
  if (!node.takenBy) return 'keep';
  const parsed = parseNodeId(node.takenBy.node);
  const takers = parsed ? taker?.nodes[parsed.index] : undefined;
  if (takers?.spare === node.id) return 'advance';
  return takerDead(node.takenBy.at) ? 'orphan' : 'keep';
}

/**
 * A label whose spares keep failing to launch backs off: each refill would otherwise spend
 * launch-retries launches per seat on every reaper run (300 RunInstances a minute at min-ready 100 and 3
 * retries), against the account's shared EC2 API budget. After `failures` failed spares in a row, no new
 * spare is made before `retryAt`: `baseMs` x `factor`^(failures - 1), at most `maxMs`. A spare that
 * becomes ready after the last failure resets it. Kept in the table (one item per label, beside its
 * seats), written conditionally on its version, since replenishers may run at once.
 */
export const MIN_READY_BACKOFF = { baseMs: 60_000, factor: 2, maxMs: 30 * 60_000 } as const;

export const LabelBackoff = z.object({
  /** Spares in a row that failed to launch (never became ready); 0: none since the last success. */
  failures: z.number().int().nonnegative(),
  /** When the last of them was found failed (epoch ms). */
  lastFailedAt: z.number(),
  /** No new spare of the label before this (epoch ms). */
  retryAt: z.number(),
  /** Why the last one failed (its request's reason). */
  reason: z.string().optional(),
  /** Optimistic-concurrency version: every write requires the one read. */
  version: z.number().int().positive(),
});
export type LabelBackoff = z.infer<typeof LabelBackoff>;

/** The label's backoff after one more failed spare, found failed at `now`. */
export function backoffAfterFailure(
  prev: LabelBackoff | undefined,
  now: number,
  reason?: string,
): LabelBackoff {
  const failures = (prev?.failures ?? 0) + 1;
  const { baseMs, factor, maxMs } = MIN_READY_BACKOFF;
  const wait = Math.min(maxMs, baseMs * factor ** (failures - 1));
  return {
    failures,
    lastFailedAt: now,
    retryAt: now + wait,
    ...(reason === undefined ? {} : { reason: boundedReason(reason) }),
    version: (prev?.version ?? 0) + 1,
  };
}

/** Whether no new spare of the label may be made now. */
export function backingOff(b: LabelBackoff | undefined, now: number): boolean {
  return b !== undefined && b.failures > 0 && now < b.retryAt;
}

/** Whether a spare's node shows the label launches again: ready since its last failure. */
export function endsBackoff(b: LabelBackoff | undefined, spare: NodeRecord | undefined): boolean {
  return b !== undefined && b.failures > 0 && spare?.readyAt !== undefined && spare.readyAt > b.lastFailedAt;
}

/** The label's backoff reset by a success. */
export function backoffCleared(prev: LabelBackoff): LabelBackoff {
  return {
    failures: 0,
    lastFailedAt: prev.lastFailedAt,
    retryAt: prev.lastFailedAt,
    version: prev.version + 1,
  };
}
