import type { BackingRecord, NodeRecord, RequestRecord } from '../shared/core/records.ts';
import type { FakeInstance } from './fakeEc2.ts';

/**
 * The invariants the chaos suite checks on a snapshot of the table and of the fake EC2, taken between
 * ticks (no handler running). Pure: returns the violations, each naming the ids involved.
 *
 * Safety (always):
 * - slots: every live (pending/ready) node holds the slot its record names: the backing record exists,
 *   is launching, ready or failed (failed: not settled yet) and its slot map maps that slot back to the
 *   node; so no slot is held by two live nodes. A ready node never sits on a launching backing node.
 * - no backing node is retiring or stopped while holding a slot; `used` equals the slot map's size;
 *   a stopped backing node's instance is not pending or running.
 * - caps: live nodes <= the metastatic pool's max-servers and all in its capacity set (the set never
 *   exceeds the cap; its counter never does either, and counts every live node); backing records holding capacity (holdsCapacity) <= the backing pool's
 *   max-servers and all in its capacity set; pending/running instances <= the backing pool's max-servers.
 * - requests: a failed request has a reason and no live node; a requested one has no placed node.
 * - min-ready: per label, the pool's own ready nodes not taken (live, or still waiting to be placed) never
 *   exceed min-ready (no overshoot, however many refills race).
 * Liveness (bounded by time, tracked across snapshots in `Tracker`):
 * - a slot map entry of a live backing node that no live node confirms (a crashed placement's claim,
 *   a release that crashed between its two writes, a node id in two slot maps) is given back within
 *   `staleEntryMs`;
 * - a live node on a failed backing node is moved or failed within `unsettledMs`;
 * - a pending/running instance with no live record is terminated within `orphanMs`;
 * - a live node on a min-ready node's slot has that node live and taken by it, and a taken min-ready node
 *   has a live taker that records it, except for `unsettledMs` (a release, failure or take cut short).
 * Final (after everything is released and the reaper ran until quiescent): every expected request is
 * fulfilled or failed with a reason, no node is live, every backing record is stopped, both capacity
 * sets are empty, no instance is pending or running.
 */
export interface Snapshot {
  readonly now: number;
  readonly requests: readonly RequestRecord[];
  readonly backing: readonly BackingRecord[];
  /** The metastatic pool's capacity set (live node ids). */
  readonly poolNodes: ReadonlySet<string>;
  /** The backing pool's capacity set (backing ids not stopped). */
  readonly backingPool: ReadonlySet<string>;
  /** The places each set counts against its cap (its counter's `used`). */
  readonly poolUsed: number;
  readonly backingUsed: number;
  readonly instances: readonly FakeInstance[];
}

export interface Limits {
  /** The metastatic pool's max-servers; undefined: none (no capacity set to check). */
  readonly nodesMax: number | undefined;
  /** min-ready per label (the largest configured during the run): live untaken ready nodes never exceed it. */
  readonly minReady?: ReadonlyMap<string, number>;
  readonly backingMax: number;
  readonly staleEntryMs: number;
  readonly unsettledMs: number;
  readonly orphanMs: number;
  /**
   * How long past its lease's expiry a request may still hold a node or wait (issue 23): one reaper
   * period, another for a reaper run that crashed, and a little for the run itself. Undefined: leases
   * are not checked.
   */
  readonly leaseOverrunMs?: number;
}

/** What liveness checks remember between snapshots: when each suspicious thing was first seen. */
export class Tracker {
  readonly firstSeen = new Map<string, number>();
  /** Slot map entries seen that no live node confirmed (distinct), for the figures. */
  readonly staleEntries = new Set<string>();
  /** Node ids seen in two live slot maps at once. */
  readonly doubleEntries = new Set<string>();

  age(key: string, now: number, since?: number): number {
    let first = this.firstSeen.get(key);
    if (first === undefined) {
      first = since ?? now;
      this.firstSeen.set(key, first);
    }
    return now - first;
  }

  /** Forgets what is no longer seen (so a later reappearance starts a new clock). */
  keepOnly(seen: ReadonlySet<string>): void {
    for (const key of this.firstSeen.keys()) if (!seen.has(key)) this.firstSeen.delete(key);
  }
}

const isLive = (n: NodeRecord) => n.state === 'pending' || n.state === 'ready';

/**
 * Whether a backing record counts against its pool's max-servers: launching or ready, or retiring /
 * failed while its instance still runs. One that is retiring or failed with its instance gone (or
 * never launched) may already have given its place back: the reaper does that just before it records
 * the backing node stopped, so that a crash in between cannot leak the place.
 */
