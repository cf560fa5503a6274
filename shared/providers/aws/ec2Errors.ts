/**
 * How the EC2 provider sorts EC2 API errors, and its one backoff policy for throttling.
 *
 * - capacity: this offering (instance type x subnet x spot/on-demand) cannot be served now; try the next.
 * - quota: an account limit; more launches in the pool would fail the same way, so launching pauses.
 * - throttle / transient: the call may succeed if repeated a little later (with the same ClientToken).
 * - not-found: the instance (or image) does not exist.
 * - other: a configuration or permission problem; the launch attempt fails with the code and message.
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

/** EC2 error codes of account quotas: the pool pauses launching. */
export const QUOTA_ERROR_CODES: ReadonlySet<string> = new Set([
  'VcpuLimitExceeded',
  'InstanceLimitExceeded',
  'MaxSpotInstanceCountExceeded',
]);

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
