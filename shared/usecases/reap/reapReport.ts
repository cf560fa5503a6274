export interface ReapReport {
  /** Backing nodes marked retiring this run. */
  readonly retired: string[];
  /** Backing nodes whose resource is confirmed gone this run. */
  readonly stopped: string[];
  /** Backing nodes failed this run (deadline passed, resource vanished), with the reason. */
  readonly failed: string[];
  /** Nodes moved off failed backing nodes this run. */
  readonly moved: number;
  /** Resources tagged as ours with no live record, terminated this run. */
  readonly orphans: string[];
  /** Slots given back because no recorded node confirmed their claim within the lease. */
  readonly reclaimedSlots: number;
  /**
   * Places in a max-servers set given back because nothing live holds them: reserved by a delivery that
   * died before it recorded what it reserved them for.
   */
  readonly reclaimedPlaces: number;
  /** Nodes left pending on a backing node that had become ready (its readying cut short), readied this run. */
  readonly nodesReadied: number;
  /**
   * Requests ended `failed` this run because they were still waiting past their request-timeout (their
   * message may be gone: see waiting.ts), or still pending past their deadline (pending.ts).
   */
  readonly expiredRequests: string[];
  /** Requests whose client lease lapsed, released (held nodes kept) or failed this run (leases.ts). */
  readonly leasesExpired?: string[];
  /** spares placed this run (seats refilled), and ended (on a backing node taking no new nodes, taken by a dead delivery, above a lowered min-ready). */
  readonly minReadyMade: number;
  readonly minReadyEnded: number;
  /** Free spares moved onto a fuller backing node this run (replenish.ts), so emptier ones can go. */
  readonly minReadyMoved: number;
  /** Retirements lost to a concurrent change (an allocation won): the backing node stays. */
  readonly conflicts: number;
  readonly errors: string[];
  /**
   * Steps left for the next run because the invocation's time ran short (Context.deadline): not started,
   * or a check cut short. Not errors: the next run does them.
   */
  readonly deferred: number;
  /**
   * Wall time of each part of the run that ran, ms: `read` (the reap partitions), `reconcile`, then each
   * step (core/reaperSteps.ts) under its name. For the log and the bench; no decision depends on it.
   */
  readonly stepMs?: Readonly<Record<string, number>>;
  /** The earliest instant an idle backing node seen this run becomes due (schedule the next run by it). */
  readonly nextCheckAt?: number;
}

export type MutableReport = { -readonly [K in keyof ReapReport]: ReapReport[K] };
