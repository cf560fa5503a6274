import { LEGACY_CONTRACT, nodeContract } from './contract.ts';
import { contentHash, nodeId } from './ids.ts';
import type { RequestMessage } from './messages.ts';
import { nodeAttributes } from './pools.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from './records.ts';
import { assertTransition, type RequestState } from './states.ts';
import { boundedReason } from './text.ts';

/**
 * Pure transitions of a request and its nodes, as core/backing.ts is for backing nodes. Each returns
 * the next record (version + 1, updatedAt now) and checks its transitions against core/states.ts; the
 * use cases write it with the condition that the stored version is still the one they read.
 *
 * The request's own state follows from its nodes (settledState); every path that changes nodes goes
 * through it:
 *
 * | request   | its nodes after the change                 | request becomes |
 * | --------- | ------------------------------------------ | --------------- |
 * | requested | (placing it is placedRequest's decision)   | requested       |
 * | pending   | every one ready or released                | fulfilled       |
 * | pending   | any failed                                 | failed          |
 * | pending   | otherwise (some still pending)             | pending         |
 * | fulfilled | anything                                   | fulfilled       |
 * | failed    | anything                                   | failed          |
 */

/**
 * The record of a request as received: `requested`, nothing placed, version 0. A request by shape takes
 * the labels the pool chose for its shapes (shared/usecases/place/shapes.ts); none when none fits, and then it
 * is only ever recorded failed.
 */
export function requestedRecord(
  m: RequestMessage,
  now: number,
  chosen: readonly string[] = m.labels ?? [],
): RequestRecord {
  const labels = [...chosen];
  return {
    id: m.id,
    labels,
    requestor: m.requestor,
    priority: m.priority,
    expectedDuration: m['expected-duration'],
    ...(m.shapes === undefined ? {} : { shapes: m.shapes }),
    bodyHash: requestBodyHash(m),
    state: 'requested',
    createdAt: now,
    updatedAt: now,
    version: 0,
    nodes: labels.map((label, i) => ({ id: nodeId(m.id, i), label, state: 'requested' })),
  };
}

/**
 * What tells a redelivery (same hash) from a reuse of the request id with another body. A request by
 * shape hashes its shapes, not the labels chosen for them: every delivery of it hashes the same.
 */
export function requestBodyHash(
  m: Pick<RequestMessage, 'labels' | 'shapes' | 'requestor' | 'priority' | 'expected-duration'>,
): string {
  return contentHash({
    labels: m.labels,
    shapes: m.shapes,
    requestor: m.requestor,
    priority: m.priority,
    'expected-duration': m['expected-duration'],
  });
}

/** The state a request takes when its nodes become `nodes` (the table above), with the reason if failed. */
export function settledState(
  state: RequestState,
  nodes: readonly NodeRecord[],
): { readonly state: RequestState; readonly reason?: string } {
  if (state !== 'pending') return { state };
  if (nodes.every((n) => n.state === 'ready' || n.state === 'released')) return { state: 'fulfilled' };
  const failed = nodes.find((n) => n.state === 'failed');
  if (failed) return { state: 'failed', reason: failed.reason ?? 'a node failed' };
  return { state };
}

/** The request with its nodes replaced, its state settled by them (settledState). */
export function withNodes(r: RequestRecord, nodes: NodeRecord[], now: number): RequestRecord {
  const settled = settledState(r.state, nodes);
  const next: RequestRecord = { ...r, nodes, updatedAt: now, version: r.version + 1 };
  if (settled.state === r.state) return next;
  assertTransition('request', r.state, settled.state);
  return {
    ...next,
    state: settled.state,
    ...(settled.reason === undefined ? {} : { reason: settled.reason }),
  };
}

/** Where a node is placed: a slot of a backing node, as the backing node was right after the claim. */
export interface NodePlace {
  readonly backing: BackingRecord;
  readonly slot: number;
  /** Which attempt (backing nodes tried for this node; launch-retries bounds it) this place is. */
  readonly attempt: number;
  /** Host keys scanned at claim time (host-key-checking); else the backing node's own. */
  readonly hostKeys?: string[];
}

/**
 * A node placed on a slot: `ready` with its connection details when the backing node is ready,
 * `pending` (waiting for it) otherwise. Also how a waiting node moves to another backing node.
 */
export function placedNode(
  n: NodeRecord,
  place: NodePlace,
  poolAttributes: Readonly<Record<string, unknown>>,
  now: number,
): NodeRecord {
  const ready = place.backing.state === 'ready';
  const state = ready ? 'ready' : 'pending';
  if (n.state !== state) assertTransition('node', n.state, state); // pending -> pending: a move
  const placed: NodeRecord = {
    ...n,
    state,
    backingNodeId: place.backing.id,
    slot: place.slot,
    attempts: place.attempt,
  };
  return ready ? connected(placed, place.backing, poolAttributes, place.hostKeys, now) : placed;
}

