import { describe, expect, it } from 'vitest';
import type { PriorityCeiling } from '../../shared/core/model.ts';
import {
  DEFAULT_REQUEST_PRIORITY,
  priorityCeilingOf,
  priorityOf,
  servedBefore,
  trustedPriority,
  waitingAhead,
} from '../../shared/core/priority.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { queueAsksFor, queueFits, queueOf } from '../../shared/core/waitingQueue.ts';
import { serviceKey as keyOf, queueId, serviceKey } from '../../shared/store/table.ts';

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

/**
 * Waiting queues (issue 24, defect 1): the priority check reads, of each queue whose shape fits, only its
 * first request served before `me`. Exact when that gives what `waitingAhead` gives over every waiting
 * request, and when the store's sort key orders a queue as `servedBefore` does: checked here on many
 * generated cases (a fixed seed, so a failure repeats).
 */
describe('waiting queues', () => {
  const labels = ['small', 'large', 'gpu'];
  let seed = 24;
  const random = () => {
    seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31;
    return seed / 2 ** 31;
  };
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)] as T;
  const generated = (i: number): RequestRecord => {
    const n = 1 + Math.floor(random() * 3);
    return req(random() < 0.1 ? `min-ready:small:${i}:1` : `r${i}`, {
      labels: Array.from({ length: n }, () => pick(labels)),
      createdAt: Math.floor(random() * 20),
      ...(random() < 0.7 ? { priority: pick([-3, 0, 50, 100, 100.5, 2_000_000_000]) } : {}),
    });
  };
  /** What the store answers: the first of each queue that fits, served before `me` (sorted as the key sorts). */
  const byQueues = (me: RequestRecord, waiting: readonly RequestRecord[]) => {
    const queues = new Map<string, RequestRecord[]>();
    for (const r of waiting) {
      const id = queueId(queueOf(r));
      queues.set(id, [...(queues.get(id) ?? []), r]);
    }
    const firsts: RequestRecord[] = [];
    for (const rs of queues.values()) {
      const [q] = rs.map(queueOf);
      if (!q || !queueFits(q, me, pool)) continue;
      const sorted = [...rs].sort((a, b) => (serviceKey(a) < serviceKey(b) ? -1 : 1));
      const first = sorted.find((r) => serviceKey(r) < serviceKey(me));
      if (first) firsts.push(first);
    }
    const self = firsts.find((r) => r.id === me.id) ?? me;
    return waitingAhead(self, firsts, pool);
  };

  it('orders a queue by its sort key exactly as servedBefore does', () => {
    const rs = Array.from({ length: 300 }, (_, i) => generated(i)).map((r) => ({ r, key: serviceKey(r) }));
    const disagree: string[] = [];
    for (const a of rs.slice(0, 60))
      for (const b of rs)
        if (a !== b && a.key < b.key !== servedBefore(a.r, b.r)) disagree.push(`${a.r.id} / ${b.r.id}`);
    expect(disagree).toEqual([]);
  });

  it('finds, from the first of each fitting queue, the request waitingAhead finds among them all', () => {
    for (let round = 0; round < 200; round++) {
      const waiting = Array.from({ length: 25 }, (_, i) => generated(round * 100 + i));
      // A new request (recorded now), and one that already waits (its stored record among them); both
      // of this pool's labels only, as every request whose pools are tried (eligiblePools).
      const mine = waiting.filter(
        (r) => r.labels.every((l) => pool.labels.has(l)) && !r.id.startsWith('min'),
      );
      const fresh = req(`me-${round}`, { ...pick(mine), id: `me-${round}`, createdAt: 20 });
      const stored = pick(mine);
      for (const me of [fresh, { ...stored, createdAt: 20 }]) {
        const all = [...waiting].sort((a, b) => (servedBefore(a, b) ? -1 : 1));
        const self = all.find((r) => r.id === me.id) ?? me;
        expect(byQueues(me, all)?.id, `round ${round}, ${me.id}`).toBe(waitingAhead(self, all, pool)?.id);
      }
    }
  });

  it('puts node sets of one shape in one queue whatever the order of their labels', () => {
    expect(queueOf({ labels: ['b', 'a', 'b'] })).toEqual({ labels: ['a', 'b'], count: 3 });
    expect(queueId(queueOf({ labels: ['a', 'b', 'b'] }))).toBe(queueId(queueOf({ labels: ['b', 'b', 'a'] })));
    expect(queueId(queueOf({ labels: ['a', 'b'] }))).not.toBe(queueId(queueOf({ labels: ['a', 'b', 'b'] })));
    expect(queueAsksFor(queueOf({ labels: ['small', 'large'] }), 'large', pool)).toBe(true);
    expect(queueAsksFor(queueOf({ labels: ['small', 'gpu'] }), 'small', pool)).toBe(false);
  });
});

