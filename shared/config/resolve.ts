/**
 * From a file that passed the schema (schema.ts) and the rules (rules.ts) to the model the core works
 * with (model.ts): inheritance applied (provider -> pool -> label), pools in priority order.
 */

import type {
  BackingLabel,
  BackingPool,
  ConfigNotice,
  MetastaticLabel,
  MetastaticPool,
  PriorityCeiling,
  ReadyAuto,
  ResolvedConfig,
} from '../core/model.ts';
import { formatSize, parseSize, type Shape } from '../core/shapes.ts';
import { contractOf } from '../fields/contractFields.ts';
import { DEFAULT_MAX_READY, READY_TARGET_BOUNDS } from '../fields/fields.ts';
import { formatPath } from '../fields/paths.ts';
import type { Machine } from '../providers/driver.ts';
import { backingDriver } from '../providers/drivers.ts';
import { githubSettings } from './githubSchema.ts';
import type { ConfigFile, MetastaticLabelConfig } from './schema.ts';

/** Resolves a file that passed the schema and `checkConfigRules` into the model the core uses. */
export function resolveConfig(file: ConfigFile): ResolvedConfig {
  const metastaticPools: MetastaticPool[] = [];
  const backingPools: BackingPool[] = [];
  const backingPoolByLabel = new Map<string, BackingPool>();
  const metastaticLabelNames = new Set<string>();
  const notices: ConfigNotice[] = [];

  // Backing pools first: a metastatic label's slot shape comes from its backing label, wherever that is.
  for (const provider of file.providers) {
    if (provider.driver === 'metastatic') continue;
    const { name: providerName, pools, ...providerOptions } = provider;
    for (const pool of pools) {
      const { name: poolName, labels: rawLabels, ...poolOptions } = pool;
      const labels = new Map<string, BackingLabel>();
      for (const label of rawLabels) {
        const { name, ...options } = label;
        labels.set(name, { name, options, contract: contractOf(options) });
      }
      const backingPool: BackingPool = {
        key: `${providerName}/${poolName}`,
        providerName,
        poolName,
        driver: provider.driver,
        maxServers: pool['max-servers'],
        providerOptions,
        poolOptions,
        labels,
      };
      backingPools.push(backingPool);
      for (const name of labels.keys()) {
        if (!backingPoolByLabel.has(name)) backingPoolByLabel.set(name, backingPool);
      }
    }
  }

  file.providers.forEach((provider, pi) => {
    if (provider.driver !== 'metastatic') return;
    provider.pools.forEach((pool, qi) => {
      const poolHostKeyChecking = pool['host-key-checking'];
      const labels = new Map<string, MetastaticLabel>();
      pool.labels.forEach((label, li) => {
        const maxAge = label['max-age'];
        const backingPool = backingPoolByLabel.get(label['backing-label']);
        const backing = backingPool?.labels.get(label['backing-label']);
        const machine = backingPool && backing ? machineOf(backingPool, backing) : {};
        const path = ['providers', pi, 'pools', qi, 'labels', li];
        notices.push(...oversized(label, machine, path));
        labels.set(label.name, {
          name: label.name,
          backingLabel: label['backing-label'],
          maxParallelJobs: label['max-parallel-jobs'],
          graceTime: label['grace-time'],
          minRetentionTime: label['min-retention-time'],
          maxAge: maxAge === undefined || maxAge === 0 ? undefined : maxAge,
          hostKeyChecking: label['host-key-checking'] ?? poolHostKeyChecking,
          requestTimeout: label['request-timeout'] ?? pool['request-timeout'] ?? provider['request-timeout'],
          ...leaseSettingsOf(label, pool, provider),
          ...slotOf(label, machine),
        });
        metastaticLabelNames.add(label.name);
      });
      metastaticPools.push({
        key: `${provider.name}/${pool.name}`,
        providerName: provider.name,
        poolName: pool.name,
        priority: pool.priority ?? provider.priority,
        maxServers: pool['max-servers'],
        nodeAttributes: pool['node-attributes'],
        hostKeyChecking: poolHostKeyChecking,
        launchTimeout: provider['launch-timeout'],
        bootTimeout: provider['boot-timeout'],
        launchRetries: provider['launch-retries'],
        labels,
      });
    });
  });

  // Array.prototype.sort is stable: ties keep file order.
  metastaticPools.sort((a, b) => a.priority - b.priority);
  return {
    metastaticPools,
    backingPoolByLabel,
    backingPools,
    metastaticLabelNames,
    minReady: minReadyOf(file),
    ...(file['priority-ceiling'] === undefined
      ? {}
      : { priorityCeiling: ceilingOf(file['priority-ceiling']) }),
    labelPriorityCeilings: new Map(
      (file.labels ?? []).flatMap((l) =>
        l['priority-ceiling'] === undefined ? [] : [[l.name, ceilingOf(l['priority-ceiling'])] as const],
      ),
    ),
    readyAuto: readyAutoOf(file),
    shapeCostMargin: file['shape-cost-margin'],
    learnedDurations: file['learned-durations'],
    recordRetention: file['record-retention'],
    ...(file.github === undefined ? {} : { github: githubSettings(file.github) }),
    notices: [...notices, ...noticesOf(file, metastaticLabelNames)],
  };
}

/**
 * A label's slot shape and cost per slot-hour (requests by shape): what the label says, else what its
 * backing label says or its instance type gives (shared/providers/aws/instanceTypes.ts), divided by
 * max-parallel-jobs.
 */
