import { describe, expect, it } from 'vitest';
import { parseNodeId, requestIdPattern } from '../../shared/core/ids.ts';
import { parseMessage } from '../../shared/core/messages.ts';
import {
  isFreeSpare,
  nodeOnSpare,
  SPARE_PRIORITY,
  seatStep,
  spareMessage,
  spareNodeId,
  spareRequestId,
  takenSpare,
} from '../../shared/core/minReady.ts';
import type { NodeRecord, RequestRecord } from '../../shared/core/records.ts';
import { requestedRecord } from '../../shared/core/request.ts';

/** The min-ready model (core/minReady.ts): spare ids, taking one, and what becomes of a seat. */

const readyNode = (id: string, extra: Partial<NodeRecord> = {}): NodeRecord => ({
  id,
  label: 'small',
  state: 'ready',
  backingNodeId: 'bn-1',
  slot: 1,
  host: '127.0.0.1',
  port: 2222,
  attributes: { zone: 'a' },
  hostKeys: ['ssh-ed25519 AAAA'],
  readyAt: 1,
  attempts: 1,
  ...extra,
});

function spare(
  seat: number,
  gen: number,
  node: Partial<NodeRecord> = {},
  state: RequestRecord['state'] = 'fulfilled',
): RequestRecord {
  const base = requestedRecord(spareMessage('small', seat, gen), 0);
  return { ...base, state, poolKey: 'meta/main', nodes: [readyNode(spareNodeId('small', seat, gen), node)] };
}

const taker = (spareId: string | undefined): RequestRecord => ({
  ...requestedRecord({ kind: 'request', id: 'r1', labels: ['small'] }, 0),
  state: 'fulfilled',
  nodes: [readyNode('r1/0', spareId ? { spare: spareId } : {})],
});

describe('min-ready ids', () => {
  it('are request ids of their own, which no request message may use', () => {
    const id = spareRequestId('small', 2, 7);
    expect(id).toBe('min-ready:small:2:7');
    expect(requestIdPattern.test(id)).toBe(true);
    expect(parseNodeId(spareNodeId('small', 2, 7))).toEqual({ requestId: id, index: 0 });
    // A label outside the id alphabet is named by a hash, still within the pattern.
    expect(requestIdPattern.test(spareRequestId('gpu node/ä', 0, 0))).toBe(true);
    expect(spareRequestId('gpu node/ä', 0, 0)).not.toBe(spareRequestId('gpu node/b', 0, 0));
    const parsed = parseMessage(
      JSON.stringify({ kind: 'request', id: 'min-ready:small:0:0', labels: ['small'] }),
    );
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) expect(parsed.reason).toContain("the pool's own min-ready requests");
    // Refused without an id to record the failure under: a message never writes the pool's own records.
    if (!parsed.ok) expect(parsed.requestId).toBeUndefined();
  });

  it('are served after every request', () => {
    expect(spareMessage('small', 0, 0).priority).toBe(SPARE_PRIORITY);
  });
});

describe('taking a min-ready node', () => {
  it('records the taker on the spare and gives the taker the spare slot, ready', () => {
    const s = spare(0, 0);
    const taken = takenSpare(s, 'r1/0', 'owner-1', 50);
    expect(taken.version).toBe(s.version + 1);
    expect(taken.nodes[0]?.takenBy).toEqual({ node: 'r1/0', by: 'owner-1', at: 50 });
    expect(isFreeSpare(taken.nodes[0])).toBe(false);
    expect(isFreeSpare(s.nodes[0])).toBe(true);
    expect(isFreeSpare({ ...(s.nodes[0] as NodeRecord), held: true })).toBe(false); // an operator's now
    expect(() => takenSpare(taken, 'r2/0', 'owner-2', 60)).toThrow(/not free/);
    const n = nodeOnSpare(
      { id: 'r1/0', label: 'small', state: 'requested' },
      taken.nodes[0] as NodeRecord,
      70,
    );
    expect(n).toMatchObject({
      id: 'r1/0',
      state: 'ready',
      backingNodeId: 'bn-1',
      slot: 1,
      host: '127.0.0.1',
      port: 2222,
      spare: spareNodeId('small', 0, 0),
      readyAt: 70,
    });
    expect(n.takenBy).toBeUndefined();
  });
});

describe('a seat', () => {
  const alive = () => false;
  const dead = () => true;
  it('makes its spare when there is none, or it still waits to be placed', () => {
    expect(seatStep(undefined, undefined, alive)).toBe('make');
    expect(seatStep(spare(0, 0, { state: 'requested' }, 'requested'), undefined, alive)).toBe('make');
  });
  it('keeps a live untaken spare, and one taken by a delivery that may still record it', () => {
    expect(seatStep(spare(0, 0), undefined, dead)).toBe('keep');
    expect(seatStep(spare(0, 0, { state: 'pending' }, 'pending'), undefined, dead)).toBe('keep');
    const taken = spare(0, 0, { takenBy: { node: 'r1/0', by: 'o', at: 1 } });
    expect(seatStep(taken, undefined, alive)).toBe('keep');
    expect(seatStep(taken, taker(undefined), alive)).toBe('keep');
  });
  it('moves on once its spare ended, or its taker recorded it', () => {
    expect(seatStep(spare(0, 0, { state: 'released' }), undefined, alive)).toBe('advance');
    expect(seatStep(spare(0, 0, { state: 'failed' }, 'failed'), undefined, alive)).toBe('advance');
    const taken = spare(0, 0, { takenBy: { node: 'r1/0', by: 'o', at: 1 } });
    expect(seatStep(taken, taker(spareNodeId('small', 0, 0)), alive)).toBe('advance');
  });
  it('calls a spare orphaned only when its taker is known dead and never recorded it', () => {
    const taken = spare(0, 0, { takenBy: { node: 'r1/0', by: 'o', at: 1 } });
    expect(seatStep(taken, undefined, dead)).toBe('orphan');
    expect(seatStep(taken, taker(spareNodeId('small', 1, 0)), dead)).toBe('orphan');
    expect(seatStep(taken, taker(spareNodeId('small', 0, 0)), dead)).toBe('advance');
  });
});
