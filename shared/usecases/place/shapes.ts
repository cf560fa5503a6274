import { type RequestMessage, shapeOf } from '../../core/messages.ts';
import type { BackingPort, RequestPort } from '../../core/poolStore.ts';
import { requestBodyHash } from '../../core/request.ts';
import { type LabelOffer, type PoolOffer, shapeOffers } from '../../core/shapes.ts';
import type { Context } from '../context.ts';

export type LabelChoice =
  | { readonly ok: true; readonly labels: readonly string[] }
  | { readonly ok: false; readonly reason: string };

/**
 * The labels a request is served with: its own, or for a request by shape the label chosen for each
 * shape (core/shapes.ts): in the pool whose node set costs least, for each shape the cheapest label
 * whose slot fits, unless a label costing at most `shape-cost-margin` percent more has a free slot now
 * (no launch, no wait), when the first such label (cheapest first) is taken.
 *
 * The choice depends on the table at the time, so it is made once per request: a later delivery of the
 * message takes the labels its stored record holds (one read, requests by shape only). Two first
 * deliveries choosing apart at the same time are settled by the request's conditional first write
 * (shared/usecases/place/recording.ts): the one that loses finds labels other than its own and retries.
 */
export async function labelsFor(
  ctx: Context<RequestPort & BackingPort>,
  m: RequestMessage,
): Promise<LabelChoice> {
  if (m.labels) return { ok: true, labels: m.labels };
  const shapes = (m.shapes ?? []).map(shapeOf);
  const stored = await ctx.store.getRequest(m.id);
  if (stored && stored.bodyHash === requestBodyHash(m) && stored.labels.length === shapes.length) {
    return { ok: true, labels: stored.labels };
  }
  const offers = shapeOffers(ctx.config, shapes);
  if (!offers.ok) return offers;
  const best = offers.pools[0] as PoolOffer; // ok: at least one pool
  const labels: string[] = [];
  for (const ranked of best.perShape)
    labels.push((await choose(ctx, ranked, ctx.config.shapeCostMargin)).label.name);
  return { ok: true, labels };
}

/**
 * The cheapest offer, or the first one within the margin that has a free slot now. Offers without a
 * known cost are all within the margin of each other (nothing says one costs more), but never of a
 * priced one.
 */
async function choose(
  ctx: Context<RequestPort & BackingPort>,
  ranked: readonly LabelOffer[],
  marginPercent: number,
): Promise<LabelOffer> {
  const cheapest = ranked[0] as LabelOffer;
  const limit =
    cheapest.slotHourlyCost === undefined ? undefined : cheapest.slotHourlyCost * (1 + marginPercent / 100);
  const within = ranked.filter((offer) =>
    limit === undefined
      ? offer.slotHourlyCost === undefined
      : offer.slotHourlyCost !== undefined && offer.slotHourlyCost <= limit + 1e-12,
  );
  if (within.length < 2) return cheapest; // nothing to choose: no read
  for (const offer of within) {
    const free = await ctx.store.findCandidates(offer.pool.key, offer.label.name, 1);
    if (free.items.length > 0) return offer;
  }
  return cheapest;
}
