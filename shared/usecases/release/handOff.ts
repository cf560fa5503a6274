import { MetastaticError } from '../../core/errors.ts';
import type { ServeContext } from '../context.ts';
import { canRunShort, requestNodes } from '../place/requestNodes.ts';
import { firstWaitingFor, requestMessageOf } from '../place/waiting.ts';

/**
 * Room freed in a pool where requests can wait (a node released): the first waiting request, by
 * priority, that asks for that label is placed now, as another delivery of its message would place it,
 * rather than at its next receive (one visibility timeout later: 180 s on AWS). Concurrency-safe as any
 * duplicate delivery is (the request's own receive may run at the same moment: one of them places it,
 * the other gives back what it took). Best effort: if it cannot be placed now, its own receives go on
 * as before, and the release succeeds whatever happens here. Returns the id of the request it placed.
 */
export async function handOffFreedRoom(
  ctx: ServeContext,
  poolKey: string,
  label: string,
): Promise<string | undefined> {
  const pool = ctx.config.metastaticPools.find((p) => p.key === poolKey);
  if (!pool?.labels.has(label) || !canRunShort(ctx, pool)) return undefined;
  const next = await firstWaitingFor(ctx, label, pool);
  if (!next) return undefined;
  try {
    const outcome = await requestNodes(ctx, requestMessageOf(next));
    if (outcome.kind !== 'placed') return undefined;
    ctx.log.info('freed room handed to the first waiting request', { requestId: next.id, pool: poolKey });
    return next.id;
  } catch (err) {
    // Never the release's failure: the request's own receives go on as before. A domain error (no room
    // after all, another delivery busy with it, a lost race) is expected; anything else is logged louder.
    const expected = err instanceof MetastaticError;
    ctx.log[expected ? 'info' : 'warn'](
      'freed room not handed over now; the waiting request is tried at its next receive',
      {
        requestId: next.id,
        reason: err instanceof Error ? err.message : String(err),
      },
    );
    return undefined;
  }
}
