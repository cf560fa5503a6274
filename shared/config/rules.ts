import type { z } from 'zod';
import { NAME_PATTERN } from '../fields/fields.ts';
import { asRecord, asString, formatPath, type PathIssue, type PathSegment } from '../fields/paths.ts';
import { backingDriver } from '../providers/drivers.ts';
import { checkGithubRoutes } from './githubSchema.ts';
import { metastaticLabelSchema } from './schema.ts';

/**
 * The rules that span fields, pools and providers, checked on the raw, unvalidated data so that a file
 * with field errors still gets every cross-field error reported at once; a value that fails its own
 * field schema is left out of the comparisons (the schema reports it). Each rule is a function below,
 * run in this order (the order the errors are reported in):
 *
 * 1. names are unique: providers, pools within a provider, labels within a pool (and the aws driver's
 *    rules across keys, awsRules.ts, per aws provider);
 * 2. a label name is either metastatic or backing, never both;
 * 3. per metastatic label: max-age is off or >= min-retention-time, and backing-label names a label of
 *    a local or aws pool;
 * 4. labels of one provider sharing a backing label agree on the backing node's settings;
 * 5. the top-level labels list (Nodepool's), when present, lists every label offered;
 * 6. per metastatic label: the default-lease it inherits is no longer than its max-lease;
 * 7. an aws pool's user data (its labels' own, its authorized-keys, per-slot users) fits EC2's limit;
 * 8. each `github` route names a metastatic label (githubSchema.ts).
 */
export function checkConfigRules(data: unknown): PathIssue[] {
  const root = asRecord(data);
  if (!root) return [];
  const found = walkProviders(root);
  return [
    ...found.issues,
    ...labelKinds(found.offers),
    ...metastaticLabelRules(found),
    ...sharedBackingSettings(found.metastaticLabels),
    ...topLevelLabels(root, found.offers),
    ...leaseRules(root, found.metastaticLabels),
    ...driverRules(root, found.metastaticLabels),
    ...checkGithubRoutes(
      root,
      new Set(found.offers.filter((o) => o.kind === 'metastatic').map((o) => o.name)),
      true,
    ),
  ];
}

/**
 * Rule 7: each backing driver's own rules on its sections (shared/providers/drivers.ts; aws: its pools'
 * keys, and what it puts in its instances' user data, with one slot user per slot: the most slots any
 * metastatic label asks of the backing label).
 */
function driverRules(root: Record<string, unknown>, labels: readonly MetastaticLabelRef[]): PathIssue[] {
  const slots = new Map<string, number>();
  for (const { label } of labels) {
    const backingLabel = asString(label['backing-label']);
    const jobs = sharedFieldValue(label, 'max-parallel-jobs');
    if (backingLabel === undefined || typeof jobs !== 'number') continue;
    slots.set(backingLabel, Math.max(slots.get(backingLabel) ?? 1, jobs));
  }
  const providers = Array.isArray(root.providers) ? root.providers : [];
  return providers.flatMap((raw, index) => {
    const provider = asRecord(raw);
    const rules = backingDriver(provider?.driver)?.rules;
    if (!provider || !rules) return [];
    return rules(provider, ['providers', index], (label) => slots.get(label) ?? 1);
  });
}

/** A label some pool offers. */
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

interface Walked {
  readonly issues: PathIssue[];
  readonly offers: Offer[];
  readonly metastaticLabels: MetastaticLabelRef[];
  /** False when some backing pool could not be read, so "nobody offers X" may be a false alarm. */
  backingLabelsComplete: boolean;
}

/** Records a name, or an issue when `names` has it already (names map to where they were first used). */
function uniqueName(
  walked: Walked,
  names: Map<string, string>,
  name: string | undefined,
  path: readonly PathSegment[],
  what: (first: string) => string,
): void {
  if (name === undefined) return;
  const first = names.get(name);
  if (first === undefined) names.set(name, formatPath(path));
  else walked.issues.push({ path: [...path, 'name'], message: what(first) });
}

