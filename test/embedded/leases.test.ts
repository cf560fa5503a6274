import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { LEASE_EXPIRED_REASON } from '../../shared/core/leases.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { PageCursor, PoolStore } from '../../shared/core/poolStore.ts';
import { RENEW_RETRY_SECONDS } from '../../shared/core/timing.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { holdNode } from '../../shared/usecases/reap/operator.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * Client leases and the release of a whole request (issue 23, parts 5 and 6), on dynalite + fauxqs +
 * local backing processes: the reaper's lease step, renewals (by message), their race with the reaper,
 * and `{"kind":"release","id":...}` with a held node kept, then forced.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const config = poolConfig({
  meta: { pool: { 'max-servers': 8, 'max-lease': 3600 }, labels: [smallNode({ 'max-parallel-jobs': 4 })] },
});
const deliver = async (harness: Harness, body: unknown) =>
  (await harness.pool.handlers.request(sqsEvent([JSON.stringify(body)]))).batchItemFailures;

async function fulfilled(
  harness: Harness,
  id: string,
  labels = ['small-node'],
  lease?: number,
): Promise<void> {
  expect(await deliver(harness, { kind: 'request', id, labels, ...(lease ? { lease } : {}) })).toEqual([]);
  await harness.fulfilUntil(
    async () => (await harness.pool.context.store.getRequest(id))?.state === 'fulfilled',
  );
}

