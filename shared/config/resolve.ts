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
  return {
    metastaticPools,
    backingPoolByLabel,
    backingPools,
    metastaticLabelNames,
    minReady: minReadyOf(file),
    notices: noticesOf(file, metastaticLabelNames),
  };
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

/** Valid keys that do nothing here: the user is told rather than left to wonder. */
function noticesOf(file: ConfigFile, offered: ReadonlySet<string>): ConfigNotice[] {
  const notices: ConfigNotice[] = [];
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
