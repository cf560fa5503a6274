import { SPARE_ID_PREFIX } from './ids.ts';
import type { MetastaticPool, ResolvedConfig } from './model.ts';
import type { RequestRecord } from './records.ts';

/**
 * Request priority, as Nodepool orders node requests: a lower number first, then the older request
 * (then the id, so the order is total). A request without `priority` has DEFAULT_REQUEST_PRIORITY.
 */
export const DEFAULT_REQUEST_PRIORITY = 100;

/**
 * Priorities a message, the CLI or a configuration may give: -MAX_PRIORITY to MAX_PRIORITY. Only their
 * order matters; the bound keeps them plain integers (docs/messages.md, docs/configuration.md).
 */
export const MAX_PRIORITY = 1_000_000;

/** The priority a request claimed (`priority`, else the default): what its message says. */
export const claimedPriorityOf = (r: Pick<RequestRecord, 'priority'>): number =>
  r.priority ?? DEFAULT_REQUEST_PRIORITY;

/** The priority a request is served at: what it claimed, held to its requestor's ceiling if one bound it. */
export const priorityOf = (r: Pick<RequestRecord, 'priority' | 'priorityCeiling'>): number =>
  Math.max(claimedPriorityOf(r), r.priorityCeiling ?? Number.NEGATIVE_INFINITY);

/** What orders requests: class (from the id), served priority, age, id (servedBefore, the store's sort key). */
export type ServiceOrder = Pick<RequestRecord, 'id' | 'priority' | 'priorityCeiling' | 'createdAt'>;

/**
 * The best (lowest) priority a request of `labels` by `requestor` may claim (`priority-ceiling`), or
 * undefined when none bounds it: for each label, its own ceiling else the top-level one, the requestor's
 * entry else the ceiling's `default`; of several labels, the worst (highest) ceiling, so a request cannot
 * get ahead in one label's queue by naming another label beside it.
 */
export function priorityCeilingOf(
  config: Pick<ResolvedConfig, 'priorityCeiling' | 'labelPriorityCeilings'>,
  labels: readonly string[],
  requestor: string | undefined,
): number | undefined {
  let worst: number | undefined;
  for (const label of labels) {
    const ceiling = config.labelPriorityCeilings.get(label) ?? config.priorityCeiling;
    if (!ceiling) continue;
    const bound =
      (requestor === undefined ? undefined : ceiling.requestors.get(requestor)) ?? ceiling.default;
    if (bound !== undefined && (worst === undefined || bound > worst)) worst = bound;
  }
  return worst;
}

/**
 * The request as it is served: a claimed priority better than its requestor's ceiling (priorityCeilingOf)
 * is served at the ceiling (clamped, not refused: the request is still served, behind those its ceiling
 * puts ahead of it), recorded in `priorityCeiling`; `priority` stays as the message said it (part of its
 * body: a redelivery must hash the same). The pool's own min-ready requests are never bounded (they are
 * served in a class of their own). Requestors are not authenticated: the ceiling holds a careless
 * sender to its place, not one that names a trusted requestor (docs/threat-model.md).
 */
export function trustedPriority(
  config: Pick<ResolvedConfig, 'priorityCeiling' | 'labelPriorityCeilings'>,
  r: RequestRecord,
): RequestRecord {
  const { priorityCeiling: _earlier, ...rest } = r;
  if (requestClass(r) === 1) return rest;
  const ceiling = priorityCeilingOf(config, r.labels, r.requestor);
  if (ceiling === undefined || claimedPriorityOf(r) >= ceiling) return rest;
  return { ...rest, priorityCeiling: ceiling };
}

/**
 * The class a request is served in, before its priority is looked at: 0 for every request a message
 * made, 1 for the pool's own min-ready requests (core/minReady.ts), so spares come after every request
 * by construction, not by a number a client could exceed (no message may use a `min-ready:` id).
 */
export const requestClass = (r: Pick<RequestRecord, 'id'>): 0 | 1 =>
  r.id.startsWith(SPARE_ID_PREFIX) ? 1 : 0;

/** Whether `a` is served before `b`: by class, then priority, then age, then id. */
export function servedBefore(a: ServiceOrder, b: ServiceOrder): boolean {
  if (requestClass(a) !== requestClass(b)) return requestClass(a) < requestClass(b);
  if (priorityOf(a) !== priorityOf(b)) return priorityOf(a) < priorityOf(b);
  if (a.createdAt !== b.createdAt) return a.createdAt < b.createdAt;
  return a.id < b.id;
}

/**
 * The waiting request `me` must let go first in `pool`, if any: the first by priority among those that
 * wait (state `requested`), are served before `me`, and fit in the room `me` would take: labels the pool
 * offers, each one `me` asks for too, and no more nodes than `me`. Only such a request is sure to use
 * that room; one that waits for something else (another label's backing pool at its cap) never holds
 * `me` back, so a waiting request can never block capacity it cannot use. The price: between requests
 * of different labels that share only the pool's max-servers, priority is not enforced.
 */
export function waitingAhead(
  me: RequestRecord,
  waiting: readonly RequestRecord[],
  pool: Pick<MetastaticPool, 'labels'>,
): RequestRecord | undefined {
  const mine = new Set(me.labels);
  let first: RequestRecord | undefined;
  for (const r of waiting) {
    if (r.id === me.id || r.state !== 'requested' || !servedBefore(r, me)) continue;
    if (r.labels.length > me.labels.length) continue;
    if (!r.labels.every((l) => mine.has(l) && pool.labels.has(l))) continue;
    if (!first || servedBefore(r, first)) first = r;
  }
  return first;
}
