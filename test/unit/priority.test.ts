import { describe, expect, it } from 'vitest';
import { DEFAULT_REQUEST_PRIORITY, servedBefore, waitingAhead } from '../../shared/core/priority.ts';
import type { RequestRecord } from '../../shared/core/records.ts';

const req = (id: string, over: Partial<RequestRecord> = {}): RequestRecord => ({
  id,
  labels: ['small'],
  bodyHash: id,
  state: 'requested',
  createdAt: 1_000,
  updatedAt: 1_000,
  version: 0,
  nodes: [],
  ...over,
});
const pool = {
  labels: new Map([
    ['small', {}],
    ['large', {}],
  ]),
} as unknown as Parameters<typeof waitingAhead>[2];

describe('request priority (Nodepool: lower number first, then oldest)', () => {
  it.each([
    ['a lower number first', req('a', { priority: 1 }), req('b', { priority: 2 }), true],
    ['a higher number after', req('a', { priority: 5 }), req('b', { priority: 2 }), false],
    [
      'no priority counts as the default',
      req('a'),
      req('b', { priority: DEFAULT_REQUEST_PRIORITY + 1 }),
      true,
    ],
    ['equal: the older first', req('a', { createdAt: 2 }), req('b', { createdAt: 1 }), false],
    ['equal and as old: by id', req('a'), req('b'), true],
  ])('%s', (_what, a, b, before) => {
    expect(servedBefore(a, b)).toBe(before);
    expect(servedBefore(b, a)).toBe(!before);
  });

  it('finds the first waiting request that fits where this one would go', () => {
    const me = req('me', { priority: 50, createdAt: 5_000 });
    const waiting = [
      req('later', { priority: 60 }), // served after me
      req('placed', { priority: 1, state: 'pending' }), // not waiting
      req('bigger', { priority: 1, labels: ['small', 'small'] }), // needs more nodes than me
      req('other-label', { priority: 1, labels: ['large'] }), // waits for something I do not take
      req('elsewhere', { priority: 1, labels: ['gpu'] }), // not this pool's
      req('second', { priority: 10 }),
      req('first', { priority: 5 }),
      me,
    ];
    expect(waitingAhead(me, waiting, pool)?.id).toBe('first');
    expect(
      waitingAhead(
        me,
        waiting.filter((r) => r.id !== 'first' && r.id !== 'second'),
        pool,
      ),
    ).toBeUndefined();
  });

  // Issue 22, defect 4: spares used priority 1e9 and a request above it waited behind them forever.
  it("serves every request before the pool's own min-ready requests, whatever their numbers", () => {
    const spare = req('min-ready:small:0:1', { priority: -1_000_000, createdAt: 1 });
    // A request recorded before priorities were bounded may carry any number.
    const late = req('late', { priority: 2_000_000_000, createdAt: 9_000 });
    expect(servedBefore(late, spare)).toBe(true);
    expect(servedBefore(spare, late)).toBe(false);
    expect(waitingAhead(late, [spare, late], pool)).toBeUndefined();
    expect(waitingAhead(spare, [spare, late], pool)?.id).toBe('late');
  });

  it('orders spares among themselves as requests are ordered', () => {
    const older = req('min-ready:small:0:1', { createdAt: 1 });
    const newer = req('min-ready:small:1:1', { createdAt: 2 });
    expect(servedBefore(older, newer)).toBe(true);
  });
});
