import type { MetastaticLabel, MetastaticPool } from '../config/model.ts';
import {
  claimSlot,
  compareCandidates,
  freeSlot,
  isClaimable,
  markFailed,
  newBackingRecord,
  slotOf,
} from '../core/backing.ts';
import {
  CapacityError,
  ConflictError,
  LaunchAttemptError,
  LaunchFailedError,
  RetryableError,
} from '../core/errors.ts';
import { backingNodeId } from '../core/ids.ts';
import type { BackingRecord } from '../core/records.ts';
import { keys } from '../store/table.ts';
import { type Context, MAX_CONFLICT_RETRIES } from './context.ts';

/** Where a node went: its backing node as it was right after the claim. */
export interface Placement {
  readonly nodeId: string;
  readonly backing: BackingRecord;
  readonly slot: number;
}

/** How many candidates one Query brings back; the first claimable one almost always wins. */
const CANDIDATES_PER_QUERY = 10;

/**
 * Places one node of a pool's label: onto the fullest existing backing node with a free slot (a
 * launching one counts), else onto a new backing node launched for it. Claiming is one conditional
 * write on the backing node's item.
 */
export async function placeNode(
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
  beforeLaunch: () => Promise<void> = async () => {},
): Promise<Placement> {
  const candidates = (await ctx.store.findCandidates(pool.key, label.name, CANDIDATES_PER_QUERY)).sort(
    compareCandidates,
  );
  for (const candidate of candidates) {
    const placed = await claimOn(ctx, candidate, nodeId);
    if (placed) return placed;
  }
  // A launch is the one side effect a duplicate must never repeat: the caller checks first.
  await beforeLaunch();
  return launchFor(ctx, pool, label, nodeId);
}

/** Claims a slot on one backing node, re-reading it when a concurrent write got there first. */
async function claimOn(
  ctx: Context,
  candidate: BackingRecord,
  nodeId: string,
): Promise<Placement | undefined> {
  let b: BackingRecord | undefined = candidate;
  for (let i = 0; i < MAX_CONFLICT_RETRIES && b; i++) {
    const held = slotOf(b, nodeId);
    if (held !== undefined) return { nodeId, backing: b, slot: held }; // a redelivery's earlier claim
    if (!isClaimable(b, ctx.clock.now())) return undefined;
    const { next, slot } = claimSlot(b, nodeId, ctx.clock.now());
    try {
      await ctx.store.putBacking(next, { version: b.version, states: ['launching', 'ready'] });
      ctx.log.debug('slot claimed', { nodeId, backingNodeId: b.id, slot });
      return { nodeId, backing: next, slot };
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
      b = await ctx.store.getBacking(b.id);
    }
  }
  return undefined;
}