/** A pending node whose backing node became ready: `ready`, with its connection details. */
export function readyNode(
  n: NodeRecord,
  backing: BackingRecord,
  poolAttributes: Readonly<Record<string, unknown>>,
  hostKeys: string[] | undefined,
  now: number,
): NodeRecord {
  assertTransition('node', n.state, 'ready');
  return connected({ ...n, state: 'ready' }, backing, poolAttributes, hostKeys, now);
}

function connected(
  n: NodeRecord,
  backing: BackingRecord,
  poolAttributes: Readonly<Record<string, unknown>>,
  hostKeys: string[] | undefined,
  now: number,
): NodeRecord {
  const username = slotUsername(backing, n.slot);
  return {
    ...n,
    host: backing.host,
    port: backing.port,
    // Nodepool's metastatic adapter copies these from the backing node to every node it serves.
    ...nodeContract(backing.contract ?? LEGACY_CONTRACT, n.slot),
    attributes: nodeAttributes(backing.attributes, poolAttributes),
    hostKeys: hostKeys ?? hostKeysOf(backing),
    ...(username !== undefined ? { username } : {}),
    readyAt: now,
  };
}

/**
 * The user a node on `slot` logs in as, when its backing node serves one user per slot: the provider
 * reports the prefix in its attributes (`slotUserPrefix`; local backing nodes: `slot`, so `slot0`, ...).
 */
export function slotUsername(b: BackingRecord, slot: number | undefined): string | undefined {
  const prefix = b.attributes?.slotUserPrefix;
  return typeof prefix === 'string' && slot !== undefined ? `${prefix}${slot}` : undefined;
}

/** The backing node's own host keys, which a node takes when host-key-checking is off. */
export function hostKeysOf(b: BackingRecord): string[] | undefined {
  const keys = b.attributes?.hostKeys;
  return Array.isArray(keys) && keys.every((k) => typeof k === 'string') ? (keys as string[]) : undefined;
}

/**
 * A waiting request with every node placed: `fulfilled` when every node is ready at once, `pending`
 * otherwise. No delivery places it any more (the placer is dropped).
 */
export function placedRequest(
  base: RequestRecord,
  poolKey: string,
  nodes: NodeRecord[],
  now: number,
): RequestRecord {
  const state = nodes.every((n) => n.state === 'ready') ? 'fulfilled' : 'pending';
  assertTransition('request', base.state, state);
  const { placer: _placed, ...rest } = base;
  return { ...rest, state, poolKey, nodes, updatedAt: now, placedAt: now, version: base.version + 1 };
}

/**
 * The request failed as a whole with the reason (bounded: it is stored on the request and each node
 * it fails, within DynamoDB's item limit). `which` picks the nodes that fail; by default every one
 * still live (a waiting or placed node set is all or nothing).
 */
export function failedRequest(
  r: RequestRecord,
  why: string,
  now: number,
  which: (n: NodeRecord) => boolean = isLive,
): RequestRecord {
  const reason = boundedReason(why);
  assertTransition('request', r.state, 'failed');
  const { placer: _ended, ...rest } = r;
  return {
    ...rest,
    state: 'failed',
    reason,
    nodes: r.nodes.map((n) => (which(n) ? failedNode(n, reason) : n)),
    updatedAt: now,
    version: r.version + 1,
  };
}

/** A live node failed with the (bounded) reason. */
export function failedNode(n: NodeRecord, reason: string): NodeRecord {
  assertTransition('node', n.state, 'failed');
  return { ...n, state: 'failed', reason: boundedReason(reason) };
}

/** A node not yet ended: waiting to be placed, waiting for its backing node, or ready. */
export function isLive(n: NodeRecord): boolean {
  return n.state === 'requested' || n.state === 'pending' || n.state === 'ready';
}

/** A node that holds its slot on `backingId`: placed there (pending or ready) on that slot. */
export function holdsSlot(n: NodeRecord | undefined, backingId: string, slot: number): boolean {
  return (
    n !== undefined &&
    n.backingNodeId === backingId &&
    n.slot === slot &&
    (n.state === 'pending' || n.state === 'ready')
  );
}

/** The node kept by an operator: only an explicit (forced) release frees it. */
export function heldNode(n: NodeRecord): NodeRecord {
  return { ...n, held: true };
}

/**
 * The body hash of a request cancelled before its message was received (SQS does not keep the order
 * of messages, and a cancel can be handled before the request it names): no message hashes to it. The
 * request message, when it comes, is taken for a late delivery of a request that has ended: it places
 * nothing, and the request stays cancelled.
 */
export const CANCELLED_BEFORE_RECEIVED = 'cancelled-before-received';
