/**
 * From a file that passed the schema (schema.ts) and the rules (rules.ts) to the model the core works
 * with (model.ts): inheritance applied (provider -> pool -> label), pools in priority order.
 */

import { formatSize, parseSize, type Shape } from '../core/shapes.ts';
import { type InstanceTypeFacts, instanceTypeFacts } from './instanceTypes.ts';
import type {
  BackingLabel,
  BackingPool,
  ConfigNotice,
  MetastaticLabel,
  MetastaticPool,
  ResolvedConfig,
} from './model.ts';
import { formatPath } from './paths.ts';
import type { ConfigFile } from './schema.ts';

/** Resolves a file that passed the schema and `checkConfigRules` into the model the core uses. */
export function resolveConfig(file: ConfigFile): ResolvedConfig {
  const metastaticPools: MetastaticPool[] = [];
  const backingPools: BackingPool[] = [];
  const backingPoolByLabel = new Map<string, BackingPool>();
  const metastaticLabelNames = new Set<string>();

  for (const provider of file.providers) {
    if (provider.driver === 'metastatic') {
      for (const pool of provider.pools) {
        const poolHostKeyChecking = pool['host-key-checking'];
        const labels = new Map<string, MetastaticLabel>();
        for (const label of pool.labels) {
          const maxAge = label['max-age'];
          labels.set(label.name, {
            name: label.name,
            backingLabel: label['backing-label'],
            maxParallelJobs: label['max-parallel-jobs'],
            graceTime: label['grace-time'],
            minRetentionTime: label['min-retention-time'],
            maxAge: maxAge === undefined || maxAge === 0 ? undefined : maxAge,
            hostKeyChecking: label['host-key-checking'] ?? poolHostKeyChecking,
            requestTimeout:
              label['request-timeout'] ?? pool['request-timeout'] ?? provider['request-timeout'],
          });
          metastaticLabelNames.add(label.name);
        }
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
      }
    } else {
      const { name: providerName, pools, ...providerOptions } = provider;
      for (const pool of pools) {
        const { name: poolName, labels: rawLabels, ...poolOptions } = pool;
        const labels = new Map<string, BackingLabel>();
        for (const label of rawLabels) {
          const { name, ...options } = label;
          labels.set(name, { name, options });
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
  }

  // Array.prototype.sort is stable: ties keep file order.
  metastaticPools.sort((a, b) => a.priority - b.priority);
  const shaped = metastaticPools.map((pool) => withSlotShapes(file, pool, backingPoolByLabel));
  return {
    metastaticPools: shaped,
    backingPoolByLabel,
    backingPools,
    metastaticLabelNames,
    minReady: minReadyOf(file),
    shapeCostMargin: file['shape-cost-margin'],
    learnedDurations: file['learned-durations'],
    notices: noticesOf(file, metastaticLabelNames),
  };
}

/**
 * The pool with each label's slot shape and cost per slot-hour (requests by shape): what the label says,
 * else what its backing label says or its instance type gives (shared/config/instanceTypes.ts), divided
 * by max-parallel-jobs. An aws label with several instance-types takes the smallest of each size and the
 * highest price among them, since any of them may be launched.
 */
function withSlotShapes(
  file: ConfigFile,
  pool: MetastaticPool,
  backingPoolByLabel: ReadonlyMap<string, BackingPool>,
): MetastaticPool {
  const written = file.providers
    .filter((p) => p.driver === 'metastatic')
    .flatMap((p) => p.pools.filter((q) => `${p.name}/${q.name}` === pool.key))
    .flatMap((q) => q.labels);
  const labels = new Map<string, MetastaticLabel>();
  for (const [name, label] of pool.labels) {
    const own = written.find((l) => l.name === name);
    const backing = backingPoolByLabel.get(label.backingLabel)?.labels.get(label.backingLabel);
    const machine = backing ? machineOf(backing) : {};
    const per = (v: number | undefined) => (v === undefined ? undefined : v / label.maxParallelJobs);
    const slot: Shape = {
      cores: own?.cores ?? per(machine.vcpus),
      memoryMiB:
        own?.memory === undefined
          ? perFloor(machine.memoryMiB, label.maxParallelJobs)
          : parseSize(own.memory),
      diskMiB: own?.disk === undefined ? undefined : parseSize(own.disk),
    };
    const known = Object.values(slot).some((v) => v !== undefined);
    const cost = per(machine.hourlyCost);
    labels.set(name, {
      ...label,
      ...(known ? { slot: dropUndefined(slot) } : {}),
      ...(cost === undefined ? {} : { slotHourlyCost: cost }),
    });
  }
  return { ...pool, labels };
}

/** Whole MiB of one slot when a machine's memory is divided among its slots. */
function perFloor(mib: number | undefined, slots: number): number | undefined {
  return mib === undefined ? undefined : Math.floor(mib / slots);
}

function dropUndefined(s: Shape): Shape {
  return Object.fromEntries(Object.entries(s).filter(([, v]) => v !== undefined)) as Shape;
}

/** What a backing node of this label gives and costs, as far as its options and instance types say. */
function machineOf(label: BackingLabel): { vcpus?: number; memoryMiB?: number; hourlyCost?: number } {
  const o = label.options;
  const types = [
    o['instance-type'],
    ...(Array.isArray(o['instance-types']) ? o['instance-types'] : []),
  ].filter((t): t is string => typeof t === 'string');
  const facts = types.map(instanceTypeFacts);
  const all =
    facts.length > 0 && facts.every((f) => f !== undefined) ? (facts as InstanceTypeFacts[]) : undefined;
  const explicit = typeof o['hourly-cost'] === 'number' ? o['hourly-cost'] : undefined;
  return {
    vcpus: all ? Math.min(...all.map((f) => f.vcpus)) : undefined,
    memoryMiB: all ? Math.min(...all.map((f) => f.memoryMiB)) : undefined,
    hourlyCost: explicit ?? (all ? Math.max(...all.map((f) => f.hourlyCost)) : undefined),
  };
}

/**
 * Slots that declare more cores or memory than their backing instance type gives them (the type's
 * vCPUs or memory / max-parallel-jobs), where the type is known: a request by shape would be served a
 * slot that cannot hold it. A warning, not an error: the label may know better (overcommit on purpose).
 */
function oversizedSlots(file: ConfigFile): ConfigNotice[] {
  const machines = new Map<string, ReturnType<typeof machineOf>>();
  for (const p of file.providers) {
    if (p.driver === 'metastatic') continue;
    for (const pool of p.pools)
      for (const { name, ...options } of pool.labels)
        if (!machines.has(name)) machines.set(name, machineOf({ name, options }));
  }
  const notices: ConfigNotice[] = [];
  file.providers.forEach((p, pi) => {
    if (p.driver !== 'metastatic') return;
    p.pools.forEach((pool, qi) => {
      pool.labels.forEach((label, li) => {
        const m = machines.get(label['backing-label']);
        const slots = label['max-parallel-jobs'];
        const at = (key: string) => formatPath(['providers', pi, 'pools', qi, 'labels', li, key]);
        if (m?.vcpus !== undefined && label.cores !== undefined && label.cores * slots > m.vcpus) {
          notices.push({
            path: at('cores'),
            message: `${slots} slots of ${label.cores} cores need ${label.cores * slots}; the instance type gives ${m.vcpus}`,
          });
        }
        const memory = label.memory === undefined ? undefined : parseSize(label.memory);
        if (m?.memoryMiB !== undefined && memory !== undefined && memory * slots > m.memoryMiB) {
          notices.push({
            path: at('memory'),
            message: `${slots} slots of ${label.memory} need ${formatSize(memory * slots)}; the instance type gives ${formatSize(m.memoryMiB)}`,
          });
        }
      });
    });
  });
  return notices;
}

/** The labels with a min-ready above 0, and how many ready nodes to keep of each. */
function minReadyOf(file: ConfigFile): Map<string, number> {
  const minReady = new Map<string, number>();
  for (const label of file.labels ?? []) {
    const n = label['min-ready'] ?? 0;
    if (n > 0) minReady.set(label.name, n);
  }
  return minReady;
}

/** Valid keys that do nothing here, or promise more than they can: the user is told rather than left to wonder. */
function noticesOf(file: ConfigFile, offered: ReadonlySet<string>): ConfigNotice[] {
  const notices: ConfigNotice[] = [...oversizedSlots(file)];
  file.labels?.forEach((label, index) => {
    if ((label['min-ready'] ?? 0) > 0 && !offered.has(label.name)) {
      notices.push({
        path: formatPath(['labels', index, 'min-ready']),
        message: `no metastatic pool offers label "${label.name}": no node of it is kept ready`,
      });
    }
  });
  return notices;
}