export function holdsCapacity(
  b: BackingRecord,
  instance: (id: string) => Pick<FakeInstance, 'state'> | undefined,
): boolean {
  if (b.state === 'launching' || b.state === 'ready') return true;
  if (b.state === 'stopped' || b.resourceId === undefined) return false;
  const state = instance(b.resourceId)?.state;
  return state === 'pending' || state === 'running';
}
const secs = (ms: number) => `${(ms / 1000).toFixed(1)}s`;

export const TAG_BACKING_NODE_ID = 'metastatic:backing-node-id';

export function checkInvariants(s: Snapshot, limits: Limits, tracker: Tracker): string[] {
  const v: string[] = [];
  const seen = new Set<string>();
  const backingById = new Map(s.backing.map((b) => [b.id, b]));

  // ---- client leases ----------------------------------------------------------------------------------
  if (limits.leaseOverrunMs !== undefined) {
    for (const r of s.requests) {
      if (r.leaseExpiresAt === undefined || s.now <= r.leaseExpiresAt + limits.leaseOverrunMs) continue;
      const over = ((s.now - r.leaseExpiresAt) / 1000).toFixed(1);
      if (r.state === 'requested') v.push(`request ${r.id}: still waiting ${over}s after its lease lapsed`);
      for (const n of r.nodes) {
        if ((n.state === 'pending' || n.state === 'ready') && !n.held) {
          v.push(`request ${r.id}: node ${n.id} still ${n.state} ${over}s after its lease lapsed`);
        }
      }
    }
  }

  // ---- backing records ----------------------------------------------------------------------------
  for (const b of s.backing) {
    const entries = Object.entries(b.slotMap);
    if (b.used !== entries.length) {
      v.push(`backing ${b.id} (${b.state}): used=${b.used} but its slot map holds ${entries.length}`);
    }
    for (const [slot] of entries) {
      if (!(Number(slot) >= 0 && Number(slot) < b.slots))
        v.push(`backing ${b.id}: slot ${slot} out of range`);
    }
    if ((b.state === 'stopped' || b.state === 'retiring') && (b.used !== 0 || entries.length > 0)) {
      v.push(`backing ${b.id} is ${b.state} while holding nodes: ${JSON.stringify(b.slotMap)}`);
    }
    if (b.state === 'stopped' && b.resourceId) {
      const i = s.instances.find((x) => x.instanceId === b.resourceId);
      if (i && (i.state === 'pending' || i.state === 'running')) {
        v.push(`backing ${b.id} is stopped but its instance ${i.instanceId} is ${i.state}`);
      }
    }
  }

  // ---- live nodes hold their slots ----------------------------------------------------------------
  const liveAt = new Map<string, string>(); // `${backingId}#${slot}` -> node id recorded there
  const liveNodes: NodeRecord[] = [];
  for (const r of s.requests) {
    if (r.state === 'failed' && !r.reason) v.push(`request ${r.id} failed without a reason`);
    for (const n of r.nodes) {
      if (n.state === 'failed' && !n.reason) v.push(`node ${n.id} failed without a reason`);
      if (!isLive(n)) continue;
      if (r.state === 'failed' || r.state === 'requested') {
        v.push(`request ${r.id} is ${r.state} but its node ${n.id} is ${n.state}`);
      }
      if (n.spare !== undefined) {
        // On a min-ready node's slot: that node holds the slot and the place, and must be its.
        const spare = findNode(s.requests, n.spare);
        const same = spare?.backingNodeId === n.backingNodeId && spare?.slot === n.slot;
        if (!spare || !isLive(spare) || spare.takenBy?.node !== n.id || !same) {
          const key = `taker ${n.id}`;
          seen.add(key);
          const age = tracker.age(key, s.now);
          if (age > limits.unsettledMs || (spare && isLive(spare) && !same)) {
            v.push(
              `node ${n.id} (${n.state}) runs on min-ready node ${n.spare}, which is ` +
                `${spare ? `${spare.state}, taken by ${spare.takenBy?.node ?? 'nobody'}, on ${spare.backingNodeId}#${spare.slot}` : 'not recorded'} (${secs(age)})`,
            );
          }
        }
        continue;
      }
      if (n.takenBy !== undefined) {
        const taker = findNode(s.requests, n.takenBy.node);
        if (!taker || !isLive(taker) || taker.spare !== n.id) {
          const key = `taken ${n.id}`;
          seen.add(key);
          const age = tracker.age(key, s.now);
          if (age > limits.unsettledMs) {
            v.push(
              `min-ready node ${n.id} has been taken by ${n.takenBy.node} for ${secs(age)}, which is ` +
                `${taker ? `${taker.state}${taker.spare === n.id ? '' : ' and does not record it'}` : 'not recorded'}`,
            );
          }
        }
      }
      liveNodes.push(n);
      if (n.backingNodeId === undefined || n.slot === undefined) {
        v.push(`node ${n.id} is ${n.state} without a backing node/slot`);
        continue;
      }
      const where = `${n.backingNodeId}#${n.slot}`;
      const other = liveAt.get(where);
      if (other !== undefined) v.push(`slot ${where} is held by two live nodes: ${other} and ${n.id}`);
      liveAt.set(where, n.id);
      const b = backingById.get(n.backingNodeId);
      if (!b) {
        v.push(`node ${n.id} (${n.state}) is on backing ${n.backingNodeId}, which has no record`);
        continue;
      }
      const holder = b.slotMap[String(n.slot)];
      if (holder !== n.id) {
        v.push(
          `node ${n.id} (${n.state}) says it holds slot ${n.slot} of backing ${b.id} (${b.state}), ` +
            `but that slot is ${holder === undefined ? 'free' : `held by ${holder}`}`,
        );
      }
      if (b.state === 'retiring' || b.state === 'stopped') {
        v.push(`node ${n.id} (${n.state}) is on backing ${b.id}, which is ${b.state}`);
      }
      if (b.state === 'launching' && n.state === 'ready') {
        v.push(`node ${n.id} is ready on backing ${b.id}, which is still launching`);
      }
      if (b.state === 'failed') {
        const key = `unsettled ${n.id}@${b.id}`;
        seen.add(key);
        const age = tracker.age(key, s.now);
        if (age > limits.unsettledMs) {
          v.push(
            `node ${n.id} (${n.state}) is still on failed backing ${b.id} after ${secs(age)} (${b.reason})`,
          );
        }
      }
    }
  }

  // ---- min-ready: no overshoot ------------------------------------------------------------------------
  for (const [label, most] of limits.minReady ?? []) {
    const untaken = s.requests.filter((r) => {
      if (!r.id.startsWith('min-ready:') || r.labels[0] !== label) return false;
      const n = r.nodes[0];
      return r.state === 'requested' || (n !== undefined && isLive(n) && n.takenBy === undefined);
    });
    if (untaken.length > most) {
      v.push(
        `${untaken.length} untaken min-ready nodes of ${label} exceed its min-ready ${most}: ${untaken.map((r) => r.id).join(', ')}`,
      );
    }
  }

  // ---- slot map entries no live node confirms ------------------------------------------------------
  const entriesOf = new Map<string, string[]>();
  for (const b of s.backing) {
    if (b.state !== 'launching' && b.state !== 'ready' && b.state !== 'failed') continue;
    for (const [slot, holder] of Object.entries(b.slotMap)) {
      const where = `${b.id}#${slot}`;
      if (b.state !== 'failed') entriesOf.set(holder, [...(entriesOf.get(holder) ?? []), where]);
      if (liveAt.get(where) === holder) continue;
      const key = `stale ${where}=${holder}`;
      seen.add(key);
      tracker.staleEntries.add(key);
      const age = tracker.age(key, s.now, b.claims?.[slot]?.at);
      if (age > limits.staleEntryMs) {
        const n = findNode(s.requests, holder);
        v.push(
          `slot ${where} (${b.state}) has been held for ${secs(age)} by ${holder}, which is ` +
            `${n ? `${n.state}${n.backingNodeId ? ` on ${n.backingNodeId}#${n.slot}` : ''}` : 'not a recorded node'}`,
        );
      }
    }
  }
  for (const [holder, where] of entriesOf) if (where.length > 1) tracker.doubleEntries.add(holder);

  // ---- caps --------------------------------------------------------------------------------------
  if (limits.nodesMax !== undefined) {
    if (liveNodes.length > limits.nodesMax) {
      v.push(`${liveNodes.length} live nodes exceed the metastatic max-servers ${limits.nodesMax}`);
    }
    if (s.poolNodes.size > limits.nodesMax) {
      v.push(`the metastatic capacity set holds ${s.poolNodes.size} places > max-servers ${limits.nodesMax}`);
    }
    if (s.poolUsed > limits.nodesMax) {
      v.push(`the metastatic capacity set counts ${s.poolUsed} > max-servers ${limits.nodesMax}`);
    }
    if (s.poolUsed < liveNodes.length) {
      v.push(`the metastatic capacity set counts ${s.poolUsed} places for ${liveNodes.length} live nodes`);
    }
    const unreserved = liveNodes.filter((n) => !s.poolNodes.has(n.id)).map((n) => n.id);
    if (unreserved.length > 0) v.push(`live nodes missing from the capacity set: ${unreserved.join(', ')}`);
  }
  const byInstance = new Map(s.instances.map((i) => [i.instanceId, i]));
  const holding = s.backing.filter((b) => holdsCapacity(b, (id) => byInstance.get(id)));
  if (holding.length > limits.backingMax) {
    v.push(
      `${holding.length} backing records holding capacity exceed the backing max-servers ${limits.backingMax}: ` +
        holding.map((b) => `${b.id} (${b.state})`).join(', '),
    );
  }
  if (s.backingPool.size > limits.backingMax) {
    v.push(`the backing capacity set holds ${s.backingPool.size} places > max-servers ${limits.backingMax}`);
  }
  // Exactness: `used` is the number of places, always (each change of it is one transaction with its
  // places, capacitySets.ts); the checks run between ticks, with no transaction in flight.
  for (const [name, places, used] of [
    ['metastatic', s.poolNodes.size, s.poolUsed],
    ['backing', s.backingPool.size, s.backingUsed],
  ] as const) {
    if (places !== used) v.push(`the ${name} capacity set has ${places} places but counts ${used}`);
  }
  if (s.backingUsed > limits.backingMax) {
    v.push(`the backing capacity set counts ${s.backingUsed} > max-servers ${limits.backingMax}`);
  }
  const outside = holding.filter((b) => !s.backingPool.has(b.id)).map((b) => `${b.id} (${b.state})`);
  if (outside.length > 0)
    v.push(`backing records missing from the backing capacity set: ${outside.join(', ')}`);
  const running = s.instances.filter((i) => i.state === 'pending' || i.state === 'running');
  if (running.length > limits.backingMax) {
    v.push(
      `${running.length} pending/running instances exceed the backing max-servers ${limits.backingMax}: ` +
        running.map((i) => `${i.instanceId}=${i.tags[TAG_BACKING_NODE_ID]}`).join(', '),
    );
  }

  // ---- instances without a live record (leaked machines) -------------------------------------------
  for (const i of running) {
    const b = backingById.get(i.tags[TAG_BACKING_NODE_ID] ?? '');
    const owned = b && b.state !== 'stopped' && (b.resourceId === i.instanceId || b.resourceId === undefined);
    if (owned) continue;
    const key = `orphan ${i.instanceId}`;
    seen.add(key);
    const age = tracker.age(key, s.now, i.launchTime);
    if (age > limits.orphanMs) {
      v.push(
        `instance ${i.instanceId} (${i.state}, backing ${i.tags[TAG_BACKING_NODE_ID]}: ` +
          `${b ? `${b.state}, resource ${b.resourceId}` : 'no record'}) has had no live record for ${secs(age)}`,
      );
    }
  }
  tracker.keepOnly(seen);
  return v;
}

