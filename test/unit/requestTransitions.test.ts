import { describe, expect, it } from 'vitest';
import { IllegalTransitionError } from '../../shared/core/errors.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../../shared/core/records.ts';
import {
  failedRequest,
  holdsSlot,
  placedNode,
  placedRequest,
  readyNode,
  requestedRecord,
  settledState,
  withNodes,
} from '../../shared/core/request.ts';
import type { NodeState, RequestState } from '../../shared/core/states.ts';
import { MAX_REASON_LENGTH } from '../../shared/core/text.ts';

const node = (state: NodeState, extra: Partial<NodeRecord> = {}): NodeRecord => ({
  id: `r/${extra.slot ?? 0}`,
  label: 'small',
  state,
  ...extra,
});

const request = (state: RequestState, nodes: NodeRecord[]): RequestRecord => ({
  id: 'r',
  labels: nodes.map((n) => n.label),
  bodyHash: 'h',
  state,
  createdAt: 1,
  updatedAt: 1,
  version: 3,
  nodes,
});

const backing = (state: BackingRecord['state']): BackingRecord => ({
  id: 'b1',
  poolKey: 'meta/main',
  label: 'small',
  backingPoolKey: 'local/main',
  backingLabel: 'large',
  state,
  slots: 4,
  used: 1,
  slotMap: { '2': 'r/0' },
  version: 7,
  attempt: 1,
  host: '127.0.0.1',
  port: 2222,
  attributes: { zone: 'a', hostKeys: ['ssh-ed25519 AAAA'] },
  launchedAt: 0,
  lastUsedAt: 0,
});

describe('a request settles by its nodes (core/request.ts)', () => {
  // The state table of core/request.ts, row by row: request state, its nodes after a change, the result.
  const table: [RequestState, NodeState[], RequestState][] = [
    ['pending', ['ready', 'ready'], 'fulfilled'],
    ['pending', ['ready', 'released'], 'fulfilled'],
    ['pending', ['released', 'released'], 'fulfilled'],
    ['pending', ['ready', 'pending'], 'pending'],
    ['pending', ['pending', 'pending'], 'pending'],
    ['pending', ['ready', 'failed'], 'failed'],
    ['pending', ['pending', 'failed'], 'failed'],
    ['requested', ['requested', 'requested'], 'requested'],
    ['requested', ['ready', 'ready'], 'requested'],
    ['fulfilled', ['ready', 'failed'], 'fulfilled'],
    ['fulfilled', ['released', 'released'], 'fulfilled'],
    ['failed', ['failed', 'ready'], 'failed'],
  ];
  it.each(table)('%s with nodes %j becomes %s', (state, nodeStates, expected) => {
    const nodes = nodeStates.map((s, i) =>
      node(s, { slot: i, reason: s === 'failed' ? `node ${i} lost` : undefined }),
    );
    expect(settledState(state, nodes).state).toBe(expected);
    const next = withNodes(request(state, nodes), nodes, 9);
    expect(next).toMatchObject({ state: expected, version: 4, updatedAt: 9 });
  });

  it('takes the reason of the first failed node when it fails', () => {
    const nodes = [node('ready'), node('failed', { slot: 1, reason: 'backing node b1 vanished' })];
    expect(withNodes(request('pending', nodes), nodes, 2).reason).toBe('backing node b1 vanished');
    expect(settledState('pending', [node('failed')]).reason).toBe('a node failed');
  });
});