describe('priority-ceiling: who may claim which priority (issue 25, defect 3)', () => {
  const ceiling = (d: number | undefined, requestors: Record<string, number> = {}): PriorityCeiling => ({
    ...(d === undefined ? {} : { default: d }),
    requestors: new Map(Object.entries(requestors)),
  });
  const config = {
    priorityCeiling: ceiling(100, { 'release-bot': -1000, nightly: 300 }),
    labelPriorityCeilings: new Map([
      ['gpu', ceiling(500, { 'release-bot': 0 })],
      ['open', ceiling(undefined)],
    ]),
  };

  it("bounds by the requestor's entry, else the default; a label's own ceiling replaces the top-level one", () => {
    expect(priorityCeilingOf(config, ['small'], 'release-bot')).toBe(-1000);
    expect(priorityCeilingOf(config, ['small'], 'ci')).toBe(100);
    expect(priorityCeilingOf(config, ['small'], undefined)).toBe(100); // no requestor: the default
    expect(priorityCeilingOf(config, ['gpu'], 'release-bot')).toBe(0);
    expect(priorityCeilingOf(config, ['gpu'], 'nightly')).toBe(500); // not listed in gpu's own
    expect(priorityCeilingOf(config, ['open'], 'ci')).toBeUndefined(); // its own: no default
    expect(priorityCeilingOf({ labelPriorityCeilings: new Map() }, ['small'], 'ci')).toBeUndefined();
  });

  it('takes the worst ceiling of a node set: naming another label beside it gets no request ahead', () => {
    expect(priorityCeilingOf(config, ['small', 'gpu'], 'release-bot')).toBe(0);
    expect(priorityCeilingOf(config, ['open', 'small'], 'ci')).toBe(100);
  });

  it('serves a claim better than the ceiling at the ceiling, keeps the claim as sent, and leaves spares alone', () => {
    const sneaky = trustedPriority(config, req('sneaky', { requestor: 'ci', priority: -1_000_000 }));
    expect(sneaky).toMatchObject({ priority: -1_000_000, priorityCeiling: 100 });
    expect(priorityOf(sneaky)).toBe(100);
    // Within its ceiling: unchanged (and a ceiling recorded by an earlier configuration is dropped).
    const fair = trustedPriority(
      config,
      req('fair', { requestor: 'ci', priority: 150, priorityCeiling: 200 }),
    );
    expect(fair.priorityCeiling).toBeUndefined();
    expect(priorityOf(fair)).toBe(150);
    // A request that claims nothing claims the default: a worse ceiling holds it too.
    const late = trustedPriority(config, req('late', { requestor: 'nightly' }));
    expect(late.priority).toBeUndefined();
    expect(priorityOf(late)).toBe(300);
    // The trusted requestor is served as it asked, ahead of the clamped one even when younger.
    const bot = trustedPriority(
      config,
      req('bot', { requestor: 'release-bot', priority: -10, createdAt: 9_000 }),
    );
    expect(servedBefore(bot, sneaky)).toBe(true);
    expect(keyOf(bot) < keyOf(sneaky)).toBe(true); // the store's order agrees
    const spare = req('min-ready:small:0:0', { priority: 2_000_000 });
    expect(trustedPriority(config, spare)).toEqual(spare);
  });
});