describe('leases', () => {
  it('the reaper releases a request whose lease lapsed, keeps a renewed one, and refuses to revive it', async () => {
    h = await startHarness(config);
    const store = h.pool.context.store;
    await fulfilled(h, 'lapses', ['small-node'], 60);
    await fulfilled(h, 'renewed', ['small-node'], 60);
    await fulfilled(h, 'unleased');
    expect((await store.getRequest('lapses'))?.lease).toBe(60);
    // No lease asked, none by default: a pool with max-lease holds nothing without one, so it takes the max.
    expect((await store.getRequest('unleased'))?.lease).toBe(3600);

    h.clock.advance(50_000);
    expect(await deliver(h, { kind: 'renew', id: 'renewed' })).toEqual([]);
    h.clock.advance(20_000); // 'lapses' is 10 s past its lease; 'renewed' has 40 s left
    const report = await h.pool.reapNow();
    expect(report.leasesExpired).toEqual(['lapses']);

    const lapsed = await store.getRequest('lapses');
    expect(lapsed?.nodes.map((n) => [n.state, n.reason])).toEqual([['released', LEASE_EXPIRED_REASON]]);
    expect((await store.getRequest('renewed'))?.nodes.map((n) => n.state)).toEqual(['ready']);
    expect((await store.getRequest('unleased'))?.nodes.map((n) => n.state)).toEqual(['ready']);
    // Its slot and place were given back; it left the lease partition.
    expect([...(await store.nodePlaces('meta/main')).keys()].sort()).toEqual(['renewed/0', 'unleased/0']);
    expect((await allLeasesBefore(store, Number.MAX_SAFE_INTEGER)).sort()).toEqual(['renewed', 'unleased']);

    // A renewal of the ended request is refused and revives nothing; nor is an unknown id renewed.
    const { renewLease } = await import('../../shared/usecases/release/leases.ts');
    await expect(renewLease(h.pool.context, 'lapses')).rejects.toThrow(/has ended/);
    await expect(renewLease(h.pool.context, 'nobody')).rejects.toThrow(/unknown request "nobody"/);
    expect(await deliver(h, { kind: 'renew', id: 'lapses' })).toEqual([]); // consumed, not retried
    expect((await store.getRequest('lapses'))?.nodes.map((n) => n.state)).toEqual(['released']);
  });

  it('a renewal racing the reaper wins or loses whole: the lease is renewed or the nodes released, never both', async () => {
    h = await startHarness(config);
    const ctx = h.pool.context;
    await fulfilled(h, 'race', ['small-node'], 30);
    h.clock.advance(29_000);
    const read = (await ctx.store.getRequest('race'))?.leaseExpiresAt as number;
    // The renewal lands between the reaper's read and its conditional mark: the mark loses.
    expect(await ctx.store.renewLease('race', read, 30, h.clock.now() + 30_000, h.clock.now())).toBe(true);
    expect(await ctx.store.lapseLease('race', read, h.clock.now())).toBe(false);
    h.clock.advance(2_000); // past the first expiry, within the renewed one
    expect((await h.pool.reapNow()).leasesExpired).toEqual([]);
    expect((await ctx.store.getRequest('race'))?.nodes[0]?.state).toBe('ready');

    // The other order: the reaper marks it first; a renewal of the expiry it read then loses.
    h.clock.advance(40_000);
    const later = (await ctx.store.getRequest('race'))?.leaseExpiresAt as number;
    expect(await ctx.store.lapseLease('race', later, h.clock.now())).toBe(true);
    expect(await ctx.store.renewLease('race', later, 30, h.clock.now() + 30_000, h.clock.now())).toBe(false);
    expect((await h.pool.reapNow()).leasesExpired).toEqual(['race']); // a marked lease is finished
    expect((await ctx.store.getRequest('race'))?.nodes[0]?.state).toBe('released');
  });

  it('refuses a lease above max-lease, alone in its batch, with the reason recorded', async () => {
    h = await startHarness(config);
    const out = await h.pool.handlers.request(
      sqsEvent([
        JSON.stringify({ kind: 'request', id: 'too-long', labels: ['small-node'], lease: 7200 }),
        JSON.stringify({ kind: 'request', id: 'fine', labels: ['small-node'], lease: 600 }),
      ]),
    );
    expect(out.batchItemFailures).toEqual([]);
    const store = h.pool.context.store;
    expect(await store.getRequest('too-long')).toMatchObject({
      state: 'failed',
      reason: 'lease 7200 s is above the maximum of 3600 s (max-lease)',
    });
    expect((await store.getRequest('fine'))?.state).not.toBe('failed');
  });

  it('releases a whole request in one message, keeps a held node, then forces it; idempotent', async () => {
    h = await startHarness(config);
    const ctx = h.pool.context;
    await fulfilled(h, 'whole', ['small-node', 'small-node', 'small-node']);
    await holdNode(ctx, 'whole/1');
    expect(await deliver(h, { kind: 'release', id: 'whole' })).toEqual([]);
    expect((await ctx.store.getRequest('whole'))?.nodes.map((n) => n.state)).toEqual([
      'released',
      'ready',
      'released',
    ]);
    expect(await deliver(h, { kind: 'release', id: 'whole' })).toEqual([]); // again: nothing changes
    expect([...(await ctx.store.nodePlaces('meta/main')).keys()]).toEqual(['whole/1']);
    expect(await deliver(h, { kind: 'release', id: 'whole', force: true })).toEqual([]);
    expect((await ctx.store.getRequest('whole'))?.nodes.map((n) => n.state)).toEqual([
      'released',
      'released',
      'released',
    ]);
    expect((await ctx.store.nodePlaces('meta/main')).size).toBe(0);
  });
});

/** Every leased request lapsing before `before`, over every page (the lease partitions one by one). */
async function allLeasesBefore(store: PoolStore, before: number): Promise<string[]> {
  const ids: string[] = [];
  let cursor: PageCursor | undefined;
  do {
    const page = await store.leasesBefore(before, cursor);
    ids.push(...page.items.map((r) => r.id));
    cursor = page.cursor;
  } while (cursor);
  return ids;
}

