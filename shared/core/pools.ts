import type { MetastaticPool, ResolvedConfig } from './model.ts';
import { clip, listSome, MAX_QUOTED_LENGTH } from './text.ts';

/** request-timeout: how long a request may wait to be placed, unless its label says otherwise. */
export const DEFAULT_REQUEST_TIMEOUT = 3 * 3600;

/**
 * Which pools may serve a node set, in the order to try them. A node set is served by one pool
 * (all its labels from the same pool); pools are tried by priority, lower first. The reasons name
 * what a user has to change, since these failures are permanent.
 */
export type PoolChoice =
  | { readonly ok: true; readonly pools: readonly MetastaticPool[] }
  | { readonly ok: false; readonly reason: string };

/** How the reason of a request for labels the configuration lacks begins (clients tell it apart by it). */
export const UNKNOWN_LABEL_REASON = 'unknown label';

export function eligiblePools(config: ResolvedConfig, labels: readonly string[]): PoolChoice {
  // The labels come from users: a reason names a few of them, each cut short (core/text.ts).
  const unknown = [...new Set(labels.filter((l) => !config.metastaticLabelNames.has(l)))];
  if (unknown.length > 0) {
    const known = [...config.metastaticLabelNames].sort().join(', ') || 'none';
    return {
      ok: false,
      reason: `${UNKNOWN_LABEL_REASON}${unknown.length > 1 ? 's' : ''} ${listSome(unknown)} (configured: ${known})`,
    };
  }
  const named = listSome([...new Set(labels)], (l) => clip(l, MAX_QUOTED_LENGTH));
  const offering = config.metastaticPools.filter((p) => labels.every((l) => p.labels.has(l)));
  if (offering.length === 0) {
    return { ok: false, reason: `no pool offers all of the labels ${named} together` };
  }
  const enabled = offering.filter((p) => p.maxServers === undefined || p.maxServers > 0);
  if (enabled.length === 0) {
    return {
      ok: false,
      reason: `every pool offering ${named} is disabled (max-servers <= 0): ${offering.map((p) => p.key).join(', ')}`,
    };
  }
  const fitting = enabled.filter((p) => p.maxServers === undefined || p.maxServers >= labels.length);
  if (fitting.length === 0) {
    const largest = Math.max(...enabled.map((p) => p.maxServers ?? 0));
    return {
      ok: false,
      reason: `a node set of ${labels.length} exceeds max-servers of every pool that offers it (largest: ${largest})`,
    };
  }
  return { ok: true, pools: fitting };
}

/**
 * How long a request for `labels` may wait to be placed, in seconds (request-timeout: the label's, else
 * its pool's, else its provider's). A node set waits as long as the most patient of the settings that
 * could serve it allow: the longest over its labels in every pool offering them all. A request no pool
 * offers any more (its labels were removed) gets the default.
 */
export function requestTimeoutOf(config: ResolvedConfig, labels: readonly string[]): number {
  const timeouts = config.metastaticPools
    .filter((p) => labels.every((l) => p.labels.has(l)))
    .flatMap((p) => labels.map((l) => p.labels.get(l)?.requestTimeout ?? DEFAULT_REQUEST_TIMEOUT));
  return timeouts.length > 0 ? Math.max(...timeouts) : DEFAULT_REQUEST_TIMEOUT;
}

/** The shortest request-timeout any request can have (seconds): no request younger than it is due. */
export function shortestRequestTimeout(config: ResolvedConfig): number {
  const all = config.metastaticPools.flatMap((p) => [...p.labels.values()].map((l) => l.requestTimeout));
  return Math.min(DEFAULT_REQUEST_TIMEOUT, ...all);
}

/**
 * A pending request's budget (seconds from its placement): each of a node's launch-retries attempts is
 * bounded by launch-timeout (from its backing node's launch) and boot-timeout (from its first `running`),
 * so a request still pending after all of them is stuck, not slow. The reaper adds PENDING_GRACE_MS
 * (core/timing.ts) for it to settle the last attempt. A request of a pool no longer configured gets the
 * longest budget of any pool (never failed sooner than it could have been by its own).
 */
export function pendingTimeoutOf(config: ResolvedConfig, poolKey: string | undefined): number {
  const pool = config.metastaticPools.find((p) => p.key === poolKey);
  if (pool) return poolPendingTimeout(pool);
  const all = config.metastaticPools.map(poolPendingTimeout);
  return all.length > 0 ? Math.max(...all) : DEFAULT_PENDING_TIMEOUT;
}

/** The shortest pending budget of any pool (seconds): no request placed more recently is due. */
export function shortestPendingTimeout(config: ResolvedConfig): number {
  return Math.min(DEFAULT_PENDING_TIMEOUT, ...config.metastaticPools.map(poolPendingTimeout));
}

function poolPendingTimeout(pool: MetastaticPool): number {
  return pool.launchRetries * (pool.launchTimeout + pool.bootTimeout);
}

/** The budget with the provider defaults (launch-retries 3, launch-timeout 3600, boot-timeout 120). */
const DEFAULT_PENDING_TIMEOUT = 3 * (3600 + 120);

/** Why a request still pending past its deadline ends. */
export function pendingTimeoutReason(
  config: ResolvedConfig,
  poolKey: string | undefined,
  pendingMs: number,
  graceMs: number,
): string {
  const pool = config.metastaticPools.find((p) => p.key === poolKey);
  const budget = pool
    ? `launch-retries ${pool.launchRetries} x (launch-timeout ${pool.launchTimeout}s + boot-timeout ${pool.bootTimeout}s)`
    : `${pendingTimeoutOf(config, poolKey)}s, the longest of any pool (pool ${poolKey ?? 'unknown'} is no longer configured)`;
  return (
    `pending past its deadline: not ready ${Math.floor(pendingMs / 1000)}s after it was placed ` +
    `(${budget}, and ${Math.round(graceMs / 1000)}s to settle the last attempt)`
  );
}

/** A node's attributes: the backing node's are the defaults; the pool's node-attributes override top-level keys. */
export function nodeAttributes(
  backing: Readonly<Record<string, unknown>> | undefined,
  pool: Readonly<Record<string, unknown>>,
): Record<string, unknown> {
  return { ...(backing ?? {}), ...pool };
}
