import { SLOT_PIDS } from '../../core/slotLimits.ts';
import {
  DEFAULT_AWS_USERNAME,
  PER_SLOT_USERNAME,
  PER_SLOT_USERNAME_PATTERN,
} from '../../fields/contractFields.ts';
import { MAX_PARALLEL_JOBS, MAX_VOLUME_SIZE } from '../../fields/fields.ts';
import { asRecord, formatPath, type PathIssue, type PathSegment } from '../../fields/paths.ts';
import { type EBS_VOLUME_TYPES, MAX_USERDATA_BYTES } from './configSchema.ts';
import type { FunctionsNetwork } from './networkRules.ts';
import { consoleOutputSupport } from './nitro.ts';
import { composeUserData, userDataBytes } from './userData.ts';

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

/** Contained slots' limits at their longest, for the size of the user data before the shapes are known. */
const WIDEST = { millicores: 1_000_000, memoryMiB: 10_000_000, pids: SLOT_PIDS };

/**
 * What an aws pool puts on its instances (authorized-keys, per-slot users; shared/providers/aws/userData.ts):
 * per-slot-users needs the pool's authorized-keys (its users get no other key) and a username that
 * leaves room for the slot number; the user data, the label's own combined with ours, must fit EC2's
 * 16 KB. `slotsOf` gives the slots of a backing label's backing nodes (the largest max-parallel-jobs of
 * the metastatic labels on it): one user each. Unvalidated data: a malformed part is the schema's error.
 */
export function checkAwsUserData(
  provider: Record<string, unknown>,
  providerPath: readonly PathSegment[],
  slotsOf: (backingLabel: string) => number,
): PathIssue[] {
  const issues: PathIssue[] = [];
  if (!Array.isArray(provider.pools)) return issues;
  provider.pools.forEach((rawPool, poolIndex) => {
    const pool = asRecord(rawPool);
    if (!pool || !Array.isArray(pool.labels)) return;
    const poolPath = [...providerPath, 'pools', poolIndex];
    const raw = pool['authorized-keys'];
    const keys =
      Array.isArray(raw) && raw.every((k) => typeof k === 'string') ? (raw as string[]) : undefined;
    pool.labels.forEach((rawLabel, labelIndex) => {
      const label = asRecord(rawLabel);
      if (!label) return;
      const labelPath = [...poolPath, 'labels', labelIndex];
      const perSlot = label['per-slot-users'] === true;
      const contain = label.isolation === 'contain';
      const username = label.username === undefined ? DEFAULT_AWS_USERNAME : label.username;
      if (contain && !perSlot) {
        issues.push({
          path: [...labelPath, 'isolation'],
          message:
            'isolation: contain needs per-slot-users: true (each slot is contained as a user of its own)',
        });
      }
      if (label['slot-imds'] === true && !contain) {
        issues.push({
          path: [...labelPath, 'slot-imds'],
          message:
            'slot-imds applies to contained slots only (isolation: contain); without it every job can reach IMDS',
        });
      }
      if (perSlot && (raw === undefined || (Array.isArray(raw) && raw.length === 0))) {
        issues.push({
          path: [...labelPath, 'per-slot-users'],
          message: `per-slot-users needs the pool's authorized-keys (${formatPath([...poolPath, 'authorized-keys'])}): the slot users get no other key, so nobody could log in`,
        });
      }
      if (perSlot && typeof username === 'string' && !PER_SLOT_USERNAME_PATTERN.test(username)) {
        issues.push({
          path: [...labelPath, label.username === undefined ? 'per-slot-users' : 'username'],
          message: `username: expected ${PER_SLOT_USERNAME}, got ${JSON.stringify(username)}`,
        });
      }
      const own = label.userdata;
      if (
        keys === undefined ||
        (own !== undefined && typeof own !== 'string') ||
        typeof username !== 'string'
      ) {
        return;
      }
      const name = typeof label.name === 'string' ? label.name : '';
      const slots = Math.min(Math.max(1, slotsOf(name)), MAX_PARALLEL_JOBS);
      const text = composeUserData({
        ...(own === undefined ? {} : { own }),
        authorizedKeys: keys,
        ...(perSlot
          ? {
              slotUsers: {
                username,
                slots,
                ...(contain ? { contain: { limits: WIDEST, imds: false } } : {}),
              },
            }
          : {}),
      });
      const bytes = text === undefined ? 0 : userDataBytes(text);
      // The label's own userdata alone over the limit is its field's error.
      if (bytes <= MAX_USERDATA_BYTES || keys.length + (perSlot ? 1 : 0) === 0) return;
      const parts = [
        own === undefined ? undefined : 'its userdata',
        keys.length > 0 ? `the pool's ${keys.length} authorized-keys` : undefined,
        perSlot ? `${slots} slot users (per-slot-users, one per slot of max-parallel-jobs)` : undefined,
      ].filter((p): p is string => p !== undefined);
      issues.push({
        path: [...labelPath, own !== undefined ? 'userdata' : perSlot ? 'per-slot-users' : 'name'],
        message: `user data: ${parts.join(' with ')} make ${bytes} bytes of user data; EC2 takes at most ${MAX_USERDATA_BYTES}`,
      });
    });
  });
  return issues;
}

