import { createHash, randomBytes } from 'node:crypto';

/**
 * Identifiers. Everything a handler creates has an id derived from its input, so a redelivered
 * message computes the same ids and its writes collide with (instead of duplicating) the first try.
 */

/** Client-chosen request ids: safe in URLs, shells and DynamoDB keys; `/` is reserved for node ids. */
export const requestIdPattern = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;

/** Request ids starting with this are the pool's own (min-ready, core/minReady.ts): no message may use one. */
export const SPARE_ID_PREFIX = 'min-ready:';

/** Node ids are `<requestId>/<index>`: the request item holds its nodes, so the id locates them. */
export function nodeId(requestId: string, index: number): string {
  return `${requestId}/${index}`;
}

export function parseNodeId(id: string): { requestId: string; index: number } | undefined {
  const cut = id.lastIndexOf('/');
  if (cut <= 0) return undefined;
  const requestId = id.slice(0, cut);
  const indexText = id.slice(cut + 1);
  if (!requestIdPattern.test(requestId) || !/^(0|[1-9][0-9]{0,3})$/.test(indexText)) return undefined;
  return { requestId, index: Number(indexText) };
}

/** The backing node launched for a node's placement attempt: the same inputs give the same id. */
export function backingNodeId(poolKey: string, label: string, forNodeId: string, attempt: number): string {
  const digest = createHash('sha256').update(`${poolKey}\n${label}\n${forNodeId}\n${attempt}`).digest('hex');
  return `bn-${digest.slice(0, 16)}`;
}

/** Which receive of which queue message a delivery handles (SQS's message id and receive count). */
export interface DeliveryOf {
  readonly messageId: string;
  readonly receiveCount: number;
}

/**
 * An owner token: names one delivery (one handling of a message, one re-homing) so that the claims and
 * reservations it takes can be told from those of a concurrent delivery of the same message. It
 * starts with the delivery's start time (base 36 ms), from which its age is read. A delivery of a queue
 * message adds which message (a hash of its id) and which receive of it: `<since>.<random>.<message>-<n>`.
 */
export function ownerToken(now: number, delivery?: DeliveryOf): string {
  const token = `${Math.max(0, Math.floor(now)).toString(36)}.${randomBytes(6).toString('hex')}`;
  if (!delivery) return token;
  const message = createHash('sha256').update(delivery.messageId).digest('hex').slice(0, 12);
  return `${token}.${message}-${Math.max(1, Math.floor(delivery.receiveCount))}`;
}

/** When the delivery that holds an owner token started (0 for a token of unknown shape: very old). */
export function ownerSince(token: string): number {
  const since = /^([0-9a-z]+)\./.exec(token)?.[1];
  return since === undefined ? 0 : Number.parseInt(since, 36);
}

const deliveryToken = /^[0-9a-z]+\.[0-9a-f]{12}\.([0-9a-f]{12})-([1-9][0-9]*)$/;

/**
 * Whether the delivery `mine` handles a later receive of the same queue message than `theirs`. SQS
 * gives a message out again only once the delivery that received it before let it go (it failed) or
 * its visibility timeout ran out, so `theirs` is done with it or about to be; it may still be running
 * (an invocation started late, a duplicate copy), so a delivery that takes over what it holds first
 * makes itself the request's placer (a conditional write), after which `theirs` can record nothing
 * (requestNodes.ts, Recording.fence). Tokens without a message (re-homing) are never superseded.
 */
export function supersedes(mine: string, theirs: string): boolean {
  const a = deliveryToken.exec(mine);
  const b = deliveryToken.exec(theirs);
  return a !== null && b !== null && a[1] === b[1] && Number(a[2]) > Number(b[2]);
}

/** Stable hash of a JSON-able value (keys sorted), used to detect a reused request id. */
export function contentHash(value: unknown): string {
  return createHash('sha256').update(canonicalJson(value)).digest('hex').slice(0, 32);
}

function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value && typeof value === 'object') {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
  }
  return JSON.stringify(value);
}
