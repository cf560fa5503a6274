import type { BackingContract } from './contract.ts';

/**
 * The resolved configuration the core works with: defaults applied, inheritance (provider -> pool -> label)
 * resolved, references checked. The YAML schema (schema.ts) is the user-facing shape; this is what every
 * handler receives.
 */

/** What a slot gives, or what a node needs: cores, and sizes in MiB. An absent key is unknown / not asked. */
export interface Shape {
  readonly cores?: number;
  readonly memoryMiB?: number;
  readonly diskMiB?: number;
}

/** A metastatic label as offered by one metastatic pool. */
export interface MetastaticLabel {
  readonly name: string;
  readonly backingLabel: string;
  /** Slots per backing node. */
  readonly maxParallelJobs: number;
  /** Seconds an empty backing node is kept after its last slot was freed. */
  readonly graceTime: number;
  /** Seconds after launch before a backing node may be released. */
  readonly minRetentionTime: number;
  /** Seconds after launch after which the backing node takes no new nodes; undefined = off. */
  readonly maxAge: number | undefined;
  readonly hostKeyChecking: boolean;
  /** Seconds a request for this label may wait to be placed (request-timeout: label, pool or provider). */
  readonly requestTimeout: number;
  /** Seconds of lease a request for this label takes when it asks for none (default-lease); unset = none. */
  readonly defaultLease?: number;
  /** The longest lease a request for this label may take or renew (max-lease); unset = no bound. */
  readonly maxLease?: number;
  /**
   * What one slot gives, for requests by shape (core/shapes.ts): the label's cores, memory and disk, else
   * derived from the backing instance type divided by max-parallel-jobs. Undefined when nothing is known:
   * no request by shape is served by this label.
   */
  readonly slot?: Shape;
  /** What one slot costs an hour: the backing label's hourly-cost (or its instance type's) / max-parallel-jobs. */
  readonly slotHourlyCost?: number;
}

/** A metastatic pool: serves node sets from its labels, capped by maxServers. */
export interface MetastaticPool {
  /** `<provider>/<pool>`: unique, used as a key in the table. */
  readonly key: string;
  readonly providerName: string;
  readonly poolName: string;
  /** Lower wins. */
  readonly priority: number;
  /** Metastatic nodes of this pool in any state; undefined = unlimited; <= 0 disables the pool. */
  readonly maxServers: number | undefined;
  readonly nodeAttributes: Readonly<Record<string, unknown>>;
  readonly hostKeyChecking: boolean;
  /** Seconds, from the provider. */
  readonly launchTimeout: number;
  readonly bootTimeout: number;
  readonly launchRetries: number;
  readonly labels: ReadonlyMap<string, MetastaticLabel>;
}

/** A label of a backing (non-metastatic) pool: what a backing node is launched from. */
export interface BackingLabel {
  readonly name: string;
  /** Driver-specific options of this label, as written in the YAML (kebab-case keys). */
  readonly options: Readonly<Record<string, unknown>>;
  /**
   * What the nodes served on its backing nodes carry (username, connection-type, python-path,
   * shell-type, per-slot-users), defaults applied (fields/contractFields.ts contractOf). Unset on a
   * hand-built pool: its backing nodes record none, and their nodes get Nodepool's defaults.
   */
  readonly contract?: BackingContract;
}

/** A backing pool: its provider's driver is a backing driver (shared/providers/drivers.ts: `local`, `aws`). */
export interface BackingPool {
  /** `<provider>/<pool>` */
  readonly key: string;
  readonly providerName: string;
  readonly poolName: string;
  /** The backing driver's name (the core names none: it routes nothing by it). */
  readonly driver: string;
  /** Backing nodes this pool may run at once; undefined = unlimited. */
  readonly maxServers: number | undefined;
  /** Driver-specific options of the provider and pool, as written (kebab-case keys). */
  readonly providerOptions: Readonly<Record<string, unknown>>;
  readonly poolOptions: Readonly<Record<string, unknown>>;
  readonly labels: ReadonlyMap<string, BackingLabel>;
}

/**
 * `priority-ceiling`, resolved: the best (lowest) priority a request may claim, by its requestor
 * (core/priority.ts, trustedPriority). Requestors are not authenticated: see docs/threat-model.md.
 */
export interface PriorityCeiling {
  /** The ceiling of a requestor not listed, or of a request that names none; undefined = none. */
  readonly default?: number;
  readonly requestors: ReadonlyMap<string, number>;
}

export interface ResolvedConfig {
  /** Metastatic pools sorted by priority (lower first), ties in file order. */
  readonly metastaticPools: readonly MetastaticPool[];
  /** Backing pools by the backing label they provide (first provider in file order wins). */
  readonly backingPoolByLabel: ReadonlyMap<string, BackingPool>;
  readonly backingPools: readonly BackingPool[];
  /** Every metastatic label name offered by some pool. */
  readonly metastaticLabelNames: ReadonlySet<string>;
  /** Labels with a min-ready above 0 (top-level `labels`): how many ready nodes of each the pool keeps. */
  readonly minReady: ReadonlyMap<string, number>;
  /** The top-level `priority-ceiling`: for every label without one of its own; undefined = none. */
  readonly priorityCeiling?: PriorityCeiling;
  /** Labels with a `priority-ceiling` of their own (top-level `labels`), instead of the top-level one. */
  readonly labelPriorityCeilings: ReadonlyMap<string, PriorityCeiling>;
  /**
   * Labels with `min-ready: auto`: the ready nodes they hold follow their arrival forecast (core/forecast.ts),
   * so that `share` of their requests find one, at most `maxReady`.
   */
  readonly readyAuto: ReadonlyMap<string, ReadyAuto>;
  /** Requests by shape: percent above the cheapest fitting label worth paying for a free slot now. */
  readonly shapeCostMargin: number;
  /** `learned-durations`: learn node durations and place nodes without a hint by them. */
  readonly learnedDurations: boolean;
  /** `record-retention`: seconds an ended record stays before DynamoDB's TTL deletes it (core/timing.ts). */
  readonly recordRetention: number;
  /** The `github` section (githubSchema.ts): GitHub Actions jobs in packed slots; undefined: none. */
  readonly github?: GithubSettings;
  /** Keys that are valid but have no effect yet, by YAML path: shown as warnings, never errors. */
  readonly notices: readonly ConfigNotice[];
}

export interface ReadyAuto {
  /** `ready-target`: the share of requests that should find a ready node. */
  readonly share: number;
  /** `max-ready`: the most ready nodes held. */
  readonly maxReady: number;
}

export interface ConfigNotice {
  /** `labels[1].min-ready` */
  readonly path: string;
  readonly message: string;
}

/** The `github` section as the pool uses it (githubSchema.ts reads it). */
export interface GithubSettings {
  readonly apiUrl: string;
  readonly appId: number;
  readonly installationId?: number;
  /** metastatic dev's: on AWS the stack's Secrets Manager secrets hold the key and the webhook secret. */
  readonly privateKeyFile?: string;
  readonly webhookSecretFiles?: readonly string[];
  readonly organization?: string;
  readonly runnerGroupId: number;
  readonly runnerCommand: string;
  readonly idleTimeout: number;
  readonly reconcileInterval: number;
  /** Seconds between scans of GitHub's queued jobs for lost webhooks; 0: none. */
  readonly queuedScanInterval: number;
  readonly webhookPort: number;
  readonly enabled: boolean;
  readonly routes: readonly GithubRoute[];
}

export interface GithubRoute {
  readonly runsOn: readonly string[];
  readonly label: string;
  readonly lease: number;
}
