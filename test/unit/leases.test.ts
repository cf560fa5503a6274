import { describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import {
  checkLeaseSeconds,
  lapseDecision,
  leaseLimitsOf,
  leaseOfRequest,
  renewDecision,
} from '../../shared/core/leases.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';

/** Lease arithmetic and the reaper's lease decision: pure functions of a record and a clock. */
const T = Date.parse('2026-01-01T00:00:00Z');
const request = (o: Partial<RequestRecord> = {}): RequestRecord => ({
  id: 'r',
  labels: ['small-node'],
  bodyHash: 'h',
  state: 'fulfilled',
  createdAt: T,
  updatedAt: T,
  version: 3,
  nodes: [{ id: 'r/0', label: 'small-node', state: 'ready' }],
  lease: 60,
  leaseExpiresAt: T + 60_000,
  ...o,
});

describe('lease lengths', () => {
  it.each([0, -5, 9, 10.5, 604_801, Number.NaN, '60', null])('refuses %s', (v) => {
    expect(checkLeaseSeconds(v).ok).toBe(false);
  });
  it('takes the asked lease within max, else the default, else the max, else none', () => {
    expect(leaseOfRequest(120, { max: 600 })).toEqual({ ok: true, seconds: 120 });
    expect(leaseOfRequest(900, { max: 600 })).toEqual({
      ok: false,
      reason: 'lease 900 s is above the maximum of 600 s (max-lease)',
    });
    expect(leaseOfRequest(undefined, { default: 300, max: 600 })).toEqual({ ok: true, seconds: 300 });
    expect(leaseOfRequest(undefined, { max: 600 })).toEqual({ ok: true, seconds: 600 });
    expect(leaseOfRequest(undefined, {})).toEqual({ ok: true });
  });
  it('resolves default-lease and max-lease label over pool over provider, strictest over labels', () => {
    const config = parseConfigOrThrow(
      poolConfig({
        meta: {
          provider: { 'default-lease': 100, 'max-lease': 1000 },
          pool: { 'max-lease': 500 },
          labels: [smallNode(), smallNode({ name: 'tiny', 'max-lease': 200 })],
        },
      }),
      'test.yaml',
    );
    expect(leaseLimitsOf(config, ['small-node'])).toEqual({ default: 100, max: 500 });
    expect(leaseLimitsOf(config, ['small-node', 'tiny'])).toEqual({ default: 100, max: 200 });
    expect(leaseLimitsOf(config, ['nobody'])).toEqual({});
  });
  it('refuses a default-lease above the max-lease it inherits, at its YAML path', () => {
    expect(() =>
      parseConfigOrThrow(
        poolConfig({ meta: { pool: { 'default-lease': 900 }, provider: { 'max-lease': 600 } } }),
        'test.yaml',
      ),
    ).toThrow(
      'providers[1].pools[0].default-lease: default-lease: must be <= max-lease (600, at providers[1].max-lease), got 900',
    );
  });
});

describe('renewDecision', () => {
  it('renews from now by the request own length or a new one within max', () => {
    expect(renewDecision('r', request(), T + 30_000, undefined, {})).toEqual({
      kind: 'renew',
      seconds: 60,
      expiresAt: T + 90_000,
    });
    expect(renewDecision('r', request(), T + 30_000, 300, { max: 600 })).toMatchObject({
      expiresAt: T + 330_000,
    });
    expect(renewDecision('r', request(), T, 900, { max: 600 }).kind).toBe('refuse');
  });
  it.each<[string, RequestRecord | undefined, RegExp]>([
    ['unknown', undefined, /unknown request "r"/],
    ['failed', request({ state: 'failed', reason: 'no capacity' }), /has ended \(failed: no capacity\)/],
    [
      'all released',
      request({ nodes: [{ id: 'r/0', label: 'x', state: 'released' }] }),
      /its nodes were released/,
    ],
    ['without a lease', request({ lease: undefined, leaseExpiresAt: undefined }), /has no lease/],
    ['lapsed', request({ leaseExpiresAt: T }), /lease expired/],
    ['marked lapsed', request({ leaseLapsedAt: T - 1 }), /lease expired/],
  ])('refuses a request %s', (_, r, reason) => {
    const d = renewDecision('r', r, T, undefined, {});
    expect(d.kind).toBe('refuse');
    expect(d.kind === 'refuse' && d.reason).toMatch(reason);
  });
});

describe('lapseDecision', () => {
  it.each<[string, Partial<RequestRecord>, number, string]>([
    ['keeps a lease not lapsed yet (the index lagged a renewal)', {}, T + 59_999, 'keep'],
    ['releases a lapsed lease', {}, T + 60_000, 'release'],
    ['releases a waiting request whose lease lapsed', { state: 'requested' }, T + 60_000, 'release'],
    ['finishes a lease marked lapsed even if renewed in the record', { leaseLapsedAt: T }, T, 'release'],
    [
      'drops a request that holds nothing',
      { nodes: [{ id: 'r/0', label: 'x', state: 'released' }] },
      T + 60_000,
      'drop',
    ],
    ['drops a failed request', { state: 'failed' }, T + 60_000, 'drop'],
  ])('%s', (_, o, now, kind) => {
    expect(lapseDecision(request(o), now).kind).toBe(kind);
  });
});
