import type { BackingContract } from './contract.ts';
import type { MetastaticLabel } from './model.ts';
import type { BackingRecord, Claim } from './records.ts';
import { allocatableBackingStates, assertTransition } from './states.ts';
import { boundedReason } from './text.ts';

/**
 * Pure operations on a backing node record. Each returns the next record (version + 1); the store
 * writes it with the condition that the stored version is still the one read, so any change in
 * between (another claim, a release, a retirement) makes the write fail instead of being lost.
 */

/** Whether a node may be placed on this backing node now. */
export function isClaimable(b: BackingRecord, now: number): boolean {
  return (
    allocatableBackingStates.includes(b.state) &&
    !b.drained &&
    b.used < b.slots &&
    (b.noNewNodesAfter === undefined || now < b.noNewNodesAfter)
  );
}

/** The lowest free slot index (Nodepool's choice), or undefined when full. */
export function lowestFreeSlot(b: Pick<BackingRecord, 'slots' | 'slotMap'>): number | undefined {
  for (let i = 0; i < b.slots; i++) if (b.slotMap[String(i)] === undefined) return i;
  return undefined;
}

/**
 * A free slot chosen by a hash of `key` (a node id): concurrent claimants of one backing node spread
 * over its free slots instead of all aiming at the lowest. Undefined when full.
 */
export function spreadSlot(b: Pick<BackingRecord, 'slots' | 'slotMap'>, key: string): number | undefined {
  const free: number[] = [];
  for (let i = 0; i < b.slots; i++) if (b.slotMap[String(i)] === undefined) free.push(i);
  if (free.length === 0) return undefined;
  return free[hashOf(key) % free.length];
}