describe('request records (core/request.ts)', () => {
  it('records a request as received: requested, one requested node per label, version 0', () => {
    const r = requestedRecord({ kind: 'request', id: 'job', labels: ['a', 'b'], priority: 2 }, 5);
    expect(r).toMatchObject({ id: 'job', state: 'requested', version: 0, createdAt: 5, priority: 2 });
    expect(r.nodes).toEqual([
      { id: 'job/0', label: 'a', state: 'requested' },
      { id: 'job/1', label: 'b', state: 'requested' },
    ]);
    const same = requestedRecord({ kind: 'request', id: 'job', labels: ['a', 'b'], priority: 2 }, 99);
    const other = requestedRecord({ kind: 'request', id: 'job', labels: ['a'], priority: 2 }, 5);
    expect(same.bodyHash).toBe(r.bodyHash);
    expect(other.bodyHash).not.toBe(r.bodyHash);
  });

  it('places a node ready with connection details on a ready backing node, pending on a launching one', () => {
    const place = { backing: backing('ready'), slot: 2, attempt: 1 };
    const ready = placedNode(node('requested'), place, { role: 'ci' }, 10);
    expect(ready).toMatchObject({
      state: 'ready',
      backingNodeId: 'b1',
      slot: 2,
      attempts: 1,
      host: '127.0.0.1',
      port: 2222,
      readyAt: 10,
      hostKeys: ['ssh-ed25519 AAAA'],
    });
    // The pool's node attributes win over the backing node's.
    expect(ready.attributes).toMatchObject({ zone: 'a', role: 'ci' });
    const scanned = placedNode(node('requested'), { ...place, hostKeys: ['ssh-rsa BBBB'] }, {}, 10);
    expect(scanned.hostKeys).toEqual(['ssh-rsa BBBB']);
    const waiting = placedNode(node('requested'), { ...place, backing: backing('launching') }, {}, 10);
    expect(waiting).toMatchObject({ state: 'pending', backingNodeId: 'b1', slot: 2 });
    expect(waiting.host).toBeUndefined();
    // A waiting node moved to another launching backing node stays pending (a move, not a transition).
    const moved = placedNode(
      waiting,
      { backing: { ...backing('launching'), id: 'b2' }, slot: 0, attempt: 2 },
      {},
      11,
    );
    expect(moved).toMatchObject({ state: 'pending', backingNodeId: 'b2', attempts: 2 });
    expect(() => placedNode(node('released'), place, {}, 10)).toThrow(IllegalTransitionError);
  });

  it('readies a pending node only', () => {
    expect(readyNode(node('pending'), backing('ready'), {}, undefined, 4)).toMatchObject({
      state: 'ready',
      readyAt: 4,
    });
    expect(() => readyNode(node('released'), backing('ready'), {}, undefined, 4)).toThrow(
      IllegalTransitionError,
    );
  });

  it('places a waiting request fulfilled when every node is ready at once, pending otherwise, without its placer', () => {
    const base = { ...request('requested', [node('requested')]), placer: 'delivery-1' };
    const all = placedRequest(base, 'meta/main', [node('ready')], 8);
    expect(all).toMatchObject({ state: 'fulfilled', poolKey: 'meta/main', version: 4 });
    expect(all.placer).toBeUndefined();
    expect(placedRequest(base, 'meta/main', [node('pending')], 8).state).toBe('pending');
    expect(() => placedRequest(request('fulfilled', []), 'meta/main', [], 8)).toThrow(IllegalTransitionError);
  });

  it('fails a request with a bounded reason on the request and the nodes it fails', () => {
    const r = { ...request('pending', [node('ready'), node('released', { slot: 1 })]), placer: 'x' };
    const failed = failedRequest(r, 'x'.repeat(MAX_REASON_LENGTH * 2), 6);
    expect(failed.state).toBe('failed');
    expect(failed.reason?.length).toBeLessThanOrEqual(MAX_REASON_LENGTH);
    expect(failed.nodes.map((n) => n.state)).toEqual(['failed', 'released']);
    expect(failed.nodes[0]?.reason).toBe(failed.reason);
    expect(failed.placer).toBeUndefined();
    expect(() => failedRequest(request('fulfilled', []), 'late', 6)).toThrow(IllegalTransitionError);
  });

  it('tells whether a node holds its slot on a backing node', () => {
    expect(holdsSlot(node('ready', { backingNodeId: 'b1', slot: 2 }), 'b1', 2)).toBe(true);
    expect(holdsSlot(node('pending', { backingNodeId: 'b1', slot: 2 }), 'b1', 2)).toBe(true);
    expect(holdsSlot(node('released', { backingNodeId: 'b1', slot: 2 }), 'b1', 2)).toBe(false);
    expect(holdsSlot(node('ready', { backingNodeId: 'b1', slot: 1 }), 'b1', 2)).toBe(false);
    expect(holdsSlot(undefined, 'b1', 2)).toBe(false);
  });
});
