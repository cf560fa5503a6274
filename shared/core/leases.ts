import type { ResolvedConfig } from './model.ts';
import type { RequestRecord } from './records.ts';

/**
 * Client leases: a request may carry a lease, in seconds; its client renews it, and once it lapses the
 * reaper releases every node of the request with LEASE_EXPIRED_REASON. Pure arithmetic and decisions of
 * data and a clock (`now`, epoch ms): the store and the use cases (usecases/release/leases.ts) act on
 * what these return.
 *
 * Not to be confused with the slot lease (core/timing.ts), the pool's own bound on an unconfirmed claim.
 */

/** Below 10 s a renewal could not cross the queue and the request function in time. */
export const MIN_LEASE = 10;
/** A week: longer is more likely milliseconds typed as seconds (as MAX_EXPECTED_DURATION). */
export const MAX_LEASE = 7 * 24 * 3600;
export const LEASE_RULE = `must be a whole number of seconds from ${MIN_LEASE} to ${MAX_LEASE} (7 days)`;
export const LEASE_EXPIRED_REASON = 'lease expired';

/** A lease length from a message or the command line, or why it is refused. */
export function checkLeaseSeconds(
  value: unknown,
): { ok: true; seconds: number } | { ok: false; reason: string } {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < MIN_LEASE || value > MAX_LEASE) {
    return { ok: false, reason: `lease ${LEASE_RULE}, got ${JSON.stringify(value) ?? String(value)}` };
  }
  return { ok: true, seconds: value };
}

/** The lease settings that apply to a node set (default-lease / max-lease of its labels, seconds). */
export interface LeaseLimits {
  readonly default?: number;
  readonly max?: number;
}

/**
 * What the configuration says of leases for `labels`: over every pool that offers them all, the
 * strictest (smallest) maximum and the smallest default (a node set is held no longer than its most
 * careful label allows). A label's settings are its own, else its pool's, else its provider's.
 */
export function leaseLimitsOf(config: ResolvedConfig, labels: readonly string[]): LeaseLimits {
  const settings = config.metastaticPools
    .filter((p) => labels.length > 0 && labels.every((l) => p.labels.has(l)))
    .flatMap((p) => labels.map((l) => p.labels.get(l)))
    .filter((l) => l !== undefined);
  const min = (xs: (number | undefined)[]) => {
    const set = xs.filter((x): x is number => x !== undefined);
    return set.length > 0 ? Math.min(...set) : undefined;
  };
  const max = min(settings.map((l) => l.maxLease));
  const dflt = min(settings.map((l) => l.defaultLease));
  return {
    ...(max === undefined ? {} : { max }),
    ...(dflt === undefined ? {} : { default: max === undefined ? dflt : Math.min(dflt, max) }),
  };
}

/**
 * The lease a request takes: the one it asked for (within the maximum), else the default, else the
 * maximum (a pool that bounds leases holds no node without one), else none.
 */
export function leaseOfRequest(
  asked: number | undefined,
  limits: LeaseLimits,
): { ok: true; seconds?: number } | { ok: false; reason: string } {
  if (asked === undefined) {
    const seconds = limits.default ?? limits.max;
    return seconds === undefined ? { ok: true } : { ok: true, seconds };
  }
  const checked = checkLeaseSeconds(asked);
  if (!checked.ok) return checked;
  if (limits.max !== undefined && asked > limits.max) {
    return { ok: false, reason: `lease ${asked} s is above the maximum of ${limits.max} s (max-lease)` };
  }
  return { ok: true, seconds: asked };
}

/** When a lease of `seconds` taken or renewed at `now` lapses (epoch ms). */
export function leaseExpiry(now: number, seconds: number): number {
  return now + seconds * 1000;
}

/** A request's nodes that a lease still holds (pending or ready), or the request itself while waiting. */
export function holdsAnything(r: RequestRecord): boolean {
  if (r.state === 'requested') return true;
  if (r.state === 'failed') return false;
  return r.nodes.some((n) => n.state === 'pending' || n.state === 'ready');
}

/** Whether the request belongs in the lease partition: leased and still holding something. */
export function isLeaseLive(r: RequestRecord): boolean {
  return r.leaseExpiresAt !== undefined && holdsAnything(r);
}

export type RenewDecision =
  | { readonly kind: 'renew'; readonly seconds: number; readonly expiresAt: number }
  | { readonly kind: 'refuse'; readonly reason: string };

/**
 * Whether a renewal of `r` at `now` (with a new length, or the request's own) may be written, and the new
 * expiry. Refused: an unknown or ended request (nothing is revived), one without a lease, a lease that
 * already lapsed (the reaper is releasing, or will release, its nodes), a length out of bounds.
 */
export function renewDecision(
  id: string,
  r: RequestRecord | undefined,
  now: number,
  asked: number | undefined,
  limits: LeaseLimits,
): RenewDecision {
  if (!r) return { kind: 'refuse', reason: `unknown request "${id}"` };
  if (!holdsAnything(r)) {
    return {
      kind: 'refuse',
      reason: `request ${id} has ended (${r.state === 'failed' ? `failed${r.reason ? `: ${r.reason}` : ''}` : 'its nodes were released'}): there is nothing to renew`,
    };
  }
  if (r.leaseExpiresAt === undefined || r.lease === undefined) {
    return { kind: 'refuse', reason: `request ${id} has no lease: send one with the request ("lease")` };
  }
  if (r.leaseLapsedAt !== undefined || r.leaseExpiresAt <= now) {
    return {
      kind: 'refuse',
      reason: `request ${id}: its lease expired at ${new Date(r.leaseExpiresAt).toISOString()}; its nodes are released`,
    };
  }
  const length = leaseOfRequest(asked ?? r.lease, asked === undefined ? {} : limits);
  if (!length.ok) return { kind: 'refuse', reason: length.reason };
  const seconds = length.seconds ?? r.lease;
  return { kind: 'renew', seconds, expiresAt: leaseExpiry(now, seconds) };
}

export type LapseDecision =
  /** The index lagged behind a renewal (or the clock): nothing to do. */
  | { readonly kind: 'keep' }
  /** Lapsed and still holding nodes: mark it lapsed (conditioned on `expiresAt`), then release them. */
  | { readonly kind: 'release'; readonly expiresAt: number }
  /** Holds nothing any more (its nodes were released one by one): only leaves the lease partition. */
  | { readonly kind: 'drop' };

/** The reaper's decision on a request it found in the lease partition at `now`. */
export function lapseDecision(r: RequestRecord, now: number): LapseDecision {
  if (r.leaseExpiresAt === undefined || !holdsAnything(r)) return { kind: 'drop' };
  if (r.leaseLapsedAt === undefined && r.leaseExpiresAt > now) return { kind: 'keep' };
  return { kind: 'release', expiresAt: r.leaseExpiresAt };
}

/**
 * The request as it should be recorded with its lease (the message's, else its labels' default-lease),
 * or why the lease is refused (the request then fails with that reason, as for any bad request).
 */
export function withLeaseOf(
  config: ResolvedConfig,
  fresh: RequestRecord,
  asked: number | undefined,
): { ok: true; request: RequestRecord } | { ok: false; reason: string } {
  const lease = leaseOfRequest(asked, leaseLimitsOf(config, fresh.labels));
  if (!lease.ok) return lease;
  if (lease.seconds === undefined) return { ok: true, request: fresh };
  return {
    ok: true,
    request: { ...fresh, lease: lease.seconds, leaseExpiresAt: leaseExpiry(fresh.createdAt, lease.seconds) },
  };
}
