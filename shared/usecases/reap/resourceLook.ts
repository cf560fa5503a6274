import { notFoundIsFinal } from '../../core/lifecycle.ts';
import type { BackingProvider, BackingResource } from '../../core/provider.ts';
import type { BackingRecord } from '../../core/records.ts';
import type { Context } from '../context.ts';

/**
 * What a backing node's resource is, as its provider can tell now: asked by the reaper (reconciliation,
 * retirement) and by the fulfil function before it acts on an event that says the resource is gone.
 */

export function providerFor(ctx: Context<unknown>, b: BackingRecord): BackingProvider {
  return ctx.providers.forPool(b.backingPoolKey);
}

/** Gone, or no longer usable: a stopped (not terminated) machine serves nobody either. */
export function isGone(r: BackingResource | undefined): boolean {
  return r === undefined || (r.state !== 'pending' && r.state !== 'running');
}

/** What a look at a backing node's resource found: gone, or why not (`unseen`: not found yet). */
export type Look =
  | { readonly gone: true }
  | { readonly gone: false; readonly why: string; readonly unseen?: true };

/**
 * Whether a backing node's resource is gone, as far as its provider can tell now. Described in a state
 * other than pending or running: gone. Not found: gone for a provider whose "not found" is final; for an
 * eventually consistent one (EC2) only once the id has been recorded for RESOURCE_NOT_FOUND_GRACE_MS and
 * a second describe does not find it either. Before that it is `unseen`: a new instance EC2 does not show
 * yet, which must not be failed (nor its terminate taken as done).
 */
export async function lookUp(
  ctx: Context<unknown>,
  provider: BackingProvider,
  b: BackingRecord,
): Promise<Look> {
  return (await lookUpMany(ctx, provider, [b])).get(b.id) as Look;
}

/**
 * lookUp for backing nodes (with resources) of one provider at once: one describeMany (EC2: one call
 * per 200 ids), and one more for those not found past the grace. By backing node id. Within the
 * invocation's deadline (Context.deadline).
 */
export async function lookUpMany(
  ctx: Context<unknown>,
  provider: BackingProvider,
  records: readonly BackingRecord[],
): Promise<Map<string, Look>> {
  const seen = (r: BackingResource | undefined): Look | undefined => {
    if (r === undefined) return undefined;
    return isGone(r) ? { gone: true } : { gone: false, why: `is still ${r.state}` };
  };
  const idOf = (b: BackingRecord) => b.resourceId as string;
  const first = await describeSome(ctx, provider, records.map(idOf));
  const looks = new Map<string, Look>();
  const again: BackingRecord[] = [];
  const now = ctx.clock.now();
  for (const b of records) {
    const look = seen(first.get(idOf(b)));
    if (look) looks.set(b.id, look);
    else if (!provider.eventuallyConsistent) looks.set(b.id, { gone: true });
    else if (!notFoundIsFinal(b, now)) {
      const age = Math.round((now - (b.resourceRecordedAt ?? b.launchedAt)) / 1000);
      looks.set(b.id, { gone: false, unseen: true, why: `is not found yet (recorded ${age}s ago)` });
    } else again.push(b);
  }
  if (again.length === 0) return looks;
  const second = await describeSome(ctx, provider, again.map(idOf)); // one stale answer is not the last word
  for (const b of again) looks.set(b.id, seen(second.get(idOf(b))) ?? { gone: true });
  return looks;
}

/** The resources of one provider among `ids` that it finds (describeMany when it has it and there are several). */
async function describeSome(
  ctx: Context<unknown>,
  provider: BackingProvider,
  ids: readonly string[],
): Promise<Map<string, BackingResource>> {
  if (provider.describeMany && ids.length > 1) return provider.describeMany(ids, ctx.deadline);
  const found = new Map<string, BackingResource>();
  for (const id of ids) {
    const r = await provider.describe(id, ctx.deadline);
    if (r) found.set(id, r);
  }
  return found;
}
