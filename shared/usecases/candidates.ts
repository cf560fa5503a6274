import type { MetastaticPool } from '../config/model.ts';
import type { Page } from '../core/poolStore.ts';
import type { BackingRecord } from '../core/records.ts';
import type { Context } from './context.ts';

/** How many candidates one Query brings back; the first claimable one almost always wins. */
export const CANDIDATES_PER_QUERY = 10;

/**
 * Asks for the first page of a label's candidates now, for a placeNode that comes after something else
 * (a capped pool's reservation): the Query goes out with that work, not after it, one round trip less
 * in sequence (issue 26). Read-only, so a reservation that finds the pool full wastes one Query, nothing
 * else. A failure is left to placeNode's own Query (undefined), which reports it if it persists.
 */
export function prefetchCandidates(
  ctx: Context,
  pool: MetastaticPool,
  label: string,
): Promise<Page<BackingRecord> | undefined> {
  return ctx.store.findCandidates(pool.key, label, CANDIDATES_PER_QUERY).catch(() => undefined);
}
