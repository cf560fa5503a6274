import type { Page } from '../../core/poolStore.ts';
import type { BackingRecord } from '../../core/records.ts';
import type { FailBacking } from './backingNodes.ts';

/** Where a node went: its backing node as it was right after the claim. */
export interface Placement {
  readonly nodeId: string;
  readonly backing: BackingRecord;
  readonly slot: number;
  /** Host keys scanned at claim time (host-key-checking on a ready backing node). */
  readonly hostKeys?: string[];
  /** Which attempt (backing nodes tried for this node, launch-retries bounds it) this placement is. */
  readonly attempt: number;
}

export interface PlaceOptions {
  /**
   * The owner token of the delivery placing the node: its claims carry it, and only claims it holds
   * are built on or given back by it. A claim another delivery holds makes the placement fail with a
   * BusyError, unless that delivery is known dead (CLAIM_TAKEOVER_MS), when the claim is taken over.
   */
  readonly owner: string;
  /** Called before launching a backing node, the one side effect a duplicate must never repeat. */
  readonly beforeLaunch?: () => Promise<void>;
  /**
   * Called before taking over a claim or place of a delivery this one supersedes (an earlier receive of
   * the same message, core/ids.ts): it must make sure that delivery can record nothing more (the request
   * delivery makes itself the placer). Without it, such claims are taken over only once abandoned.
   */
  readonly beforeTakeover?: () => Promise<void>;
  /** Attempts this node already used (re-homing after a failed backing node). */
  readonly previousAttempts?: number;
  /** Fails a backing node whose host-key scan fails, and settles its nodes (see FailBacking). */
  readonly failBacking: FailBacking;
  /**
   * When the node is expected to be released (its request's expected duration): candidates are tried
   * by how much longer the node would keep each billed (compareByExpectedEnd), and the claim records it.
   */
  readonly expectedEnd?: number;
  /**
   * False: the expected end is only recorded (a learned guess too rough to place by), and candidates
   * are tried in the usual order. Default true.
   */
  readonly orderByExpectedEnd?: boolean;
  /**
   * The first page of candidates, asked for ahead (prefetchCandidates) while the caller did something
   * else; undefined in it (the Query failed) means asking again.
   */
  readonly firstPage?: Promise<Page<BackingRecord> | undefined>;
}
