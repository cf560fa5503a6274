/** The options of PoolClient's waits and of `run` (client/poolClient.ts). */
import type { PoolRequest } from './records.ts';

/** How long and how to wait; every wait polls the table. */
export interface WaitOptions {
  /** Seconds (default 300). */
  readonly timeout?: number;
  /** Ends the wait with AbortedError. */
  readonly signal?: AbortSignal;
}

export interface WaitForOptions extends WaitOptions {
  /** Called at each poll whose state differs from the last: the request (undefined until recorded). */
  readonly onProgress?: (request: PoolRequest | undefined, elapsedMs: number) => void;
}

export interface RunOptions extends WaitForOptions {
  /** Seconds of lease when the spec has none (default 60, at least 10). */
  readonly lease?: number;
  /** Milliseconds between renewals (default: a third of the lease). */
  readonly renewEvery?: number;
  /** Seconds to wait for the release to be applied (default 30). */
  readonly releaseTimeout?: number;
  /** Told of a release that failed; without it such a failure is thrown when the job itself succeeded. */
  readonly onReleaseError?: (error: unknown) => void;
  /**
   * Run on a request of this id that is already in the table (someone else's, or a job's own from an
   * earlier attempt), and release it after. Without it such an id is refused: RequestExistsError.
   */
  readonly attach?: boolean;
}

/** What `run` gives its job: the request's nodes (ready) and a signal that fires when they are lost. */
export interface RunContext {
  readonly request: PoolRequest;
  /**
   * Aborted when the job should stop: the caller's signal fired, the pool stopped (PoolStoppedError), a
   * node was ended under it (NodeLostError); `signal.reason` says which.
   */
  readonly signal: AbortSignal;
}

/** `run`'s default lease, seconds: a dead client's nodes go within this (plus one reaper interval). */
export const DEFAULT_RUN_LEASE = 60;
