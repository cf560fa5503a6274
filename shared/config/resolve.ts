/**
 * From the parsed YAML to the model the core works with (model.ts), in two steps:
 *
 * - `checkConfigRules(data)`: the rules across fields, pools and providers (unique names, references,
 *   agreement between labels sharing a backing label, max-age vs min-retention-time, top-level labels).
 *   It works on the raw, unvalidated data and checks whatever the data allows, so that a file with field
 *   errors still gets every cross-field error reported at once; a value that fails its own field schema
 *   is left out of the comparisons (its field error is reported by the schema).
 * - `resolveConfig(file)`: applies inheritance (provider -> pool -> label) to a file that passed both the
 *   schema and the rules.
 */
import type { z } from 'zod';
import type {
  BackingLabel,
  BackingPool,
  ConfigNotice,
  MetastaticLabel,
  MetastaticPool,
  ResolvedConfig,
} from './model.ts';
import {
  type ConfigFile,
  type EBS_VOLUME_TYPES,
  MAX_VOLUME_SIZE,
  metastaticLabelSchema,
  NAME_PATTERN,
} from './schema.ts';

export type PathSegment = string | number;

/** An error found on the data, before it is located in the YAML document. */
export interface PathIssue {
  readonly path: readonly PathSegment[];
  readonly message: string;
  /** Locate the key of the last path segment rather than its value (e.g. for an unknown key). */
  readonly atKey?: boolean;
}

/** `providers[1].pools[0].labels[0].max-parallel-jobs` */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const segment of path) {
    if (typeof segment === 'number') out += `[${segment}]`;
    else out += out === '' ? String(segment) : `.${String(segment)}`;
  }
  return out;
}

// ---- cross-field rules ------------------------------------------------------------------------------