/** What checkConsoleHostKeys finds: errors, and warnings (ResolvedConfig.notices). */
export interface ConsoleHostKeyIssues {
  readonly errors: PathIssue[];
  readonly warnings: PathIssue[];
}

const CONSOLE_FIXES =
  'use an instance type built on the Nitro system (5th generation and later: m5, c6g, r7i, ...; t3, t4g), ' +
  "host-keys: scan with a network path to the instances (the functions in the instances' VPC, or " +
  'public-ipv4: true), or host-keys: none (docs/aws.md, Host keys)';

/**
 * `host-keys: console` (the label's, else the pool's; unset, it is the default where the functions cannot
 * reach the instances) needs GetConsoleOutput's `Latest`, which only the Nitro hypervisor supports
 * (nitro.ts): an instance type certainly not Nitro is an error at the type, one not known here a
 * warning. Refused rather than warned because such a pool cannot work as configured: EC2 gives a Xen
 * instance's console only as it buffered it at a state change, the block cloud-init prints after boot
 * may not be in it within boot-timeout, and each backing node would then fail with its instance
 * launched for nothing, as for a scan without a network path (networkRules.ts); the fixes cost
 * nothing. An unset host-keys counts only when `network` says where the functions run (synth and
 * `metastatic validate` give it); without it only an explicit `console` is checked.
 */
export function checkConsoleHostKeys(data: unknown, network?: FunctionsNetwork): ConsoleHostKeyIssues {
  const out: ConsoleHostKeyIssues = { errors: [], warnings: [] };
  const providers = asRecord(data)?.providers;
  if (!Array.isArray(providers)) return out;
  providers.forEach((rawProvider, pi) => {
    const provider = asRecord(rawProvider);
    if (provider?.driver !== 'aws' || !Array.isArray(provider.pools)) return;
    provider.pools.forEach((rawPool, qi) => {
      const pool = asRecord(rawPool);
      if (!pool || !Array.isArray(pool.labels)) return;
      pool.labels.forEach((rawLabel, li) => {
        const label = asRecord(rawLabel);
        if (!label) return;
        const own = label['host-keys'] ?? pool['host-keys'];
        const byDefault =
          own === undefined &&
          network !== undefined &&
          !network.functionsInVpc &&
          pool['public-ipv4'] !== true;
        if (own !== 'console' && !byDefault) return;
        const why = byDefault
          ? "host-keys: console (the default: the functions cannot reach the instances) reads the keys from the console output with GetConsoleOutput's Latest"
          : "host-keys: console reads the keys from the console output with GetConsoleOutput's Latest";
        const labelPath: PathSegment[] = ['providers', pi, 'pools', qi, 'labels', li];
        const types: Array<[unknown, PathSegment[]]> = Array.isArray(label['instance-types'])
          ? label['instance-types'].map((t, ti) => [t, [...labelPath, 'instance-types', ti]])
          : [[label['instance-type'], [...labelPath, 'instance-type']]];
        for (const [type, path] of types) {
          if (typeof type !== 'string' || type === '') continue;
          const support = consoleOutputSupport(type);
          if (support === 'buffered') {
            out.errors.push({
              path,
              message:
                `${type} is not built on the Nitro system, and ${why}, which only Nitro instances support: ` +
                `EC2 gives its console output only as buffered at a state change, which may not show the host keys within boot-timeout, failing every backing node; ${CONSOLE_FIXES}`,
            });
          } else if (support === 'unknown') {
            out.warnings.push({
              path,
              message:
                `${type} is not known here to be built on the Nitro hypervisor, and ${why}, which only Nitro instances support: ` +
                "if it is not (aws ec2 describe-instance-types --instance-types <type> --query 'InstanceTypes[].Hypervisor' says), " +
                'its backing nodes may fail at boot-timeout waiting for the keys',
            });
          }
        }
      });
    });
  });
  return out;
}