describe('a lease renewal that fails (issue 40, defect 1)', () => {
  it('comes back within RENEW_RETRY_SECONDS, not at the queue visibility timeout', async () => {
    h = await startHarness(config, { maxReceiveCount: 5 });
    await fulfilled(h, 'kept', ['small-node'], 60);
    const ctx = h.pool.context;
    let throttled = 1;
    const store = new Proxy(ctx.store, {
      get(target, prop) {
        const value = Reflect.get(target, prop, target) as unknown;
        if (prop !== 'renewLease' || typeof value !== 'function') return value;
        return async (...args: unknown[]) => {
          if (throttled-- > 0) {
            throw Object.assign(new Error('Rate exceeded'), {
              name: 'ProvisionedThroughputExceededException',
            });
          }
          return (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        };
      },
    });
    const comeBack: number[] = [];
    const handle = makeRequestHandler(
      { ...ctx, store },
      { retrySoon: async (_record, seconds) => void comeBack.push(seconds) },
    );
    const body = JSON.stringify({ kind: 'renew', id: 'kept' });
    expect((await handle(sqsEvent([body], 1))).batchItemFailures).toHaveLength(1);
    expect(comeBack).toEqual([RENEW_RETRY_SECONDS]);
    expect(RENEW_RETRY_SECONDS * 3).toBeLessThan(60 / 3); // three tries before a lease renewed at a third lapses
    // Its retry renews it.
    const before = (await ctx.store.getRequest('kept'))?.leaseExpiresAt as number;
    h.clock.advance(1_000);
    expect((await handle(sqsEvent([body], 2))).batchItemFailures).toEqual([]);
    expect((await ctx.store.getRequest('kept'))?.leaseExpiresAt).toBeGreaterThan(before);
  });
});

describe('a release by a lapsed lease (issue 41, defect 10)', () => {
  it("prompts the reaper as a release message does: the backing node goes after grace-time, not the reaper's next interval", async () => {
    // The pool as `metastatic dev` runs it (queue pollers and the reaper's schedule on), with a reaper
    // interval of an hour and a manual clock: the lease lapses and grace-time passes without waiting.
    const stateDir = await mkdtemp(join(tmpdir(), 'metastatic-lapse-'));
    const clock = new ManualClock(Date.now());
    const pool = await EmbeddedPool.start({
      config: parseConfigOrThrow(
        poolConfig({ meta: { labels: [smallNode({ 'max-parallel-jobs': 2, 'grace-time': 1 })] } }),
        'lapse.yaml',
      ),
      stateDir,
      reaperInterval: 3600,
      log: silentLog,
      clock,
      inMemory: true,
    });
    try {
      const store = pool.context.store;
      const body = JSON.stringify({ kind: 'request', id: 'lapsing', labels: ['small-node'], lease: 10 });
      expect((await pool.handlers.request(sqsEvent([body]))).batchItemFailures).toEqual([]);
      const fulfilled = await until(async () => (await store.getRequest('lapsing'))?.state === 'fulfilled');
      expect(fulfilled).toBe(true);
      const backingId = (await store.getRequest('lapsing'))?.nodes[0]?.backingNodeId as string;

      clock.advance(11_000); // 1 s past the lease
      expect((await pool.reapNow()).leasesExpired).toEqual(['lapsing']);
      clock.advance(1_500); // past grace-time: the run the release prompted retires it
      const started = Date.now();
      const stopped = await until(
        async () => (await store.getBacking(backingId))?.state === 'stopped',
        8_000,
      );
      expect({ stopped, reason: (await store.getBacking(backingId))?.reason }).toMatchObject({
        stopped: true,
        reason: expect.stringMatching(/^empty for \d/),
      });
      expect(Date.now() - started).toBeLessThan(8_000); // the interval is an hour
    } finally {
      await pool.stop();
      await rm(stateDir, { recursive: true, force: true });
    }
  }, 30_000);
});

/** Polls `check` every 50 ms until it holds (true) or `timeoutMs` of real time passed (false). */
async function until(check: () => Promise<boolean>, timeoutMs = 20_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return true;
}
