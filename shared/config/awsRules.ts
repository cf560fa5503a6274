import type { EBS_VOLUME_TYPES } from './awsSchema.ts';
import { MAX_VOLUME_SIZE } from './fields.ts';
import { asRecord, type PathIssue, type PathSegment } from './paths.ts';

/**
 * The aws driver's rules across keys (the field schema is in schema.ts, typed settings in
 * shared/providers/aws/settings.ts): exactly one of each alternative (subnet-ids / subnet-id, ...), no
 * root volume settings with a launch template, the volume size allowed for its EBS type, no reserved
 * tag keys.
 */

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
export function checkAwsRules(
  provider: Record<string, unknown>,
  providerPath: readonly PathSegment[],
): PathIssue[] {
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