function slotOf(
  label: MetastaticLabelConfig,
  machine: Machine,
): Pick<MetastaticLabel, 'slot' | 'slotHourlyCost'> {
  const slots = label['max-parallel-jobs'];
  const slot: Shape = {
    cores: label.cores ?? (machine.vcpus === undefined ? undefined : machine.vcpus / slots),
    memoryMiB: label.memory === undefined ? perFloor(machine.memoryMiB, slots) : parseSize(label.memory),
    diskMiB: label.disk === undefined ? undefined : parseSize(label.disk),
  };
  const known = Object.values(slot).some((v) => v !== undefined);
  return {
    ...(known ? { slot: dropUndefined(slot) } : {}),
    ...(machine.hourlyCost === undefined ? {} : { slotHourlyCost: machine.hourlyCost / slots }),
  };
}

/** Whole MiB of one slot when a machine's memory is divided among its slots. */
function perFloor(mib: number | undefined, slots: number): number | undefined {
  return mib === undefined ? undefined : Math.floor(mib / slots);
}

function dropUndefined(s: Shape): Shape {
  return Object.fromEntries(Object.entries(s).filter(([, v]) => v !== undefined)) as Shape;
}

/**
 * What a backing node of this label gives and costs: what its driver knows from the label's options
 * (an aws label's instance types), its own `hourly-cost` first.
 */
function machineOf(pool: BackingPool, label: BackingLabel): Machine {
  const known = backingDriver(pool.driver)?.machine?.(label.options) ?? {};
  const explicit =
    typeof label.options['hourly-cost'] === 'number' ? label.options['hourly-cost'] : undefined;
  return { ...known, hourlyCost: explicit ?? known.hourlyCost };
}

/**
 * A slot that declares more cores or memory than its backing instance type gives it (the type's vCPUs or
 * memory / max-parallel-jobs), where the type is known: a request by shape would be served a slot that
 * cannot hold it. A warning, not an error: the label may know better (overcommit on purpose).
 */
function oversized(label: MetastaticLabelConfig, m: Machine, path: (string | number)[]): ConfigNotice[] {
  const slots = label['max-parallel-jobs'];
  const notices: ConfigNotice[] = [];
  if (m.vcpus !== undefined && label.cores !== undefined && label.cores * slots > m.vcpus) {
    notices.push({
      path: formatPath([...path, 'cores']),
      message: `${slots} slots of ${label.cores} cores need ${label.cores * slots}; a backing node gives ${m.vcpus}`,
    });
  }
  const memory = label.memory === undefined ? undefined : parseSize(label.memory);
  if (m.memoryMiB !== undefined && memory !== undefined && memory * slots > m.memoryMiB) {
    notices.push({
      path: formatPath([...path, 'memory']),
      message: `${slots} slots of ${label.memory} need ${formatSize(memory * slots)}; a backing node gives ${formatSize(m.memoryMiB)}`,
    });
  }
  return notices;
}

/** The labels with a min-ready above 0, and how many ready nodes to keep of each. */
function minReadyOf(file: ConfigFile): Map<string, number> {
  const minReady = new Map<string, number>();
  for (const label of file.labels ?? []) {
    const n = label['min-ready'] ?? 0;
    if (typeof n === 'number' && n > 0) minReady.set(label.name, n);
  }
  return minReady;
}

/** A `priority-ceiling` as the core reads it (a Map: a requestor named `__proto__` is only a name). */
function ceilingOf(c: NonNullable<ConfigFile['priority-ceiling']>): PriorityCeiling {
  return {
    ...(c.default === undefined ? {} : { default: c.default }),
    requestors: new Map(Object.entries(c.requestors)),
  };
}

/** The labels with `min-ready: auto`, with their ready-target and max-ready (or the defaults). */
function readyAutoOf(file: ConfigFile): Map<string, ReadyAuto> {
  const auto = new Map<string, ReadyAuto>();
  for (const label of file.labels ?? []) {
    if (label['min-ready'] !== 'auto') continue;
    auto.set(label.name, {
      share: label['ready-target'] ?? READY_TARGET_BOUNDS.default,
      maxReady: label['max-ready'] ?? DEFAULT_MAX_READY,
    });
  }
  return auto;
}

/** Valid keys that do nothing here: the user is told rather than left to wonder. */
function noticesOf(file: ConfigFile, offered: ReadonlySet<string>): ConfigNotice[] {
  const notices: ConfigNotice[] = [];
  file.labels?.forEach((label, index) => {
    const minReady = label['min-ready'] ?? 0;
    if ((minReady === 'auto' || minReady > 0) && !offered.has(label.name)) {
      notices.push({
        path: formatPath(['labels', index, 'min-ready']),
        message: `no metastatic pool offers label "${label.name}": no node of it is kept ready`,
      });
    }
  });
  return notices;
}

type LeaseKeys = { 'default-lease'?: number | undefined; 'max-lease'?: number | undefined };

/** A label's default-lease and max-lease: its own, else its pool's, else its provider's (unset stays out). */
function leaseSettingsOf(
  label: LeaseKeys,
  pool: LeaseKeys,
  provider: LeaseKeys,
): Pick<MetastaticLabel, 'defaultLease' | 'maxLease'> {
  const defaultLease = label['default-lease'] ?? pool['default-lease'] ?? provider['default-lease'];
  const maxLease = label['max-lease'] ?? pool['max-lease'] ?? provider['max-lease'];
  return {
    ...(defaultLease === undefined ? {} : { defaultLease }),
    ...(maxLease === undefined ? {} : { maxLease }),
  };
}
