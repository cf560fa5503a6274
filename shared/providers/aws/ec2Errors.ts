/**
 * How the EC2 provider sorts EC2 API errors, and its one backoff policy for throttling.
 *
 * - capacity: this offering (instance type x subnet x spot/on-demand) cannot be served now; try the next.
 * - quota: an account limit was reached. It holds for the launches of its scope only (quotaScope): the
 *   provider skips the offerings in that scope for a while and goes on with the others.
 * - throttle / transient: the call may succeed if repeated a little later (with the same ClientToken).
 * - not-found: the instance (or image) does not exist, or (EC2 is eventually consistent) not yet.
 * - other: a configuration or permission problem; the launch attempt fails with the code and message.
 *
 * EC2 sends capacity errors (InsufficientInstanceCapacity...) and RequestLimitExceeded as server errors
 * (HTTP 500 / 503), quotas and not-found as client errors (400): the code decides, never the status.
 */

/** EC2 error codes meaning "no capacity for this offering now" (the next offering may have some). */
export const CAPACITY_ERROR_CODES: ReadonlySet<string> = new Set([
  'InsufficientInstanceCapacity',
  'InsufficientCapacity',
  'InsufficientHostCapacity',
  'InsufficientReservedInstanceCapacity',
  // The instance type (or spot for it) is not offered in the subnet's availability zone.
  'Unsupported',
  'SpotMaxPriceTooLow',
  'InsufficientFreeAddressesInSubnet',
]);

/** Capacity errors that hold for every instance type in the subnet, not only the one tried. */
export const SUBNET_WIDE_ERROR_CODES: ReadonlySet<string> = new Set(['InsufficientFreeAddressesInSubnet']);

/** EC2 error codes of account quotas: the offerings in the quota's scope (quotaScope) are skipped for a while. */
export const QUOTA_ERROR_CODES: ReadonlySet<string> = new Set([
  'VcpuLimitExceeded',
  'InstanceLimitExceeded',
  'MaxSpotInstanceCountExceeded',
]);

/** What a quota scope is computed from: the offering that hit it. */
export interface QuotaSubject {
  readonly instanceType: string;
  readonly market: 'spot' | 'on-demand';
}

/**
 * AWS's vCPU quota bucket of an instance type ("Running On-Demand Standard (A, C, D, H, I, M, R, T, Z)
 * instances", "All G and VT Spot Instance Requests", ...), from the letters that start its family. An
 * unknown family is a bucket of its own: skipping too little costs one more failed call, too much a launch.
 */
export function vcpuQuotaBucket(instanceType: string): string {
  const letters = /^[a-z]+/.exec(instanceType.toLowerCase())?.[0] ?? instanceType;
  const named: Record<string, string> = {
    inf: 'Inf',
    trn: 'Trn',
    dl: 'DL',
    hpc: 'HPC',
    vt: 'G and VT',
    g: 'G and VT',
    u: 'High Memory (U)',
    f: 'F',
    p: 'P',
    x: 'X',
  };
  const known = named[letters];
  if (known !== undefined) return known;
  if (/^[acdhimrtz]/.test(letters)) return 'Standard (A, C, D, H, I, M, R, T, Z)';
  if (letters.startsWith('g')) return 'G and VT';
  return letters.toUpperCase();
}

/**
 * The launches a quota error holds for. Quotas belong to the account and region, never to a subnet, and
 * on-demand and spot have separate quotas on AWS:
 * - MaxSpotInstanceCountExceeded: every spot launch (the account's spot quota; its message names no
 *   bucket). On-demand launches go on.
 * - VcpuLimitExceeded: launches of the same market and vCPU bucket (the message says "the instance
 *   bucket that the specified instance type belongs to"; each bucket has an on-demand and a spot quota).
 * - InstanceLimitExceeded: launches of the same market and instance type (the older per-type
 *   instance-count limit).
 */
export function quotaScope(code: string, subject: QuotaSubject): string {
  switch (code) {
    case 'MaxSpotInstanceCountExceeded':
      return 'spot instances';
    case 'VcpuLimitExceeded':
      return `${subject.market} ${vcpuQuotaBucket(subject.instanceType)} instances`;
    default:
      return `${subject.market} ${subject.instanceType} instances`;
  }
}