/** Rule 1, collecting on the way every label offered and every metastatic label. */
function walkProviders(root: Record<string, unknown>): Walked {
  const walked: Walked = { issues: [], offers: [], metastaticLabels: [], backingLabelsComplete: true };
  const providerNames = new Map<string, string>();
  const providers = Array.isArray(root.providers) ? root.providers : [];
  providers.forEach((rawProvider, providerIndex) => {
    const provider = asRecord(rawProvider);
    const providerPath: PathSegment[] = ['providers', providerIndex];
    if (!provider) {
      walked.backingLabelsComplete = false;
      return;
    }
    const providerName = asString(provider.name);
    uniqueName(
      walked,
      providerNames,
      providerName,
      providerPath,
      (first) => `duplicate provider name "${providerName}" (first used at ${first})`,
    );
    const driver = provider.driver;
    const kind = driver === 'metastatic' ? 'metastatic' : backingDriver(driver) ? 'backing' : undefined;
    if (kind === undefined) {
      walked.backingLabelsComplete = false;
      return;
    }
    const where = providerName ? `"${providerName}"` : formatPath(providerPath);
    walkPools(walked, provider.pools, providerPath, where, kind, providerIndex);
  });
  return walked;
}

function walkPools(
  walked: Walked,
  pools: unknown,
  providerPath: readonly PathSegment[],
  providerWhere: string,
  kind: Offer['kind'],
  providerIndex: number,
): void {
  // A backing pool that cannot be read may offer the label a backing-label names.
  const incomplete = () => {
    if (kind === 'backing') walked.backingLabelsComplete = false;
  };
  if (!Array.isArray(pools)) {
    incomplete();
    return;
  }
  const poolNames = new Map<string, string>();
  pools.forEach((rawPool, poolIndex) => {
    const pool = asRecord(rawPool);
    const poolPath: PathSegment[] = [...providerPath, 'pools', poolIndex];
    if (!pool) {
      incomplete();
      return;
    }
    const poolName = asString(pool.name);
    uniqueName(
      walked,
      poolNames,
      poolName,
      poolPath,
      (first) => `duplicate pool name "${poolName}" in provider ${providerWhere} (first used at ${first})`,
    );
    if (!Array.isArray(pool.labels)) {
      incomplete();
      return;
    }
    const poolWhere = poolName ? `"${poolName}"` : formatPath(poolPath);
    const labelNames = new Map<string, string>();
    pool.labels.forEach((rawLabel, labelIndex) => {
      const label = asRecord(rawLabel);
      const labelPath: PathSegment[] = [...poolPath, 'labels', labelIndex];
      if (!label) {
        incomplete();
        return;
      }
      const labelName = asString(label.name);
      if (labelName === undefined) {
        incomplete();
      } else {
        uniqueName(
          walked,
          labelNames,
          labelName,
          labelPath,
          (first) => `duplicate label name "${labelName}" in pool ${poolWhere} (first used at ${first})`,
        );
        walked.offers.push({ name: labelName, path: labelPath, kind });
      }
      if (kind === 'metastatic') walked.metastaticLabels.push({ label, path: labelPath, providerIndex });
    });
  });
}

/** The first offer of each name, of one kind. */
function firstOffers(offers: readonly Offer[], kind: Offer['kind']): Map<string, Offer> {
  const byName = new Map<string, Offer>();
  for (const offer of offers)
    if (offer.kind === kind && !byName.has(offer.name)) byName.set(offer.name, offer);
  return byName;
}

/** Rule 2: a label name is either metastatic or backing, never both. */
function labelKinds(offers: readonly Offer[]): PathIssue[] {
  const backing = firstOffers(offers, 'backing');
  return offers.flatMap((offer) => {
    const other = offer.kind === 'metastatic' ? backing.get(offer.name) : undefined;
    if (!other) return [];
    return [
      {
        path: [...offer.path, 'name'],
        message: `label "${offer.name}" is also offered by a local or aws pool (${formatPath(other.path)}); a label name must be either metastatic or backing, not both`,
      },
    ];
  });
}

/**
 * Rule 3, per metastatic label: max-age is 0 (off) or >= min-retention-time (Nodepool's semantics: a
 * node is kept min-retention-time, and max-age ends it), and backing-label names a label of a local or
 * aws pool (not a metastatic one; a metastatic pool does not stack on another).
 */
