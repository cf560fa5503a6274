/**
 * What `PoolClient.run` does beside the job: keeps the request's lease and watches its nodes and the pool
 * (client/poolClient.ts), and the waits it is made of.
 */
import { holdsAnything } from '../shared/core/leases.ts';
import type { RequestRecord } from '../shared/core/records.ts';
import { AbortedError, MetastaticError, NodeLostError, PoolStoppedError } from './errors.ts';
import { type PoolRequest, toPoolNode } from './records.ts';

/**
 * How often `run` checks an embedded pool and its nodes while the job runs (a file and a loopback read).
 * On a stack each check is a DynamoDB read, so it checks at each renewal instead (lease/3: 20 s by
 * default), not every second for as long as every job runs.
 */
export const EMBEDDED_WATCH_MS = 1000;

/** How long `run` waits between two checks of its request (and renewals, when due), in ms. */
export function watchInterval(pool: 'embedded' | 'stack', renewEveryMs: number): number {
  return pool === 'embedded' ? Math.min(EMBEDDED_WATCH_MS, renewEveryMs) : renewEveryMs;
}

/** What the lease keeper needs of the client. */
export interface LeasePort {
  readonly pool: 'embedded' | 'stack';
  /** Throws PoolStoppedError when the pool has stopped. */
  checkRunning(): Promise<void>;
  read(requestId: string): Promise<RequestRecord | undefined>;
  renew(requestId: string): Promise<void>;
}

/**
 * Keeps a request's lease while `run` waits and its job runs: renews it every `renewEvery` ms once the
 * request is recorded, and (with `watch`) checks that its nodes are still ready and the pool still
 * running, aborting `stop` with the reason when not. A renewal that fails for a passing reason (the
 * queue, the network) is tried again at the next tick: the lease is three ticks long.
 */
export function keepLease(port: LeasePort, requestId: string, renewEvery: number, stop: AbortController) {
  let watched: PoolRequest | undefined;
  let lastRenewal = Date.now();
  let running = true;
  const tick = async () => {
    await port.checkRunning();
    const r = await port.read(requestId);
    if (watched && r) checkNodesHeld(r);
    if (r && Date.now() - lastRenewal >= renewEvery && holdsAnything(r)) {
      lastRenewal = Date.now();
      await port.renew(requestId);
    }
  };
  const loop = (async () => {
    while (running && !stop.signal.aborted) {
      await sleep(watchInterval(port.pool, renewEvery), stop.signal).catch(() => undefined);
      if (!running || stop.signal.aborted) break;
      try {
        await tick();
      } catch (err) {
        if (err instanceof PoolStoppedError || err instanceof NodeLostError) stop.abort(err);
        // Anything else passes: the next tick tries again, well within the lease.
      }
    }
  })();
  return {
    watch(request: PoolRequest) {
      watched = request;
    },
    async stop() {
      running = false;
      await loop;
    },
  };
}

/** NodeLostError when a node of a fulfilled request is no longer ready, or its lease lapsed. */
export function checkNodesHeld(r: RequestRecord): void {
  const lost = r.nodes.find((n) => n.state !== 'ready');
  if (lost) throw new NodeLostError(toPoolNode(lost));
  const first = r.nodes[0];
  if (r.leaseLapsedAt !== undefined && first) {
    throw new NodeLostError(toPoolNode(first), `the lease of request ${r.id} lapsed`);
  }
}

export function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted)
    throw signal.reason instanceof MetastaticError ? signal.reason : new AbortedError(signal.reason);
}

/** Sleeps `ms`, or rejects (AbortedError, or the signal's own MetastaticError) when `signal` fires. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason instanceof MetastaticError ? signal.reason : new AbortedError(signal.reason));
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason instanceof MetastaticError ? signal.reason : new AbortedError(signal?.reason));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
