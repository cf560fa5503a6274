import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../shared/core/clock.ts';
import {
  BOOT_RETRY_SECONDS,
  backstopReceiveCount,
  bootRetrySeconds,
  CLAIM_TAKEOVER_MS,
  DELIVERY_DEADLINE_MS,
  deadlineOf,
  EMBEDDED_VISIBILITY_SECONDS,
  FUNCTION_TIMEOUT_SECONDS,
  INVOCATION_SAFETY_MARGIN_MS,
  invocationFor,
  MIN_CHECK_MS,
  ORPHAN_GRACE_MS,
  PORT_PROBE_TIMEOUT_MS,
  RESOURCE_NOT_FOUND_GRACE_MS,
  RUNNING_CHECKS_MS,
  SLOT_LEASE_MS,
  visibilityTimeoutSeconds,
  WAITING_BACKOFF_CAP_SECONDS,
  WAITING_BUDGET_SECONDS,
  waitingVisibilitySeconds,
} from '../../shared/core/timing.ts';

/** The ordering the claim protocol's safety rests on (shared/core/timing.ts says why each holds). */
describe('timing contract', () => {
  const requestTimeoutMs = FUNCTION_TIMEOUT_SECONDS.request * 1000;

  it('a delivery stops before its function would be killed', () => {
    expect(DELIVERY_DEADLINE_MS).toBeLessThanOrEqual(requestTimeoutMs);
    for (const seconds of Object.values(FUNCTION_TIMEOUT_SECONDS)) {
      expect(INVOCATION_SAFETY_MARGIN_MS).toBeLessThan((seconds * 1000) / 2);
    }
  });

  it('a claim is taken over only from a delivery Lambda has already killed', () => {
    expect(CLAIM_TAKEOVER_MS).toBeGreaterThan(requestTimeoutMs);
  });

  it('a message comes back only when its takeover is allowed, and only after its delivery is dead', () => {
    for (const name of ['request', 'fulfil'] as const) {
      const visibilityMs = visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS[name]) * 1000;
      expect(visibilityMs).toBeGreaterThan(FUNCTION_TIMEOUT_SECONDS[name] * 1000);
    }
    expect(CLAIM_TAKEOVER_MS).toBeLessThanOrEqual(
      visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request) * 1000,
    );
  });

  it('the reaper gives a claim back only after any delivery that took it is dead', () => {
    expect(SLOT_LEASE_MS).toBeGreaterThan(CLAIM_TAKEOVER_MS);
    expect(ORPHAN_GRACE_MS).toBeGreaterThan(requestTimeoutMs);
  });

  it('leaves a record started at the beginning of any invocation time for a check, after the margin', () => {
    for (const seconds of Object.values(FUNCTION_TIMEOUT_SECONDS)) {
      expect(INVOCATION_SAFETY_MARGIN_MS + MIN_CHECK_MS).toBeLessThan(seconds * 1000);
    }
    // A check cut short by the deadline still waits at least as long as one port probe.
    expect(MIN_CHECK_MS).toBeGreaterThanOrEqual(PORT_PROBE_TIMEOUT_MS);
  });

  it("believes EC2's not-found only minutes after the id was recorded, never within the run that recorded it", () => {
    expect(RESOURCE_NOT_FOUND_GRACE_MS).toBeGreaterThanOrEqual(2 * 60_000);
    expect(RESOURCE_NOT_FOUND_GRACE_MS).toBeGreaterThan(FUNCTION_TIMEOUT_SECONDS.reaper * 1000);
  });
});

describe('invocation deadlines', () => {
  it("keep the safety margin of Lambda's remaining time", () => {
    let remaining = 30_000;
    const deadline = deadlineOf({ getRemainingTimeInMillis: () => remaining });
    expect(deadline.remainingMs()).toBe(30_000 - INVOCATION_SAFETY_MARGIN_MS);
    remaining = INVOCATION_SAFETY_MARGIN_MS;
    expect(deadline.remainingMs()).toBe(0);
  });

  it('stand in for a missing Lambda context with a budget counted on the given clock', () => {
    const clock = new ManualClock(1_000);
    const deadline = deadlineOf(invocationFor(clock, DELIVERY_DEADLINE_MS));
    expect(deadline.remainingMs()).toBe(DELIVERY_DEADLINE_MS - INVOCATION_SAFETY_MARGIN_MS);
    clock.advance(DELIVERY_DEADLINE_MS - INVOCATION_SAFETY_MARGIN_MS);
    expect(deadline.remainingMs()).toBe(0);
  });
});