async function launchFor(
  ctx: Context,
  pool: MetastaticPool,
  label: MetastaticLabel,
  nodeId: string,
): Promise<Placement> {
  const backingPool = ctx.config.backingPoolByLabel.get(label.backingLabel);
  if (!backingPool) throw new RetryableError(`no backing pool provides label ${label.backingLabel}`);
  // Attempt n launches the backing node derived from (node, n): a redelivery finds the same record,
  // and a failed attempt is never reused. launch-retries is the total number of attempts.
  let lastReason = '';
  for (let attempt = 1; attempt <= pool.launchRetries; attempt++) {
    const id = backingNodeId(pool.key, label.name, nodeId, attempt);
    let record = await ctx.store.getBacking(id);
    if (!record) {
      if (backingPool.maxServers !== undefined) {
        const reserved = await ctx.store.reserve(
          keys.backingPool(backingPool.key),
          [id],
          backingPool.maxServers,
        );
        if (reserved === 'full') {
          throw new CapacityError(
            `backing pool ${backingPool.key} is at max-servers (${backingPool.maxServers}) for label ${label.backingLabel}`,
          );
        }
      }
      // Intent first: the record exists before the resource, so a crash never leaves an unknown machine.
      const fresh = newBackingRecord({
        id,
        poolKey: pool.key,
        label,
        backingPoolKey: backingPool.key,
        firstNodeId: nodeId,
        attempt,
        now: ctx.clock.now(),
      });
      // Another delivery of the same message may have created it since our read: then use theirs.
      record = (await ctx.store.createBacking(fresh)) ?? fresh;
    }
    if (record.state !== 'launching' && record.state !== 'ready') {
      lastReason = record.reason ?? `backing node ${id} is ${record.state}`;
      if (slotOf(record, nodeId) !== undefined) await giveBackSlot(ctx, id, nodeId);
      continue;
    }
    if (slotOf(record, nodeId) === undefined) {
      throw new RetryableError(`backing node ${id} exists without node ${nodeId}; retrying placement`);
    }
    if (!record.resourceId) {
      try {
        record = await launch(ctx, record);
      } catch (err) {
        if (!(err instanceof LaunchAttemptError)) throw err;
        lastReason = err.message;
        await giveBackSlot(ctx, id, nodeId);
        continue;
      }
    }
    return { nodeId, backing: record, slot: slotOf(record, nodeId) ?? 0 };
  }
  throw new LaunchFailedError(
    `backing node for ${nodeId} failed to launch ${pool.launchRetries} time(s); last: ${lastReason}`,
  );
}

/** Asks the provider for the resource (idempotent per backing id and attempt) and records its id. */
async function launch(ctx: Context, b: BackingRecord): Promise<BackingRecord> {
  let resourceId: string;
  try {
    const provider = ctx.providers.forPool(b.backingPoolKey);
    ({ resourceId } = await provider.launch({
      backingNodeId: b.id,
      attempt: b.attempt,
      poolKey: b.backingPoolKey,
      label: b.backingLabel,
    }));
  } catch (err) {
    const reason = `launch of ${b.backingLabel} failed: ${(err as Error).message}`;
    ctx.log.error('backing launch failed', { backingNodeId: b.id, reason });
    await failBacking(ctx, b.id, reason);
    throw new LaunchAttemptError(reason, { cause: err });
  }
  ctx.log.info('backing node launching', { backingNodeId: b.id, resourceId, label: b.backingLabel });
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const current = await ctx.store.getBacking(b.id);
    if (!current) throw new ConflictError(`backing node ${b.id} disappeared during launch`);
    if (current.resourceId) return current;
    const next = { ...current, resourceId, version: current.version + 1 };
    try {
      await ctx.store.putBacking(next, { version: current.version });
      return next;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(`gave up recording resource ${resourceId} on backing node ${b.id}`);
}

async function failBacking(ctx: Context, id: string, reason: string): Promise<void> {
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const b = await ctx.store.getBacking(id);
    if (!b || (b.state !== 'launching' && b.state !== 'ready')) return;
    try {
      await ctx.store.putBacking(markFailed(b, ctx.clock.now(), reason), { version: b.version });
      return;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
}

/**
 * Gives a slot back: the one conditional write of a release, also used to undo the placements of a
 * node set that could not be completed. Stamps last-used, from which grace-time counts.
 */
export async function giveBackSlot(ctx: Context, backingId: string, nodeId: string): Promise<boolean> {
  for (let i = 0; i < MAX_CONFLICT_RETRIES; i++) {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return false;
    const slot = slotOf(b, nodeId);
    if (slot === undefined) return false; // already given back
    try {
      await ctx.store.putBacking(freeSlot(b, slot, ctx.clock.now()), { version: b.version });
      ctx.log.debug('slot freed', { nodeId, backingNodeId: backingId, slot });
      return true;
    } catch (err) {
      if (!(err instanceof ConflictError)) throw err;
    }
  }
  throw new ConflictError(`gave up freeing the slot of ${nodeId} on ${backingId}`);
}
