import type { PoolMessage } from '../shared/core/messages.ts';
import type { RequestRecord } from '../shared/core/records.ts';
import type { PoolConnection } from './connection.ts';
import { PoolStoppedError } from './errors.ts';
import { sleep } from './leaseKeeper.ts';

/** How often a wait reads the table. */
export const POLL_MS = 100;

/**
 * PoolClient's reads of the table and sends to the request queue: a queue or table that no longer
 * exists, or an embedded pool that has stopped, is PoolStoppedError whatever the SDK called it; and the
 * polling of a request that every wait for an outcome is made of.
 */
export class PoolAccess {
  constructor(private readonly connection: PoolConnection) {}

  /** Reads a request; a table that no longer exists is a stopped pool. */
  async read(requestId: string): Promise<RequestRecord | undefined> {
    try {
      return await this.connection.store.getRequest(requestId);
    } catch (err) {
      throw (await this.stopped(err)) ?? err;
    }
  }

  async send(message: PoolMessage): Promise<void> {
    try {
      await this.connection.send(message);
    } catch (err) {
      throw (await this.stopped(err)) ?? err;
    }
  }

  /** Reads the request every POLL_MS until `done` holds or `timeout` seconds pass; returns the last read. */
  async poll(
    requestId: string,
    done: (r: RequestRecord | undefined) => boolean,
    timeout: number,
    signal: AbortSignal | undefined,
  ): Promise<RequestRecord | undefined> {
    const deadline = Date.now() + timeout * 1000;
    let r = await this.read(requestId);
    while (!done(r) && Date.now() < deadline) {
      await sleep(POLL_MS, signal);
      r = await this.read(requestId);
    }
    return r;
  }

  /** The PoolStoppedError an error means, if it means one. */
  private async stopped(err: unknown): Promise<PoolStoppedError | undefined> {
    const name = (err as { name?: string })?.name ?? '';
    if (/QueueDoesNotExist|NonExistentQueue|ResourceNotFoundException/.test(name)) {
      return new PoolStoppedError(`the pool's queue or table no longer exists: ${(err as Error).message}`, {
        cause: err,
      });
    }
    try {
      await this.connection.checkRunning();
    } catch (stoppedErr) {
      if (stoppedErr instanceof PoolStoppedError) return stoppedErr;
    }
    return undefined;
  }
}
