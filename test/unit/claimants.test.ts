import { describe, expect, it } from 'vitest';
import { readyBacking } from '../../bench/common.ts';
import { Claimants, ticketTarget } from '../../shared/core/claimants.ts';
import type { BackingRecord } from '../../shared/core/records.ts';

const backing = (id: string, used: number, slots = 4): BackingRecord =>
  readyBacking({
    id,
    poolKey: 'p',
    label: 'l',
    backingPoolKey: 'b',
    backingLabel: 'bl',
    slots,
    used,
    launchedAt: 0,
  });

describe('Claimants', () => {
  it('gives each concurrent claimant of a label the lowest ticket no other one holds', () => {
    const c = new Claimants();
    expect([c.take('a'), c.take('a'), c.take('a'), c.take('b')]).toEqual([0, 1, 2, 0]);
    c.give('a', 1);
    expect(c.take('a')).toBe(1);
    c.give('a', 0);
    c.give('a', 1);
    c.give('a', 2);
    expect(c.take('a')).toBe(0);
  });
});

describe('ticketTarget', () => {
  // Fullest first, as placeNode tries them: free slots 1 (slot 3), 2 (slots 2, 3), 4.
  const candidates = [backing('bn-1', 3), backing('bn-2', 2), backing('bn-3', 0)];
  const all = () => true;

  it('leaves a claimant alone (ticket 0) to the usual order', () => {
    expect(ticketTarget(candidates, 0, all)).toBeUndefined();
  });

  it('numbers the free slots fullest first, one ticket each', () => {
    const targets = [1, 2, 3, 4, 5, 6].map((t) => ticketTarget(candidates, t, all));
    expect(targets).toEqual([
      { index: 1, slot: 2 },
      { index: 1, slot: 3 },
      { index: 2, slot: 0 },
      { index: 2, slot: 1 },
      { index: 2, slot: 2 },
      { index: 2, slot: 3 },
    ]);
    // More claimants than free slots: round again.
    expect(ticketTarget(candidates, 7, all)).toEqual({ index: 0, slot: 3 });
  });

  it('skips candidates that cannot take a node, and has nothing when none can', () => {
    expect(ticketTarget(candidates, 1, (b) => b.id !== 'bn-2')).toEqual({ index: 2, slot: 0 });
    expect(ticketTarget(candidates, 1, () => false)).toBeUndefined();
  });
});