function asRecord(value: unknown): Record<string, unknown> | undefined {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

function asString(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}

const INVALID = Symbol('invalid');

/** The field's value with its default applied, or INVALID when it fails its own schema. */
function fieldValue(schema: z.ZodType, label: Record<string, unknown>, key: string): unknown {
  const result = schema.safeParse(label[key]);
  return result.success ? result.data : INVALID;
}

/** Fields that labels sharing a backing label (within one provider) must agree on. */
const SHARED_FIELDS = ['max-parallel-jobs', 'grace-time', 'min-retention-time', 'max-age'] as const;
type SharedField = (typeof SHARED_FIELDS)[number];

function sharedFieldValue(
  label: Record<string, unknown>,
  field: SharedField,
): number | undefined | typeof INVALID {
  const value = fieldValue(metastaticLabelSchema.shape[field], label, field);
  if (value === INVALID) return INVALID;
  // max-age: unset and 0 both mean off.
  if (field === 'max-age' && (value === undefined || value === 0)) return undefined;
  return value as number;
}

const showShared = (value: number | undefined): string => (value === undefined ? 'off' : String(value));

interface Offer {
  readonly name: string;
  /** Path of the label (without `.name`). */
  readonly path: readonly PathSegment[];
  readonly kind: 'metastatic' | 'backing';
}

interface MetastaticLabelRef {
  readonly label: Record<string, unknown>;
  readonly path: readonly PathSegment[];
  readonly providerIndex: number;
}

/**
 * Checks the rules that span fields, pools and providers on unvalidated data. Returns every violation
 * it can find; parts of the data that are malformed are skipped (the schema reports them).
 */
export function checkConfigRules(data: unknown): PathIssue[] {
  const issues: PathIssue[] = [];
  const root = asRecord(data);
  if (!root) return issues;
  const providers = Array.isArray(root.providers) ? root.providers : [];

  const offers: Offer[] = [];
  const metastaticLabels: MetastaticLabelRef[] = [];
  /** False when some backing pool could not be read, so "nobody offers X" may be a false alarm. */
  let backingLabelsComplete = true;

  const providerNames = new Map<string, string>();
  providers.forEach((rawProvider, providerIndex) => {
    const provider = asRecord(rawProvider);
    const providerPath: PathSegment[] = ['providers', providerIndex];
    if (!provider) {
      backingLabelsComplete = false;
      return;
    }
    const providerName = asString(provider.name);
    if (providerName !== undefined) {
      const first = providerNames.get(providerName);
      if (first !== undefined) {
        issues.push({
          path: [...providerPath, 'name'],
          message: `duplicate provider name "${providerName}" (first used at ${first})`,
        });
      } else {
        providerNames.set(providerName, formatPath(providerPath));
      }
    }
    const driver = provider.driver;
    const kind =
      driver === 'metastatic' ? 'metastatic' : driver === 'local' || driver === 'aws' ? 'backing' : undefined;
    if (kind === undefined) {
      backingLabelsComplete = false;
      return;
    }
    if (driver === 'aws') issues.push(...checkAwsRules(provider, providerPath));
    if (!Array.isArray(provider.pools)) {
      if (kind === 'backing') backingLabelsComplete = false;
      return;
    }

    const poolNames = new Map<string, string>();
    provider.pools.forEach((rawPool, poolIndex) => {
      const pool = asRecord(rawPool);
      const poolPath: PathSegment[] = [...providerPath, 'pools', poolIndex];
      if (!pool) {
        if (kind === 'backing') backingLabelsComplete = false;
        return;
      }
      const poolName = asString(pool.name);
      if (poolName !== undefined) {
        const first = poolNames.get(poolName);
        if (first !== undefined) {
          issues.push({
            path: [...poolPath, 'name'],
            message: `duplicate pool name "${poolName}" in provider ${providerName ? `"${providerName}"` : formatPath(providerPath)} (first used at ${first})`,
          });
        } else {
          poolNames.set(poolName, formatPath(poolPath));
        }
      }
      if (!Array.isArray(pool.labels)) {
        if (kind === 'backing') backingLabelsComplete = false;
        return;
      }

      const labelNames = new Map<string, string>();
      pool.labels.forEach((rawLabel, labelIndex) => {
        const label = asRecord(rawLabel);
        const labelPath: PathSegment[] = [...poolPath, 'labels', labelIndex];
        if (!label) {
          if (kind === 'backing') backingLabelsComplete = false;
          return;
        }
        const labelName = asString(label.name);
        if (labelName === undefined) {
          if (kind === 'backing') backingLabelsComplete = false;
        } else {
          const first = labelNames.get(labelName);
          if (first !== undefined) {
            issues.push({
              path: [...labelPath, 'name'],
              message: `duplicate label name "${labelName}" in pool ${poolName ? `"${poolName}"` : formatPath(poolPath)} (first used at ${first})`,
            });
          } else {
            labelNames.set(labelName, formatPath(labelPath));
          }
          offers.push({ name: labelName, path: labelPath, kind });
        }
        if (kind === 'metastatic') metastaticLabels.push({ label, path: labelPath, providerIndex });
      });
    });
  });

  const firstBackingOffer = new Map<string, Offer>();
  const firstMetastaticOffer = new Map<string, Offer>();
  for (const offer of offers) {
    const byName = offer.kind === 'backing' ? firstBackingOffer : firstMetastaticOffer;
    if (!byName.has(offer.name)) byName.set(offer.name, offer);
  }

  // A label name is either metastatic or backing, never both.
  for (const offer of offers) {
    if (offer.kind !== 'metastatic') continue;
    const backing = firstBackingOffer.get(offer.name);
    if (backing) {
      issues.push({
        path: [...offer.path, 'name'],
        message: `label "${offer.name}" is also offered by a local or aws pool (${formatPath(backing.path)}); a label name must be either metastatic or backing, not both`,
      });
    }
  }

  // Per metastatic label: max-age vs min-retention-time, and the backing-label reference.
  for (const { label, path } of metastaticLabels) {
    const maxAge = sharedFieldValue(label, 'max-age');
    const minRetention = sharedFieldValue(label, 'min-retention-time');
    if (typeof maxAge === 'number' && typeof minRetention === 'number' && maxAge < minRetention) {
      issues.push({
        path: [...path, 'max-age'],
        message: `max-age: must be 0 (off) or >= min-retention-time (${minRetention}), got ${maxAge}`,
      });
    }

    // A backing-label that is not a valid name gets its field error only.
    const backingLabel = asString(label['backing-label']);
    if (
      backingLabel === undefined ||
      !NAME_PATTERN.test(backingLabel) ||
      firstBackingOffer.has(backingLabel)
    ) {
      continue;
    }
    const metastatic = firstMetastaticOffer.get(backingLabel);
    if (metastatic) {
      issues.push({
        path: [...path, 'backing-label'],
        message: `backing-label must name a label of a local or aws pool; "${backingLabel}" is a metastatic label (${formatPath(metastatic.path)})`,
      });
    } else if (backingLabelsComplete) {
      issues.push({
        path: [...path, 'backing-label'],
        message: `backing-label: no local or aws pool offers label "${backingLabel}"`,
      });
    }
  }

  // Within one provider, labels sharing a backing label agree on the backing node's settings.
  const reference = new Map<string, { value: number | undefined; path: readonly PathSegment[] }>();
  for (const { label, path, providerIndex } of metastaticLabels) {
    const backingLabel = asString(label['backing-label']);
    if (backingLabel === undefined) continue;
    for (const field of SHARED_FIELDS) {
      const value = sharedFieldValue(label, field);
      if (value === INVALID) continue;
      const key = JSON.stringify([providerIndex, backingLabel, field]);
      const first = reference.get(key);
      if (!first) {
        reference.set(key, { value, path });
      } else if (first.value !== value) {
        issues.push({
          path: [...path, field],
          message: `${field}: labels sharing backing-label "${backingLabel}" must agree; this label has ${showShared(value)}, ${formatPath(first.path)} has ${showShared(first.value)}`,
        });
      }
    }
  }

  // The top-level labels list, when present, lists every label offered by any pool.
  if (Array.isArray(root.labels)) {
    const listed = new Map<string, string>();
    let complete = true;
    root.labels.forEach((rawLabel, index) => {
      const name = asString(asRecord(rawLabel)?.name);
      if (name === undefined) {
        complete = false;
        return;
      }
      const first = listed.get(name);
      if (first !== undefined) {
        issues.push({
          path: ['labels', index, 'name'],
          message: `duplicate label name "${name}" (first used at ${first})`,
        });
      } else {
        listed.set(name, formatPath(['labels', index]));
      }
    });
    if (complete) {
      for (const offer of offers) {
        if (!listed.has(offer.name)) {
          issues.push({
            path: [...offer.path, 'name'],
            message: `label "${offer.name}" is not listed in the top-level labels`,
          });
        }
      }
    }
  }

  return issues;
}

// ---- driver aws: rules across keys -----------------------------------------------------------------

/** EBS volume sizes in GiB by type, [min, max] (io2: Block Express). */
export const EBS_VOLUME_SIZES = {
  gp3: [1, 16_384],
  gp2: [1, 16_384],
  io2: [4, 65_536],
  io1: [4, 16_384],
  st1: [125, 16_384],
  sc1: [125, 16_384],
  standard: [1, 1_024],
} as const satisfies Record<(typeof EBS_VOLUME_TYPES)[number], readonly [number, number]>;

/** Tag key prefixes that users may not set: AWS reserves `aws:`, metastatic sets its own. */
export const RESERVED_TAG_PREFIXES = ['aws:', 'metastatic:'] as const;

/**
 * "Exactly one of" checks on a mapping: both given is an error at the second key; neither given (when
 * `required`) is a missing-key error at the first.
 */
function exactlyOne(
  issues: PathIssue[],
  value: Record<string, unknown>,
  path: readonly PathSegment[],
  [first, second]: readonly [string, string],
  required: boolean,
  hint = '',
): void {
  const hasFirst = value[first] !== undefined;
  const hasSecond = value[second] !== undefined;
  if (hasFirst && hasSecond) {
    issues.push({
      path: [...path, second],
      atKey: true,
      message: `give either ${first} or ${second}, not both`,
    });
  } else if (required && !hasFirst && !hasSecond) {
    issues.push({
      path: [...path, first],
      message: `missing required key "${first}" (or "${second}"${hint})`,
    });
  }
}

/** The aws driver's rules across keys, on unvalidated data (a malformed part is left to the schema). */
function checkAwsRules(provider: Record<string, unknown>, providerPath: readonly PathSegment[]): PathIssue[] {
  const issues: PathIssue[] = [];
  if (!Array.isArray(provider.pools)) return issues;
  provider.pools.forEach((rawPool, poolIndex) => {
    const pool = asRecord(rawPool);
    if (!pool) return;
    const poolPath = [...providerPath, 'pools', poolIndex];
    exactlyOne(issues, pool, poolPath, ['subnet-ids', 'subnet-id'], true);
    exactlyOne(issues, pool, poolPath, ['security-group-ids', 'security-group-id'], false);
    if (!Array.isArray(pool.labels)) return;
    pool.labels.forEach((rawLabel, labelIndex) => {
      const label = asRecord(rawLabel);
      if (!label) return;
      const labelPath = [...poolPath, 'labels', labelIndex];
      exactlyOne(
        issues,
        label,
        labelPath,
        ['instance-type', 'instance-types'],
        true,
        ', a list tried in order',
      );
      exactlyOne(issues, label, labelPath, ['image-id', 'launch-template'], true);
      const template = asRecord(label['launch-template']);
      if (template) exactlyOne(issues, template, [...labelPath, 'launch-template'], ['id', 'name'], true);
      const profile = asRecord(label['iam-instance-profile']);
      if (profile) exactlyOne(issues, profile, [...labelPath, 'iam-instance-profile'], ['name', 'arn'], true);
      if (label['launch-template'] !== undefined) {
        for (const key of ['volume-size', 'volume-type']) {
          if (label[key] === undefined) continue;
          issues.push({
            path: [...labelPath, key],
            atKey: true,
            message: `${key} cannot be combined with launch-template (the template defines the root volume)`,
          });
        }
      }
      // Per volume type (gp3 when unset); a size outside every type's range is the schema's error, and
      // with a launch-template the size is an error of its own (above).
      const size = label['volume-size'];
      const type = label['volume-type'] ?? 'gp3';
      const range = EBS_VOLUME_SIZES[type as keyof typeof EBS_VOLUME_SIZES];
      if (
        label['launch-template'] === undefined &&
        range !== undefined &&
        typeof size === 'number' &&
        Number.isInteger(size) &&
        size >= 1 &&
        size <= MAX_VOLUME_SIZE &&
        (size < range[0] || size > range[1])
      ) {
        issues.push({
          path: [...labelPath, 'volume-size'],
          message: `volume-size: a ${type} volume is ${range[0]} to ${range[1]} GiB, got ${size}`,
        });
      }
      const tags = asRecord(label.tags);
      for (const key of Object.keys(tags ?? {})) {
        const prefix = RESERVED_TAG_PREFIXES.find((p) => key.toLowerCase().startsWith(p));
        if (prefix === undefined) continue;
        issues.push({
          path: [...labelPath, 'tags', key],
          atKey: true,
          message: `tag key "${key}" is reserved (keys starting with "${prefix}" are set by ${prefix === 'aws:' ? 'AWS' : 'metastatic'})`,
        });
      }
    });
  });
  return issues;
}

// ---- resolution -------------------------------------------------------------------------------------

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
    notices: noticesOf(file),
  };
}

/** Valid keys that do nothing yet: the user is told rather than left to wonder. */
function noticesOf(file: ConfigFile): ConfigNotice[] {
  const notices: ConfigNotice[] = [];
  file.labels?.forEach((label, index) => {
    if ((label['min-ready'] ?? 0) > 0) {
      notices.push({
        path: formatPath(['labels', index, 'min-ready']),
        message: 'is not supported yet and is ignored: no node is kept ready ahead of requests',
      });
    }
  });
  return notices;
}