/** Every quota scope that covers a launch of this instance type and market. */
export function quotaScopesOf(subject: QuotaSubject): string[] {
  return [
    ...(subject.market === 'spot' ? [quotaScope('MaxSpotInstanceCountExceeded', subject)] : []),
    quotaScope('VcpuLimitExceeded', subject),
    quotaScope('InstanceLimitExceeded', subject),
  ];
}

/** EC2 (and generic AWS) error codes of API rate limiting. */
export const THROTTLING_ERROR_CODES: ReadonlySet<string> = new Set([
  'RequestLimitExceeded',
  'Throttling',
  'ThrottlingException',
]);

/** Server-side or network failures that are safe to repeat (launches carry a ClientToken). */
const TRANSIENT_ERROR_CODES: ReadonlySet<string> = new Set([
  'InternalError',
  'InternalFailure',
  'ServiceUnavailable',
  'Unavailable',
  'RequestTimeout',
  'RequestTimeoutException',
  'TimeoutError',
  'ECONNRESET',
  'ECONNREFUSED',
  'ETIMEDOUT',
  'EPIPE',
  'EAI_AGAIN',
]);

export const NOT_FOUND_ERROR_CODES: ReadonlySet<string> = new Set([
  'InvalidInstanceID.NotFound',
  'InvalidInstanceID.Malformed',
]);

export type Ec2ErrorKind = 'capacity' | 'quota' | 'throttle' | 'transient' | 'not-found' | 'other';

function field(err: unknown, key: string): unknown {
  return typeof err === 'object' && err !== null ? (err as Record<string, unknown>)[key] : undefined;
}

/** The EC2 error code (`InsufficientInstanceCapacity`...): the SDK puts it in `name`. */
export function ec2ErrorCode(err: unknown): string {
  for (const key of ['Code', 'code', 'name']) {
    const value = field(err, key);
    if (typeof value === 'string' && value !== '' && value !== 'Error') return value;
  }
  return 'Error';
}

export function ec2ErrorMessage(err: unknown): string {
  const message = field(err, 'message');
  return typeof message === 'string' && message !== '' ? message : String(err);
}

export function classifyEc2Error(err: unknown): Ec2ErrorKind {
  const code = ec2ErrorCode(err);
  if (CAPACITY_ERROR_CODES.has(code)) return 'capacity';
  if (QUOTA_ERROR_CODES.has(code)) return 'quota';
  if (THROTTLING_ERROR_CODES.has(code)) return 'throttle';
  if (NOT_FOUND_ERROR_CODES.has(code)) return 'not-found';
  if (TRANSIENT_ERROR_CODES.has(code) || field(err, '$fault') === 'server') return 'transient';
  return 'other';
}

/** `InsufficientInstanceCapacity: We currently do not have sufficient m7i.large capacity...` */
export function describeEc2Error(err: unknown): string {
  return `${ec2ErrorCode(err)}: ${ec2ErrorMessage(err)}`;
}

// ---- backoff ----------------------------------------------------------------------------------------

export interface BackoffPolicy {
  /** The first step, ms. */
  readonly baseMs: number;
  /** Each further step is this many times the previous one... */
  readonly factor: number;
  /** ...up to this, ms. */
  readonly maxMs: number;
  /** Retries within one provider call (launch, describe, list, terminate) before giving up. */
  readonly maxRetries: number;
}

/** Arvados' throttling backoff: 1 s, x1.5, at most 60 s; 4 retries in one call (about 8 s at most). */
export const DEFAULT_BACKOFF: BackoffPolicy = { baseMs: 1_000, factor: 1.5, maxMs: 60_000, maxRetries: 4 };

/**
 * The sleep before retry number `retry` (0-based), with "equal jitter": half of the step is fixed and
 * half is random, so delays still grow while concurrent callers spread out.
 */
export function backoffDelay(policy: BackoffPolicy, retry: number, random: () => number): number {
  const step = Math.min(policy.maxMs, policy.baseMs * policy.factor ** retry);
  return Math.round(step / 2 + (random() * step) / 2);
}
