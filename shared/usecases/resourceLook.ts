import { notFoundIsFinal } from '../core/lifecycle.ts';
import type { BackingProvider, BackingResource } from '../core/provider.ts';
import type { BackingRecord } from '../core/records.ts';
import type { Context } from './context.ts';

/**
 * What a backing node's resource is, as its provider can tell now: asked by the reaper (reconciliation,
 * retirement) and by the fulfil function before it acts on an event that says the resource is gone.
 */

export function providerFor(ctx: Context, b: BackingRecord): BackingProvider {
  return ctx.providers.forPool(b.backingPoolKey);
}

/** Gone, or no longer usable: a stopped (not terminated) machine serves nobody either. */
export function isGone(r: BackingResource | undefined): boolean {
  return r === undefined || (r.state !== 'pending' && r.state !== 'running');
}

/** What a look at a backing node's resource found: gone, or why not (`unseen`: not found yet). */
type Look = { readonly gone: true } | { readonly gone: false; readonly why: string; readonly unseen?: true };

/**
 * Whether a backing node's resource is gone, as far as its provider can tell now. Described in a state
 * other than pending or running: gone. Not found: gone for a provider whose "not found" is final; for an
 * eventually consistent one (EC2) only once the id has been recorded for RESOURCE_NOT_FOUND_GRACE_MS and
 * a second describe does not find it either. Before that it is `unseen`: a new instance EC2 does not show
 * yet, which must not be failed (nor its terminate taken as done).
 */
export async function lookUp(ctx: Context, provider: BackingProvider, b: BackingRecord): Promise<Look> {
  const id = b.resourceId as string;
  const seen = (r: BackingResource | undefined): Look | undefined => {
    if (r === undefined) return undefined;
    return isGone(r) ? { gone: true } : { gone: false, why: `is still ${r.state}` };
  };
  const first = seen(await provider.describe(id));
  if (first) return first;
  if (!provider.eventuallyConsistent) return { gone: true };
  const now = ctx.clock.now();
  if (!notFoundIsFinal(b, now)) {
    const age = Math.round((now - (b.resourceRecordedAt ?? b.launchedAt)) / 1000);
    return { gone: false, unseen: true, why: `is not found yet (recorded ${age}s ago)` };
  }
  return seen(await provider.describe(id)) ?? { gone: true }; // one stale answer is not the last word
}