function metastaticLabelRules(walked: Walked): PathIssue[] {
  const issues: PathIssue[] = [];
  const backing = firstOffers(walked.offers, 'backing');
  const metastatic = firstOffers(walked.offers, 'metastatic');
  for (const { label, path } of walked.metastaticLabels) {
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
    if (backingLabel === undefined || !NAME_PATTERN.test(backingLabel) || backing.has(backingLabel)) continue;
    const other = metastatic.get(backingLabel);
    if (other) {
      issues.push({
        path: [...path, 'backing-label'],
        message: `backing-label must name a label of a local or aws pool; "${backingLabel}" is a metastatic label (${formatPath(other.path)})`,
      });
    } else if (walked.backingLabelsComplete) {
      issues.push({
        path: [...path, 'backing-label'],
        message: `backing-label: no local or aws pool offers label "${backingLabel}"`,
      });
    }
  }
  return issues;
}

/** Fields that labels sharing a backing label (within one provider) must agree on. */
const SHARED_FIELDS = ['max-parallel-jobs', 'grace-time', 'min-retention-time', 'max-age'] as const;
type SharedField = (typeof SHARED_FIELDS)[number];

const INVALID = Symbol('invalid');

/** The field's value with its default applied (max-age: 0 and unset both off), or INVALID when it fails its schema. */
function sharedFieldValue(
  label: Record<string, unknown>,
  field: SharedField,
): number | undefined | typeof INVALID {
  const result = (metastaticLabelSchema.shape[field] as z.ZodType).safeParse(label[field]);
  if (!result.success) return INVALID;
  const value = result.data as number | undefined;
  if (field === 'max-age' && (value === undefined || value === 0)) return undefined;
  return value;
}

const showShared = (value: number | undefined): string => (value === undefined ? 'off' : String(value));

/**
 * Rule 4: within one provider, labels sharing a backing label agree on the backing node's settings (its
 * slots and how long it lives are one backing node's, whichever label put a node on it).
 */
function sharedBackingSettings(labels: readonly MetastaticLabelRef[]): PathIssue[] {
  const issues: PathIssue[] = [];
  const reference = new Map<string, { value: number | undefined; path: readonly PathSegment[] }>();
  for (const { label, path, providerIndex } of labels) {
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
  return issues;
}

/** Rule 5: the top-level labels list (Nodepool's), when present, has unique names and lists every label offered. */
function topLevelLabels(root: Record<string, unknown>, offers: readonly Offer[]): PathIssue[] {
  if (!Array.isArray(root.labels)) return [];
  const issues: PathIssue[] = [];
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
  if (!complete) return issues;
  for (const offer of offers) {
    if (!listed.has(offer.name)) {
      issues.push({
        path: [...offer.path, 'name'],
        message: `label "${offer.name}" is not listed in the top-level labels`,
      });
    }
  }
  return issues;
}

/**
 * Rule 6: a label's default-lease (its own, its pool's or its provider's) is no longer than its
 * max-lease (likewise inherited): a request asking for no lease would otherwise be refused. Reported once
 * at the default-lease that breaks it.
 */
function leaseRules(root: Record<string, unknown>, labels: readonly MetastaticLabelRef[]): PathIssue[] {
  const issues = new Map<string, PathIssue>();
  const providers = Array.isArray(root.providers) ? root.providers : [];
  for (const { label, path } of labels) {
    const [, pi, , qi] = path;
    const provider = asRecord(providers[pi as number]);
    const pools = provider && Array.isArray(provider.pools) ? provider.pools : [];
    const pool = asRecord(pools[qi as number]);
    const levels: [Record<string, unknown> | undefined, readonly PathSegment[]][] = [
      [label, path],
      [pool, path.slice(0, 4)],
      [provider, path.slice(0, 2)],
    ];
    const inherited = (key: 'default-lease' | 'max-lease') => {
      for (const [where, at] of levels) {
        const result = (metastaticLabelSchema.shape[key] as z.ZodType).safeParse(where?.[key]);
        if (!result.success) return undefined; // its own field error says why
        if (result.data !== undefined) return { value: result.data as number, at };
      }
      return undefined;
    };
    const dflt = inherited('default-lease');
    const max = inherited('max-lease');
    if (!dflt || !max || dflt.value <= max.value) continue;
    const at = [...dflt.at, 'default-lease'];
    issues.set(formatPath(at), {
      path: at,
      message: `default-lease: must be <= max-lease (${max.value}, at ${formatPath([...max.at, 'max-lease'])}), got ${dflt.value}`,
    });
  }
  return [...issues.values()];
}