/** The end state after everything was released and the reaper ran until quiescent. */
export function checkFinal(s: Snapshot, expectedRequestIds: readonly string[]): string[] {
  const v: string[] = [];
  const byId = new Map(s.requests.map((r) => [r.id, r]));
  for (const id of expectedRequestIds) {
    const r = byId.get(id);
    if (!r) {
      v.push(`request ${id} was never recorded`);
      continue;
    }
    if (r.state !== 'fulfilled' && r.state !== 'failed') v.push(`request ${id} ended ${r.state}`);
    if (r.state === 'failed' && !r.reason) v.push(`request ${id} failed without a reason`);
    for (const n of r.nodes) {
      if (n.state !== 'released' && n.state !== 'failed') v.push(`node ${n.id} is still ${n.state}`);
      if (n.state === 'failed' && !n.reason) v.push(`node ${n.id} failed without a reason`);
    }
  }
  for (const b of s.backing) {
    if (b.state !== 'stopped') {
      v.push(`backing ${b.id} is ${b.state} (used ${b.used}, ${JSON.stringify(b.slotMap)}), not stopped`);
    }
    if (b.used !== 0) v.push(`backing ${b.id} still has ${b.used} used slot(s)`);
  }
  if (s.poolNodes.size > 0) {
    const what = [...s.poolNodes].map((id) => `${id} (${findNode(s.requests, id)?.state ?? 'no such node'})`);
    v.push(`metastatic capacity set not empty: ${what.join(', ')}`);
  }
  if (s.poolUsed !== 0 || s.backingUsed !== 0) {
    v.push(`capacity counters not back to 0: pool ${s.poolUsed}, backing pool ${s.backingUsed}`);
  }
  if (s.backingPool.size > 0) {
    const byId = new Map(s.backing.map((b) => [b.id, b]));
    const what = [...s.backingPool].map((id) => `${id} (${byId.get(id)?.state ?? 'no record'})`);
    v.push(`backing capacity set not empty: ${what.join(', ')}`);
  }
  for (const i of s.instances) {
    if (i.state === 'pending' || i.state === 'running') {
      v.push(`instance ${i.instanceId} (backing ${i.tags[TAG_BACKING_NODE_ID]}) is still ${i.state}`);
    }
  }
  return v;
}

function findNode(requests: readonly RequestRecord[], nodeId: string): NodeRecord | undefined {
  const cut = nodeId.lastIndexOf('/');
  const r = requests.find((x) => x.id === nodeId.slice(0, cut));
  return r?.nodes[Number(nodeId.slice(cut + 1))];
}
