import { randomBytes } from 'node:crypto';
import { parseNodeId, requestIdPattern } from '../shared/core/ids.ts';
import { MAX_NODE_SET, RenewMessage, RequestMessage } from '../shared/core/messages.ts';
import { isSpareRequestId } from '../shared/core/minReady.ts';
import { InvalidInputError } from './errors.ts';

/**
 * What a client sends, checked before it is sent: a request spec made a request message (every field
 * that is wrong named at once), renew messages, node and request ids a message may carry.
 */

/** What one node of a request by shape needs: at least one of them. Sizes as `"4GiB"`, `"512MiB"`. */
export interface Shape {
  readonly cores?: number;
  readonly memory?: string;
  readonly disk?: string;
}

/** A request: `labels` (one node each, a node set served all-or-nothing), or `shape` (and `count`). */
export interface RequestSpec {
  /** Default: `req-<base36 time>-<6 hex>`. Re-sending the same id never allocates twice. */
  readonly id?: string;
  readonly labels?: readonly string[];
  readonly shape?: Shape;
  /** With `shape`: how many nodes of it (default 1). */
  readonly count?: number;
  /** Who asks, recorded with the request. */
  readonly requestor?: string;
  /** Lower first (default: the pool's, 100). */
  readonly priority?: number;
  /** Seconds the nodes will be kept: placed beside nodes expected to end about then. */
  readonly expectedDuration?: number;
  /** Seconds of client lease: renew it (`renew`) or the reaper releases the nodes. */
  readonly lease?: number;
}

/** A request id of `[A-Za-z0-9._:-]`, unique enough: `req-<base36 time>-<6 hex>`. */
export function newRequestId(): string {
  return `req-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
}

/** The request message of a spec, or InvalidInputError naming each field that is wrong. */
export function requestMessage(spec: RequestSpec): RequestMessage {
  const id = spec.id ?? newRequestId();
  const shaped = spec.shape !== undefined;
  if (shaped && spec.labels !== undefined) throw new InvalidInputError('give labels or a shape, not both');
  if (!shaped && (spec.labels === undefined || spec.labels.length === 0)) {
    throw new InvalidInputError('give the labels to request, or a shape (cores, memory, disk)');
  }
  if (!shaped && spec.count !== undefined) {
    throw new InvalidInputError('count goes with a shape; repeat a label to ask for more nodes');
  }
  const count = spec.count ?? 1;
  if (!Number.isInteger(count) || count < 1 || count > MAX_NODE_SET) {
    throw new InvalidInputError(`count must be a whole number from 1 to ${MAX_NODE_SET}`, [
      { path: 'count', message: `must be a whole number from 1 to ${MAX_NODE_SET}` },
    ]);
  }
  const parsed = RequestMessage.safeParse({
    kind: 'request',
    id,
    ...(shaped
      ? { shapes: Array.from({ length: count }, () => ({ ...spec.shape })) }
      : { labels: [...(spec.labels ?? [])] }),
    ...(spec.requestor === undefined ? {} : { requestor: spec.requestor }),
    ...(spec.priority === undefined ? {} : { priority: spec.priority }),
    ...(spec.expectedDuration === undefined ? {} : { 'expected-duration': spec.expectedDuration }),
    ...(spec.lease === undefined ? {} : { lease: spec.lease }),
  });
  if (!parsed.success) throw invalid(parsed.error.issues, 'request');
  return parsed.data;
}

/** The renew message for a request id and an optional new length, or InvalidInputError. */
export function renewMessage(requestId: string, lease?: number): RenewMessage {
  const parsed = RenewMessage.safeParse({
    kind: 'renew',
    id: requestId,
    ...(lease === undefined ? {} : { lease }),
  });
  if (!parsed.success) throw invalid(parsed.error.issues, 'renew');
  return parsed.data;
}

/** InvalidInputError from zod issues: `path: message` each, once. */
function invalid(
  issues: readonly { path: PropertyKey[]; message: string }[],
  what: string,
): InvalidInputError {
  const list = issues.map((i) => ({ path: i.path.map(String).join('.') || what, message: i.message }));
  const lines = [...new Set(list.map((i) => `${i.path}: ${i.message}`))];
  return new InvalidInputError(lines.join('\n'), list);
}

export function checkNodeId(nodeId: string): { requestId: string; index: number } {
  const parsed = parseNodeId(nodeId);
  if (!parsed) {
    throw new InvalidInputError(`"${nodeId}" is not a node id (node ids look like <request-id>/<index>)`);
  }
  return parsed;
}

/** A request id a message may name: not one of the pool's own min-ready requests. */
export function checkClientRequestId(requestId: string): void {
  if (!requestIdPattern.test(requestId)) throw new InvalidInputError(`"${requestId}" is not a request id`);
  if (isSpareRequestId(requestId)) {
    throw new InvalidInputError(
      `"${requestId}" is one of the pool's own min-ready requests: no message may end it`,
    );
  }
}
