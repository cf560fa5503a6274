import { describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import {
  compareByExpectedEnd,
  compareCandidates,
  expectedEndOf,
  freeSlot,
  isClaimable,
  lowestFreeSlot,
  markRetiring,
  withClaimedSlot,
} from '../../shared/core/backing.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { IllegalTransitionError } from '../../shared/core/errors.ts';
import { backingNodeId, nodeId, parseNodeId } from '../../shared/core/ids.ts';
import { claimDue, deadlineDecision, notFoundIsFinal, reapDecision } from '../../shared/core/lifecycle.ts';
import { parseMessage } from '../../shared/core/messages.ts';
import type { MetastaticLabel } from '../../shared/core/model.ts';
import {
  eligiblePools,
  nodeAttributes,
  requestTimeoutOf,
  shortestRequestTimeout,
} from '../../shared/core/pools.ts';
import { nextFirstStep, REAPER_STEPS, stepOrder } from '../../shared/core/reaperSteps.ts';
import type { BackingRecord } from '../../shared/core/records.ts';
import { assertTransition, backingTransitions, canTransition } from '../../shared/core/states.ts';
import {
  CLAIM_TAKEOVER_MS,
  FUNCTION_TIMEOUT_SECONDS,
  RESOURCE_NOT_FOUND_GRACE_MS,
  SLOT_LEASE_MS,
  visibilityTimeoutSeconds,
} from '../../shared/core/timing.ts';
import { backingIndexAttributes, requestIndexAttributes } from '../../shared/store/table.ts';
import { baseConfig } from '../../testkit/configs.ts';

const clock = new ManualClock(Date.parse('2026-06-01T00:00:00Z'));
const T0 = clock.now();

function backing(overrides: Partial<BackingRecord> = {}): BackingRecord {
  return {
    id: 'bn-1',
    poolKey: 'meta/main',
    label: 'small-node',
    backingPoolKey: 'local/main',
    backingLabel: 'large-node',
    state: 'ready',
    slots: 4,
    used: 0,
    slotMap: {},
    version: 3,
    attempt: 1,
    launchedAt: T0,
    lastUsedAt: T0,
    ...overrides,
  };
}

const label = (o: Partial<MetastaticLabel> = {}): MetastaticLabel => ({
  name: 'small-node',
  backingLabel: 'large-node',
  maxParallelJobs: 4,
  graceTime: 60,
  minRetentionTime: 0,
  maxAge: undefined,
  hostKeyChecking: false,
  requestTimeout: 10_800,
  ...o,
});

describe('state table', () => {
  it('allows only the listed transitions', () => {
    expect(canTransition('backing', 'launching', 'ready')).toBe(true);
    expect(canTransition('backing', 'stopped', 'ready')).toBe(false);
    expect(canTransition('node', 'released', 'ready')).toBe(false);
    expect(canTransition('request', 'fulfilled', 'failed')).toBe(false);
    expect(() => assertTransition('backing', 'retiring', 'ready')).toThrow(IllegalTransitionError);
    expect(() => assertTransition('backing', 'retiring', 'ready')).toThrow(
      'illegal backing transition retiring -> ready',
    );
  });

  it('has no way out of a terminal state', () => {
    expect(backingTransitions.stopped).toEqual([]);
  });
});

describe('slot claims', () => {
  it('takes the lowest free slot and bumps the version', () => {
    const b = backing({ used: 2, slotMap: { '0': 'a/0', '2': 'b/0' } });
    const { next, slot } = withClaimedSlot(b, 'c/0', T0, 'owner-c');
    expect(slot).toBe(1);
    expect(next.used).toBe(3);
    expect(next.version).toBe(4);
    expect(next.slotMap).toEqual({ '0': 'a/0', '1': 'c/0', '2': 'b/0' });
    expect(next.claims).toEqual({ '1': { at: T0, by: 'owner-c' } });
  });

  it('refuses a full, retiring or max-aged backing node', () => {
    expect(isClaimable(backing({ used: 4 }), T0)).toBe(false);
    expect(isClaimable(backing({ state: 'retiring' }), T0)).toBe(false);
    expect(isClaimable(backing({ state: 'launching' }), T0)).toBe(true);
    expect(isClaimable(backing({ noNewNodesAfter: T0 + 10 }), T0 + 9)).toBe(true);
    expect(isClaimable(backing({ noNewNodesAfter: T0 + 10 }), T0 + 10)).toBe(false);
    expect(() =>
      withClaimedSlot(
        backing({ used: 4, slotMap: { 0: 'a', 1: 'b', 2: 'c', 3: 'd' } }),
        'x/0',
        T0,
        'owner-x',
      ),
    ).toThrow();
    expect(lowestFreeSlot(backing({ slots: 1, slotMap: { 0: 'a' } }))).toBeUndefined();
  });

  it('frees a slot and stamps last-used', () => {
    const b = backing({ used: 1, slotMap: { '0': 'a/0' } });
    const next = freeSlot(b, 0, T0 + 5_000);
    expect(next).toMatchObject({ used: 0, slotMap: {}, lastUsedAt: T0 + 5_000, version: 4 });
  });

  it('orders candidates fullest first, ties to the oldest', () => {
    const a = backing({ id: 'a', used: 1, launchedAt: T0 });
    const b = backing({ id: 'b', used: 3, launchedAt: T0 + 10 });
    const c = backing({ id: 'c', used: 3, launchedAt: T0 + 5 });
    expect([a, b, c].sort(compareCandidates).map((x) => x.id)).toEqual(['c', 'b', 'a']);
  });

  it('orders candidates for a node with an expected end: those it keeps no longer first (closest end first), then least kept longer, unknown last', () => {
    const end = T0 + 600_000; // the new node is expected to be released in 10 minutes
    const soon = backing({ id: 'soon', used: 3, ends: { 0: T0 + 60_000, 1: T0 + 30_000, 2: T0 + 90_000 } });
    const near = backing({ id: 'near', used: 1, ends: { 0: T0 + 540_000 } });
    const late = backing({ id: 'late', used: 2, ends: { 0: T0 + 3_600_000, 1: T0 } });
    const unknown = backing({ id: 'unknown', used: 3, ends: { 0: T0 + 600_000 } }); // 2 of 3 without one
    const empty = backing({ id: 'empty', used: 0, ends: {} }); // would go now
    expect(expectedEndOf(soon, T0)).toBe(T0 + 90_000);
    expect(expectedEndOf(unknown, T0)).toBeUndefined();
    expect(expectedEndOf(empty, T0)).toBe(T0);
    const order = [soon, near, late, unknown, empty].sort(compareByExpectedEnd(end, T0)).map((x) => x.id);
    // late ends after it (kept no longer); near 60 s before, soon 510 s, empty would go now (600 s).
    expect(order).toEqual(['late', 'near', 'soon', 'empty', 'unknown']);
    // Ties (the same distance) go to the usual order: fullest first.
    const twin = backing({ id: 'twin', used: 3, ends: { 0: T0, 1: T0, 2: T0 + 540_000 } });
    expect([near, twin].sort(compareByExpectedEnd(end, T0)).map((x) => x.id)).toEqual(['twin', 'near']);
  });

  it("forgets a freed slot's expected end", () => {
    const b = backing({ used: 2, slotMap: { 0: 'a/0', 1: 'b/0' }, ends: { 0: T0 + 1, 1: T0 + 2 } });
    expect(freeSlot(b, 0, T0).ends).toEqual({ 1: T0 + 2 });
  });

  it('refuses to retire a backing node that holds a node', () => {
    expect(() => markRetiring(backing({ used: 1, slotMap: { 0: 'a/0' } }), T0, 'x')).toThrow(/holds 1 node/);
  });
});

describe('index attributes', () => {
  it('keeps a backing node in the free index only while it can take a node', () => {
    expect(backingIndexAttributes(backing({ used: 1 })).fpk).toBe('FREE#meta/main#small-node');
    expect(backingIndexAttributes(backing({ used: 4 })).fpk).toBeUndefined();
    expect(backingIndexAttributes(backing({ state: 'retiring' })).fpk).toBeUndefined();
  });

  it('sorts the free index fullest first', () => {
    const full = backingIndexAttributes(backing({ used: 3 })).fsk as string;
    const empty = backingIndexAttributes(backing({ used: 0 })).fsk as string;
    expect(full < empty).toBe(true);
  });

  it('files empty, launching, retiring and failed backing nodes for the reaper', () => {
    expect(backingIndexAttributes(backing({ used: 0 })).rpk).toBe('IDLE');
    expect(backingIndexAttributes(backing({ used: 1, state: 'launching' })).rpk).toBe('LAUNCHING');
    expect(backingIndexAttributes(backing({ used: 1 })).rpk).toBe('ACTIVE');
    expect(backingIndexAttributes(backing({ state: 'retiring' })).rpk).toBe('RETIRING');
    expect(backingIndexAttributes(backing({ state: 'failed', used: 2 })).rpk).toBe('FAILED');
    expect(backingIndexAttributes(backing({ state: 'stopped' })).rpk).toBeUndefined();
  });

  it('files a request in its WAITING queue while it is requested, in PENDING by placement time while it is pending', () => {
    const r = (state: 'requested' | 'pending' | 'fulfilled' | 'failed', createdAt = T0) => ({
      id: 'r',
      labels: [],
      bodyHash: 'h',
      state,
      createdAt,
      updatedAt: createdAt,
      version: 0,
      nodes: [],
    });
    // Waiting: in the queue of its node set's shape (issue 24), in service order: priority, then age.
    expect(requestIndexAttributes(r('requested'))).toEqual({
      rpk: expect.stringMatching(/^WAITING#0#[0-9a-f]{16}$/),
      rsk: expect.stringMatching(new RegExp(`#00${T0}#r$`)),
    });
    expect(
      (requestIndexAttributes(r('requested', 9)).rsk as string) <
        (requestIndexAttributes(r('requested', 10)).rsk as string),
    ).toBe(true);
    expect(
      (requestIndexAttributes({ ...r('requested', 10), priority: 1 }).rsk as string) <
        (requestIndexAttributes(r('requested', 9)).rsk as string),
    ).toBe(true);
    for (const state of ['fulfilled', 'failed'] as const) {
      expect(requestIndexAttributes(r(state))).toEqual({});
    }
    // A pending request's deadline counts from its placement (its updatedAt for a record from before placedAt).
    expect(requestIndexAttributes({ ...r('pending'), placedAt: T0 + 5, updatedAt: T0 + 9 })).toEqual({
      rpk: 'PENDING',
      rsk: `00${T0 + 5}#r`,
    });
    expect(requestIndexAttributes({ ...r('pending'), updatedAt: T0 + 9 })).toEqual({
      rpk: 'PENDING',
      rsk: `00${T0 + 9}#r`,
    });
  });
});

describe('reaper decisions', () => {
  const cases: Array<
    [string, Partial<BackingRecord>, Partial<MetastaticLabel> | undefined, number, boolean]
  > = [
    ['in use', { used: 1, slotMap: { 0: 'a/0' } }, {}, 10_000_000, false],
    ['within grace-time', { lastUsedAt: T0 }, { graceTime: 60 }, 59_999, false],
    ['grace-time passed', { lastUsedAt: T0 }, { graceTime: 60 }, 60_000, true],
    ['grace-time passed, fractions', { lastUsedAt: T0 }, { graceTime: 0.5 }, 500, true],
    [
      'grace passed but within min-retention',
      { launchedAt: T0 },
      { graceTime: 1, minRetentionTime: 600 },
      120_000,
      false,
    ],
    ['min-retention passed', { launchedAt: T0 }, { graceTime: 1, minRetentionTime: 600 }, 600_000, true],
    [
      'max-age reached, empty: at once',
      { noNewNodesAfter: T0 + 1000, lastUsedAt: T0 + 999 },
      { graceTime: 600, minRetentionTime: 6000, maxAge: 1 },
      1000,
      true,
    ],
    [
      'max-age reached, in use',
      { noNewNodesAfter: T0, used: 1, slotMap: { 0: 'a' } },
      { maxAge: 1 },
      1000,
      false,
    ],
    ['label removed, empty: at once', { lastUsedAt: T0 }, undefined, 0, true],
    ['already retiring', { state: 'retiring' }, {}, 10_000_000, false],
  ];
  it.each(cases)('%s', (_name, b, l, elapsed, retire) => {
    const decision = reapDecision(backing(b), l === undefined ? undefined : label(l), T0 + elapsed);
    expect(decision.retire).toBe(retire);
  });
});

describe("the reaper's rotation of its steps (issue 24)", () => {
  it('runs every step once, in the usual order unless a run was cut short', () => {
    expect(stepOrder(undefined)).toEqual([...REAPER_STEPS]);
    expect(stepOrder('no-such-step')).toEqual([...REAPER_STEPS]);
    const order = stepOrder('request-timeout');
    expect(order[0]).toBe('request-timeout');
    expect([...order].sort()).toEqual([...REAPER_STEPS].sort());
    expect(order.at(-1)).toBe('capacity');
  });

  it('starts the next run after the step the time ran out in; the usual order once a run finished', () => {
    const usual = stepOrder(undefined);
    // Cut short in `retire` (index 0): the others go first next time, `retire` last.
    expect(nextFirstStep(usual, 0, true)).toBe('deadlines');
    expect(nextFirstStep(usual, 0, false)).toBeUndefined();
    // Cut short in the last step of a rotated run: the next starts where this one did.
    const rotated = stepOrder('lease-expiry');
    expect(nextFirstStep(rotated, rotated.length - 1, true)).toBe('lease-expiry');
    // Wrapping round to the first step of the usual order is the usual order.
    expect(nextFirstStep(usual, usual.length - 1, true)).toBeUndefined();
  });
});

describe('unconfirmed claims the reaper looks at', () => {
  // The backing node launched for node "n/0" (attempt 1) and one it was merely found on.
  const launched = backing({ id: backingNodeId('meta/main', 'small-node', 'n/0', 1), attempt: 1 });
  const found = backing({ id: 'bn-found', attempt: 1 });
  const claim = { at: T0, by: 'x' };
  const cases: [string, BackingRecord, number, number | undefined, boolean][] = [
    ['found: its delivery may live', found, CLAIM_TAKEOVER_MS - 1, undefined, false],
    ['found: its delivery is known dead', found, CLAIM_TAKEOVER_MS, undefined, true],
    ['launched for it: kept for a redelivery', launched, CLAIM_TAKEOVER_MS, undefined, false],
    ['launched for it: the slot lease passed', launched, SLOT_LEASE_MS, undefined, true],
    ['launched for it: from a process before this one', launched, 0, T0 + 1, true],
    ['found: taken by this process', found, 0, T0, false],
  ];
  it.each(cases)('%s', (_name, b, age, deadBefore, due) => {
    expect(claimDue(b, 'n/0', claim, T0 + age, deadBefore)).toBe(due);
  });
  it('keep a claim a redelivery finds by id until after the redelivery comes', () => {
    expect(SLOT_LEASE_MS).toBeGreaterThan(visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request) * 1000);
  });
});

describe('pool choice', () => {
  const config = parseConfigOrThrow(baseConfig({ maxServers: 2 }), 'c.yaml');
  it('names unknown labels and what is configured', () => {
    expect(eligiblePools(config, ['nope'])).toEqual({
      ok: false,
      reason: 'unknown label "nope" (configured: small-node)',
    });
  });
  it('declines a node set bigger than max-servers', () => {
    expect(eligiblePools(config, ['small-node', 'small-node', 'small-node'])).toEqual({
      ok: false,
      reason: 'a node set of 3 exceeds max-servers of every pool that offers it (largest: 2)',
    });
  });
  it('accepts a node set that fits', () => {
    const choice = eligiblePools(config, ['small-node', 'small-node']);
    expect(choice.ok && choice.pools.map((p) => p.key)).toEqual(['meta/main']);
  });
  it('treats max-servers <= 0 as a disabled pool', () => {
    const off = parseConfigOrThrow(baseConfig({ maxServers: 0 }), 'c.yaml');
    const choice = eligiblePools(off, ['small-node']);
    expect(choice.ok).toBe(false);
    expect(!choice.ok && choice.reason).toMatch(/disabled/);
  });
  it('gives a node set the longest request-timeout of its labels in the pools that offer them all', () => {
    const two = parseConfigOrThrow(
      `${baseConfig()}
      - name: second
        request-timeout: 50
        labels:
          - name: small-node
            backing-label: large-node
            max-parallel-jobs: 2
            grace-time: 60
            request-timeout: 20
          - name: other-node
            backing-label: large-node
            max-parallel-jobs: 2
            grace-time: 60
`,
      'two.yaml',
    );
    expect(requestTimeoutOf(two, ['small-node'])).toBe(10_800); // meta/main's default beats second's 20
    expect(requestTimeoutOf(two, ['small-node', 'other-node'])).toBe(50); // only second offers both
    expect(requestTimeoutOf(two, ['gone-node'])).toBe(10_800); // offered nowhere: the default
    expect(shortestRequestTimeout(two)).toBe(20);
  });
  it('lets pool node-attributes override backing attributes at the top level only', () => {
    expect(nodeAttributes({ a: 1, nested: { x: 1 } }, { nested: { y: 2 }, b: 2 })).toEqual({
      a: 1,
      b: 2,
      nested: { y: 2 },
    });
  });
});

describe('messages and ids', () => {
  it('parses the documented request and release messages', () => {
    expect(
      parseMessage(
        '{"kind":"request","id":"ci-42","labels":["small-node","small-node"],"requestor":"ci-42","priority":100}',
      ).ok,
    ).toBe(true);
    expect(parseMessage('{"kind":"release","nodeId":"ci-42/1"}').ok).toBe(true);
  });
  it.each([
    ['{', /^malformed JSON: /],
    ['[]', /^message must be a JSON object$/],
    ['{"kind":"x"}', /^unknown kind "x" \(expected "request", "release", "cancel" or "renew"\)$/],
    [
      '{"kind":"request","id":"a","labels":[]}',
      /^invalid request message: labels: a request needs at least one label$/,
    ],
    [
      '{"kind":"request","id":"a b","labels":["l"]}',
      /^invalid request message: id: must be 1-128 characters/,
    ],
    ['{"kind":"request","id":"a","labels":["l"],"extra":1}', /^invalid request message: .*extra/],
    ['{"kind":"release"}', /^invalid release message: nodeId: /],
  ])('rejects %s with a reason', (body, reason) => {
    const parsed = parseMessage(body);
    expect(parsed.ok).toBe(false);
    expect(!parsed.ok && parsed.reason).toMatch(reason);
  });
  it('keeps the request id of an invalid request so the failure can be recorded', () => {
    const parsed = parseMessage('{"kind":"request","id":"r1","labels":"x"}');
    expect(!parsed.ok && parsed.requestId).toBe('r1');
  });
  it('round-trips node ids and derives stable backing ids', () => {
    expect(parseNodeId(nodeId('ci-42', 3))).toEqual({ requestId: 'ci-42', index: 3 });
    expect(parseNodeId('no-slash')).toBeUndefined();
    expect(parseNodeId('a/b')).toBeUndefined();
    expect(backingNodeId('p', 'l', 'n/0', 1)).toBe(backingNodeId('p', 'l', 'n/0', 1));
    expect(backingNodeId('p', 'l', 'n/0', 1)).not.toBe(backingNodeId('p', 'l', 'n/0', 2));
  });
});

describe('launch and boot deadlines', () => {
  const timeouts = { launchTimeout: 600, bootTimeout: 120 };
  const cases: Array<[string, Partial<BackingRecord>, number, string | undefined]> = [
    ['launching within launch-timeout', { state: 'launching' }, 599_999, undefined],
    ['launching past launch-timeout', { state: 'launching' }, 600_000, 'launch-timeout of 600s exceeded'],
    [
      'running, port silent within boot-timeout',
      { state: 'launching', runningAt: T0 + 10_000 },
      129_999,
      undefined,
    ],
    [
      'running, port silent past boot-timeout',
      { state: 'launching', runningAt: T0 + 10_000 },
      130_000,
      'boot-timeout of 120s exceeded: its port did not answer',
    ],
    ['ready long ago', { state: 'ready' }, 10_000_000, undefined],
  ];
  it.each(cases)('%s', (_name, b, elapsed, reason) => {
    const d = deadlineDecision(backing(b), timeouts, T0 + elapsed);
    expect(d.fail ? d.reason : undefined).toBe(reason);
  });
});

describe("an eventually consistent provider's not-found", () => {
  it('is believed only once the resource id has been recorded for the grace', () => {
    const b = backing({ state: 'launching', launchedAt: T0 - 3_600_000, resourceRecordedAt: T0 });
    expect(notFoundIsFinal(b, T0 + RESOURCE_NOT_FOUND_GRACE_MS - 1)).toBe(false);
    expect(notFoundIsFinal(b, T0 + RESOURCE_NOT_FOUND_GRACE_MS)).toBe(true);
  });

  it('counts from the launch for a record written before the recording time was kept', () => {
    const b = backing({ state: 'launching', resourceId: 'i-0123456789abcdef0' });
    expect(notFoundIsFinal(b, T0 + RESOURCE_NOT_FOUND_GRACE_MS - 1)).toBe(false);
    expect(notFoundIsFinal(b, T0 + RESOURCE_NOT_FOUND_GRACE_MS)).toBe(true);
  });
});

describe('the whole state table', () => {
  // Every (from, to) pair of every kind, so a change to the table is a deliberate change to this list.
  const allowed = {
    backing:
      'launching>ready launching>retiring launching>failed ready>retiring ready>failed retiring>stopped failed>stopped',
    node: 'requested>pending requested>ready requested>failed requested>released pending>ready pending>failed pending>released ready>released ready>failed',
    request: 'requested>pending requested>fulfilled requested>failed pending>fulfilled pending>failed',
  } as const;
  const states = {
    backing: ['launching', 'ready', 'retiring', 'stopped', 'failed'],
    node: ['requested', 'pending', 'ready', 'released', 'failed'],
    request: ['requested', 'pending', 'fulfilled', 'failed'],
  } as const;
  for (const kind of ['backing', 'node', 'request'] as const) {
    it(`allows exactly the listed ${kind} transitions`, () => {
      const expected = new Set(allowed[kind].split(' '));
      for (const from of states[kind]) {
        for (const to of states[kind]) {
          expect(canTransition(kind, from as never, to as never), `${from}>${to}`).toBe(
            expected.has(`${from}>${to}`),
          );
        }
      }
    });
  }
});
