import { describe, expect, it } from 'vitest';
import { ManualClock } from '../../shared/core/clock.ts';
import {
  CLAIM_TAKEOVER_MS,
  DELIVERY_DEADLINE_MS,
  deadlineOf,
  FUNCTION_TIMEOUT_SECONDS,
  INVOCATION_SAFETY_MARGIN_MS,
  invocationFor,
  MIN_CHECK_MS,
  ORPHAN_GRACE_MS,
  PORT_PROBE_TIMEOUT_MS,
  RESOURCE_NOT_FOUND_GRACE_MS,
  SLOT_LEASE_MS,
  visibilityTimeoutSeconds,
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
