import type { Clock } from '../../core/clock.ts';
import {
  ec2ErrorCode,
  ec2ErrorMessage,
  quotaScope,
  quotaScopesOf,
  SUBNET_WIDE_ERROR_CODES,
} from './ec2Errors.ts';
import type { AwsLabelSettings } from './settings.ts';

/**
 * Offerings, and what the provider remembers about them.
 *
 * - Offerings are tried in order: with `use-spot`, every spot offering first (each instance type x each
 *   subnet), then every on-demand one; without, the on-demand ones. A spot capacity miss therefore tries
 *   spot in the other subnets and types before paying for on-demand.
 * - A capacity error moves to the next offering and is remembered for 5 minutes (later launches skip
 *   that offering, or the whole subnet when it ran out of addresses).
 * - A quota error is remembered for 5 minutes against its scope only (ec2Errors.ts quotaScope: quotas
 *   are per account and region, and on-demand and spot have separate ones): MaxSpotInstanceCountExceeded
 *   skips every spot offering, VcpuLimitExceeded the offerings of the same market and vCPU bucket
 *   (Standard, G and VT, P, ...), InstanceLimitExceeded those of the same market and instance type; the
 *   launch goes on with the offerings outside the scope. Quotas are shared by every pool of one provider
 *   (one client, one account).
 */

/** How long an offering that had no capacity is skipped. */
export const OFFERING_BACKOFF_MS = 5 * 60_000;
/** How long the offerings in a quota's scope are skipped after a quota error. */
export const QUOTA_PAUSE_MS = 5 * 60_000;

export type Market = 'spot' | 'on-demand';

/** One way to launch a label: an instance type in a subnet, spot or on-demand. */
export interface Offering {
  readonly instanceType: string;
  readonly subnetId: string;
  readonly market: Market;
}

/**
 * With use-spot every spot offering, then every on-demand one; without, the on-demand ones. Within a
 * market: every instance type (in order) x every subnet (in order).
 */
export function offeringsOf(settings: AwsLabelSettings): Offering[] {
  const markets: Market[] = settings.useSpot ? ['spot', 'on-demand'] : ['on-demand'];
  const out: Offering[] = [];
  for (const market of markets) {
    for (const instanceType of settings.instanceTypes) {
      for (const subnetId of settings.subnetIds) out.push({ instanceType, subnetId, market });
    }
  }
  return out;
}

/** `m7i.large in subnet-1 (spot)` */
export function describeOffering(o: Offering): string {
  return `${o.instanceType} in ${o.subnetId} (${o.market})`;
}

/** A failure remembered against an offering, its subnet, or a quota's scope. */
export interface Remembered {
  readonly kind: 'capacity' | 'quota';
  readonly code: string;
  readonly message: string;
  /** For a quota: the launches it holds for (ec2Errors.ts quotaScope). */
  readonly scope?: string;
  readonly at: number;
  readonly until: number;
}

/** `InsufficientInstanceCapacity` / `MaxSpotInstanceCountExceeded (quota: spot instances)` */
export function describeMemo(memo: Remembered): string {
  return memo.kind === 'quota' ? `${memo.code} (quota: ${memo.scope})` : memo.code;
}

const offeringKey = (o: Offering) => `offering\n${o.instanceType}\n${o.subnetId}\n${o.market}`;
const subnetKey = (subnetId: string) => `subnet\n${subnetId}`;
const quotaKey = (scope: string) => `quota\n${scope}`;

/** The offerings, whole subnets and quota scopes that failed a moment ago, until their pause ends. */
export class OfferingMemory {
  private readonly failures = new Map<string, Remembered>();

  constructor(private readonly clock: Clock) {}

  /** The unexpired failure remembered for the offering: its own, its subnet's, or a quota covering it. */
  remembered(o: Offering): Remembered | undefined {
    const now = this.clock.now();
    const keys = [offeringKey(o), subnetKey(o.subnetId), ...quotaScopesOf(o).map(quotaKey)];
    for (const key of keys) {
      const memo = this.failures.get(key);
      if (!memo) continue;
      if (memo.until > now) return memo;
      this.failures.delete(key);
    }
    return undefined;
  }

  /** The reason every offering of the label is remembered as failed, or undefined when one is not. */
  labelBlocked(settings: AwsLabelSettings): string | undefined {
    const offerings = offeringsOf(settings);
    const failures = offerings.map((o) => this.remembered(o));
    if (failures.some((f) => f === undefined)) return undefined;
    const until = Math.min(...failures.map((f) => f?.until ?? 0));
    return `no offering of label ${settings.label} in backing pool ${settings.poolKey} can launch until ${new Date(until).toISOString()}: ${offerings
      .map((o, i) => `${describeOffering(o)}: ${failures[i] ? describeMemo(failures[i]) : ''}`)
      .join('; ')}`;
  }

  /** An offering had no capacity: skipped (or its whole subnet, out of addresses) for OFFERING_BACKOFF_MS. */
  rememberCapacity(o: Offering, err: unknown): void {
    const now = this.clock.now();
    const code = ec2ErrorCode(err);
    const memo: Remembered = {
      kind: 'capacity',
      code,
      message: ec2ErrorMessage(err),
      at: now,
      until: now + OFFERING_BACKOFF_MS,
    };
    this.failures.set(SUBNET_WIDE_ERROR_CODES.has(code) ? subnetKey(o.subnetId) : offeringKey(o), memo);
  }

  /** A quota was reached: every offering in its scope is skipped for QUOTA_PAUSE_MS. */
  rememberQuota(o: Offering, err: unknown): Remembered {
    const now = this.clock.now();
    const code = ec2ErrorCode(err);
    const scope = quotaScope(code, o);
    const memo: Remembered = {
      kind: 'quota',
      code,
      message: ec2ErrorMessage(err),
      scope,
      at: now,
      until: now + QUOTA_PAUSE_MS,
    };
    this.failures.set(quotaKey(scope), memo);
    return memo;
  }
}