/** A 32-bit FNV-1a hash: cheap and well spread, to scatter claimants deterministically. */
export function hashOf(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/** The slot a node holds on this backing node, if any (a redelivery finds its earlier claim). */
export function slotOf(b: Pick<BackingRecord, 'slotMap'>, nodeId: string): number | undefined {
  for (const [slot, holder] of Object.entries(b.slotMap)) if (holder === nodeId) return Number(slot);
  return undefined;
}

/**
 * The record with a node's claim on the lowest free slot, built in memory: how tests and the bench's model
 * make a claim. Production claims a slot with one conditional write instead (`DynamoStore.claimSlot`).
 */
export function withClaimedSlot(
  b: BackingRecord,
  nodeId: string,
  now: number,
  owner: string,
): { next: BackingRecord; slot: number } {
  const slot = lowestFreeSlot(b);
  if (!isClaimable(b, now) || slot === undefined)
    throw new Error(`backing node ${b.id} has no claimable slot`);
  return {
    slot,
    next: {
      ...b,
      slotMap: { ...b.slotMap, [String(slot)]: nodeId },
      claims: { ...b.claims, [String(slot)]: { at: now, by: owner } },
      used: b.used + 1,
      version: b.version + 1,
    },
  };
}

/** The claim on a slot, if it is not confirmed yet. */
export function claimOf(b: Pick<BackingRecord, 'claims'>, slot: number): Claim | undefined {
  return b.claims?.[String(slot)];
}

/** Hands an abandoned claim (its delivery is known dead) over to another delivery. */
export function takeOverClaim(b: BackingRecord, slot: number, owner: string, now: number): BackingRecord {
  if (b.slotMap[String(slot)] === undefined) throw new Error(`slot ${slot} of ${b.id} is not claimed`);
  return { ...b, claims: { ...b.claims, [String(slot)]: { at: now, by: owner } }, version: b.version + 1 };
}

/** Confirms claims whose nodes are recorded: they no longer need the lease check. */
export function confirmClaims(b: BackingRecord, slots: readonly number[]): BackingRecord {
  const claims = { ...b.claims };
  for (const s of slots) delete claims[String(s)];
  return { ...b, claims, version: b.version + 1 };
}

/** Stops a backing node taking new nodes; it goes as soon as it is empty. */
export function markDrained(b: BackingRecord, reason: string): BackingRecord {
  return { ...b, drained: true, reason: boundedReason(reason), version: b.version + 1 };
}

/** Frees a slot and stamps last-used (grace-time counts from here). */
export function freeSlot(b: BackingRecord, slot: number, now: number): BackingRecord {
  const slotMap = { ...b.slotMap };
  delete slotMap[String(slot)];
  const claims = { ...b.claims };
  delete claims[String(slot)];
  const ends = { ...b.ends };
  delete ends[String(slot)];
  return { ...b, slotMap, claims, ends, used: b.used - 1, lastUsedAt: now, version: b.version + 1 };
}

export function newBackingRecord(args: {
  id: string;
  poolKey: string;
  /** What of its label a backing node records. */
  label: Pick<MetastaticLabel, 'name' | 'backingLabel' | 'maxParallelJobs' | 'maxAge'> &
    Partial<MetastaticLabel>;
  backingPoolKey: string;
  firstNodeId: string;
  /** The delivery launching it, which holds the claim on slot 0. */
  owner: string;
  attempt: number;
  now: number;
  /** When the first node is expected to be released (its request's expected duration). */
  firstEnd?: number;
  /** What its nodes will carry (its backing label's, core/contract.ts), fixed at launch. */
  contract?: BackingContract;
}): BackingRecord {
  return {
    id: args.id,
    poolKey: args.poolKey,
    label: args.label.name,
    backingPoolKey: args.backingPoolKey,
    backingLabel: args.label.backingLabel,
    state: 'launching',
    slots: args.label.maxParallelJobs,
    used: 1,
    slotMap: { '0': args.firstNodeId },
    claims: { '0': { at: args.now, by: args.owner } },
    ends: args.firstEnd === undefined ? {} : { '0': args.firstEnd },
    version: 0,
    attempt: args.attempt,
    launchedAt: args.now,
    lastUsedAt: args.now,
    noNewNodesAfter: args.label.maxAge === undefined ? undefined : args.now + args.label.maxAge * 1000,
    ...(args.contract === undefined ? {} : { contract: args.contract }),
  };
}

export function markReady(
  b: BackingRecord,
  details: { host?: string; port?: number; attributes: Record<string, unknown> },
  now: number,
): BackingRecord {
  assertTransition('backing', b.state, 'ready');
  return {
    ...b,
    state: 'ready',
    host: details.host,
    port: details.port,
    attributes: { ...details.attributes },
    readyAt: now,
    // An empty backing node's grace-time starts when it could first have been used.
    lastUsedAt: b.used === 0 ? now : b.lastUsedAt,
    version: b.version + 1,
  };
}

export function markRetiring(b: BackingRecord, now: number, reason: string): BackingRecord {
  assertTransition('backing', b.state, 'retiring');
  if (b.used !== 0) throw new Error(`backing node ${b.id} holds ${b.used} node(s) and cannot retire`);
  return { ...b, state: 'retiring', retiredAt: now, reason: boundedReason(reason), version: b.version + 1 };
}

export function markFailed(b: BackingRecord, now: number, reason: string): BackingRecord {
  assertTransition('backing', b.state, 'failed');
  return { ...b, state: 'failed', retiredAt: now, reason: boundedReason(reason), version: b.version + 1 };
}

export function markStopped(b: BackingRecord, now: number): BackingRecord {
  assertTransition('backing', b.state, 'stopped');
  return {
    ...b,
    state: 'stopped',
    stoppedAt: now,
    slotMap: {},
    claims: {},
    ends: {},
    used: 0,
    version: b.version + 1,
  };
}

/** Nodepool's order: the oldest backing node with a free slot first. */
export function compareOldestFirst(a: BackingRecord, b: BackingRecord): number {
  return a.launchedAt - b.launchedAt || (a.id < b.id ? -1 : 1);
}

/**
 * When a backing node's nodes are expected to be released, as far as it knows: the latest expected end
 * of its nodes, or now if they are all overdue; `now` for an empty one (it would go); undefined when a
 * node on it has no estimate.
 */
export function expectedEndOf(b: BackingRecord, now: number): number | undefined {
  if (b.used === 0) return now;
  const ends = Object.values(b.ends ?? {});
  if (ends.length < b.used) return undefined;
  // A node still running past its expected end is expected to end any moment, not in the past.
  return Math.max(now, ...ends);
}

/**
 * Duration-aware candidate order for a node expected to be released at `end`. What a placement costs is
 * how much longer it keeps a backing node billed: `end` minus the backing node's own expected end, when
 * positive (an empty one's is now: the whole duration). So the backing nodes it does not keep longer
 * come first, closest expected end first (a tight fit leaves the later ones to longer jobs), then those
 * it keeps longer, least first; those with no estimate after; each tie in the usual order
 * (compareCandidates). Jobs that end together share backing nodes, which empty together.
 */
export function compareByExpectedEnd(
  end: number,
  now: number,
): (a: BackingRecord, b: BackingRecord) => number {
  const key = (x: BackingRecord): [number, number] => {
    const e = expectedEndOf(x, now);
    if (e === undefined) return [Number.POSITIVE_INFINITY, 0];
    return [Math.max(0, end - e), Math.max(0, e - end)];
  };
  return (a, b) => {
    const [ka, sa] = key(a);
    const [kb, sb] = key(b);
    if (ka !== kb) return ka < kb ? -1 : 1;
    if (sa !== sb) return sa < sb ? -1 : 1;
    return compareCandidates(a, b);
  };
}

/** Candidate order: fullest first (tighter packing lets the others empty and go), ties to the oldest. */
export function compareCandidates(a: BackingRecord, b: BackingRecord): number {
  return b.used / b.slots - a.used / a.slots || a.launchedAt - b.launchedAt || (a.id < b.id ? -1 : 1);
}
