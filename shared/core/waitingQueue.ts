import { z } from 'zod';
import type { MetastaticPool } from './model.ts';
import type { RequestRecord } from './records.ts';

/**
 * Waiting queues: the requests still waiting to be placed, grouped by the shape of their node set (its
 * distinct labels and its number of nodes), each queue in service order (class, priority, age, id:
 * core/priority.ts). The store keeps each queue as one partition of the reap index and a registry of the
 * queues that may hold requests (docs/table.md, Waiting queues).
 *
 * Why shapes: whether a waiting request must go before another one (`waitingAhead`) depends only on its
 * shape and its place in the service order. Every request of a queue fits where `me` would go, or none
 * does; so the first one of each queue that fits, served before `me`, tells the answer, and a delivery
 * reads one item per such queue, however many requests wait. Reading every waiting request instead would
 * make the reads grow with the number waiting, and every waiting request comes back every visibility
 * timeout.
 */
export interface WaitingQueue {
  /** The distinct labels of its node sets, sorted. */
  readonly labels: readonly string[];
  /** The number of nodes of each of its node sets. */
  readonly count: number;
}

/** A queue as the registry holds it: `registeredAt` is the last time a writer announced it. */
export const RegisteredQueue = z.object({
  labels: z.array(z.string()),
  count: z.number().int().nonnegative(),
  registeredAt: z.number(),
});
export type RegisteredQueue = z.infer<typeof RegisteredQueue>;

/** The queue a request waits in. */
export function queueOf(r: Pick<RequestRecord, 'labels'>): WaitingQueue {
  return { labels: [...new Set(r.labels)].sort(), count: r.labels.length };
}

/**
 * Whether the requests of queue `q` are those `waitingAhead` looks at for `me` in `pool`: labels the pool
 * offers, each one `me` asks for too, and no more nodes than `me`.
 */
export function queueFits(
  q: WaitingQueue,
  me: Pick<RequestRecord, 'labels'>,
  pool: Pick<MetastaticPool, 'labels'>,
): boolean {
  const mine = new Set(me.labels);
  return q.count <= me.labels.length && q.labels.every((l) => mine.has(l) && pool.labels.has(l));
}

/** Whether the requests of queue `q` ask for `label` and can all be placed in `pool` (a freed place's hand-off). */
export function queueAsksFor(q: WaitingQueue, label: string, pool: Pick<MetastaticPool, 'labels'>): boolean {
  return q.labels.includes(label) && q.labels.every((l) => pool.labels.has(l));
}

/**
 * A writer announces a queue again once its own announcement is this old (each store instance remembers
 * what it announced), so a queue in use is never older than this in the registry plus a write's time.
 */
export const QUEUE_REANNOUNCE_MS = 5 * 60_000;

/**
 * The reaper forgets a queue it finds empty once no writer announced it for this long: three times the
 * re-announcement period, so a writer that relied on its own announcement has long written its request
 * (a delivery stops within 30 s, DELIVERY_DEADLINE_MS) and the index shows it.
 */
export const QUEUE_FORGET_MS = 15 * 60_000;

/**
 * A delivery's priority check and a release's hand-off reuse their store's last read of the registry for
 * this long (WaitingQueues.list): the registry changes only when a new shape starts waiting, and a waiting
 * request comes back at its next receive (seconds in the embedded pool, the visibility timeout on AWS)
 * anyway. A queue another function instance announced is thus seen up to this much later; what this
 * store announced or forgot, at once.
 */
export const REGISTRY_REUSE_MS = 5_000;
