import { describe, expect, it } from 'vitest';
import {
  CLAIM_TAKEOVER_MS,
  DELIVERY_DEADLINE_MS,
  FUNCTION_TIMEOUT_SECONDS,
  INVOCATION_SAFETY_MARGIN_MS,
  ORPHAN_GRACE_MS,
  SLOT_LEASE_MS,
  visibilityTimeoutSeconds,
} from '../shared/core/timing.ts';

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
});