/** A waiting request's back-off and budget (issue 25, defect 2). */
describe('waiting', () => {
  const base = EMBEDDED_VISIBILITY_SECONDS;
  const budgetMs = WAITING_BUDGET_SECONDS.embedded * 1000;

  it('keeps a waiting message away twice its wait, from the visibility timeout up to the cap', () => {
    const awayFor = (waitedMs: number) => waitingVisibilitySeconds({ waitedMs, budgetMs, baseSeconds: base });
    expect(awayFor(0)).toBe(base);
    expect(awayFor(500)).toBe(base);
    expect(awayFor(3_000)).toBe(6);
    expect(awayFor(14_200)).toBe(29);
    expect(awayFor(40_000)).toBe(WAITING_BACKOFF_CAP_SECONDS);
    // A queue whose own timeout is above the cap (the AWS stack's 180 s) keeps it.
    expect(waitingVisibilitySeconds({ waitedMs: 600_000, budgetMs: 9e6, baseSeconds: 180 })).toBe(180);
  });

  it('never keeps it past the end of its budget, so the receive that ends it comes on time', () => {
    expect(waitingVisibilitySeconds({ waitedMs: budgetMs - 7_500, budgetMs, baseSeconds: base })).toBe(8);
    expect(waitingVisibilitySeconds({ waitedMs: budgetMs - 100, budgetMs, baseSeconds: base })).toBe(1);
    expect(waitingVisibilitySeconds({ waitedMs: 8_990_000, budgetMs: 9e6, baseSeconds: 180 })).toBe(10);
  });

  it('sizes maxReceiveCount so that it cannot end a request before its budget, even without back-off', () => {
    for (const [budget, visibility] of [
      [WAITING_BUDGET_SECONDS.embedded, EMBEDDED_VISIBILITY_SECONDS],
      [WAITING_BUDGET_SECONDS.aws, visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request)],
      [20, 2],
    ] as const) {
      const n = backstopReceiveCount(budget, visibility);
      // Receive n comes at least (n - 1) visibility timeouts after the first one.
      expect((n - 1) * visibility).toBeGreaterThan(budget);
    }
    expect(backstopReceiveCount(WAITING_BUDGET_SECONDS.aws, 180)).toBe(52);
  });
});

/** How soon a running backing node that is not ready yet is checked again (issue 40, defect 2). */
describe('boot retries', () => {
  const bootTimeoutMs = 120_000;
  const next = (waitedMs: number) => bootRetrySeconds({ waitedMs, bootTimeoutMs });

  it('waits as long as the node has waited so far, from 2 s up to 10 s', () => {
    expect([0, 2_000, 4_000, 8_000, 16_000, 60_000].map(next)).toEqual([2, 2, 4, 8, 10, 10]);
    expect(next(2_500)).toBe(3); // whole seconds, rounded up
    expect(BOOT_RETRY_SECONDS.cap).toBeLessThan(visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.fulfil));
  });

  it('never waits past boot-timeout, so the try that fails the node comes when it passes', () => {
    expect(next(116_000)).toBe(4);
    expect(next(119_500)).toBe(1);
    expect(next(120_000)).toBe(1);
    expect(bootRetrySeconds({ waitedMs: 0, bootTimeoutMs: 1_000 })).toBe(1);
  });

  it("tries a default boot-timeout's worth in a bounded number of tries", () => {
    let waited = 0;
    let tries = 0;
    while (waited < bootTimeoutMs) {
      waited += next(waited) * 1000;
      tries++;
    }
    expect(waited).toBe(bootTimeoutMs);
    expect(tries).toBe(15);
  });

  it("leaves most of the reaper's run to its other steps", () => {
    expect(RUNNING_CHECKS_MS).toBeLessThanOrEqual((FUNCTION_TIMEOUT_SECONDS.reaper * 1000) / 4);
  });
});
