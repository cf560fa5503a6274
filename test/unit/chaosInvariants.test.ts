import { describe, expect, it } from 'vitest';
import { spareMessage, spareNodeId } from '../../shared/core/minReady.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../../shared/core/records.ts';
import { requestedRecord } from '../../shared/core/request.ts';
import { checkInvariants, type Limits, type Snapshot, Tracker } from '../../testkit/chaosInvariants.ts';

/** The chaos suite's min-ready invariants can fail: each is shown a table that breaks it. */

const limits: Limits = {
  nodesMax: undefined,
  minReady: new Map([['small', 2]]),
  backingMax: 10,
  staleEntryMs: 60_000,
  unsettledMs: 60_000,
  orphanMs: 60_000,
};

const backing = (slotMap: Record<string, string>): BackingRecord => ({
  id: 'bn-1',
  poolKey: 'meta/main',
  label: 'small',
  backingPoolKey: 'ec2/main',
  backingLabel: 'large',
  state: 'ready',
  slots: 8,
  used: Object.keys(slotMap).length,
  slotMap,
  version: 1,
  attempt: 1,
  launchedAt: 0,
  lastUsedAt: 0,
});

const node = (id: string, slot: number, extra: Partial<NodeRecord> = {}): NodeRecord => ({
  id,
  label: 'small',
  state: 'ready',
  backingNodeId: 'bn-1',
  slot,
  ...extra,
});

function spare(seat: number, extra: Partial<NodeRecord> = {}): RequestRecord {
  const base = requestedRecord(spareMessage('small', seat, 0), 0);
  return { ...base, state: 'fulfilled', nodes: [node(spareNodeId('small', seat, 0), seat, extra)] };
}

const snapshot = (now: number, requests: RequestRecord[], slotMap: Record<string, string>): Snapshot => ({
  now,
  requests,
  backing: [backing(slotMap)],
  poolNodes: new Set(),
  backingPool: new Set(['bn-1']),
  poolUsed: 0,
  backingUsed: 1,
  instances: [],
});

const slotsOf = (requests: RequestRecord[]) =>
  Object.fromEntries(
    requests.flatMap((r) => r.nodes.filter((n) => !n.spare).map((n) => [String(n.slot), n.id])),
  );

describe('chaos invariants: min-ready', () => {
  it('flags more untaken min-ready nodes than min-ready', () => {
    const two = [spare(0), spare(1)];
    expect(checkInvariants(snapshot(0, two, slotsOf(two)), limits, new Tracker())).toEqual([]);
    const three = [...two, spare(2)];
    expect(checkInvariants(snapshot(0, three, slotsOf(three)), limits, new Tracker())).toEqual([
      expect.stringMatching(/^3 untaken min-ready nodes of small exceed its min-ready 2/),
    ]);
  });

  it('accepts a taker on its min-ready node, and flags one whose node ended past the settle time', () => {
    const sid = spareNodeId('small', 0, 0);
    const taker: RequestRecord = {
      ...requestedRecord({ kind: 'request', id: 'r1', labels: ['small'] }, 0),
      state: 'fulfilled',
      nodes: [node('r1/0', 0, { spare: sid })],
    };
    const taken = spare(0, { takenBy: { node: 'r1/0', by: 'o', at: 0 } });
    const ok = [taken, taker];
    expect(checkInvariants(snapshot(0, ok, slotsOf(ok)), limits, new Tracker())).toEqual([]);
    const ended = [spare(0, { state: 'released', takenBy: { node: 'r1/0', by: 'o', at: 0 } }), taker];
    const tracker = new Tracker();
    expect(checkInvariants(snapshot(0, ended, {}), limits, tracker)).toEqual([]);
    expect(checkInvariants(snapshot(61_000, ended, {}), limits, tracker)).toEqual([
      expect.stringMatching(
        /^node r1\/0 \(ready\) runs on min-ready node min-ready:small:0:0\/0, which is released/,
      ),
    ]);
  });
});

describe('chaos invariants: capacity sets', () => {
  it('flags a set whose count is not its number of places, either way', () => {
    const none: RequestRecord[] = [];
    const at = (extra: Partial<Snapshot>) => ({ ...snapshot(0, none, {}), ...extra });
    expect(
      checkInvariants(at({ backingPool: new Set(['bn-1']), backingUsed: 1 }), limits, new Tracker()),
    ).toEqual([]);
    // A place without its count (a release that deleted its place and not its count, or the reverse).
    expect(
      checkInvariants(at({ backingPool: new Set(['bn-1', 'bn-2']), backingUsed: 1 }), limits, new Tracker()),
    ).toEqual([expect.stringMatching(/^the backing capacity set has 2 places but counts 1/)]);
    expect(
      checkInvariants(at({ backingPool: new Set(['bn-1']), backingUsed: 2 }), limits, new Tracker()),
    ).toEqual([expect.stringMatching(/^the backing capacity set has 1 places but counts 2/)]);
  });
});
