import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ManualClock } from '../../shared/core/clock.ts';
import { REQUESTOR_ESTIMATE_TTL_MS } from '../../shared/core/estimates.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { NodeRecord, RequestRecord } from '../../shared/core/records.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import {
  cachedEstimates,
  ESTIMATE_WRITE_INTERVAL_MS,
  learnDuration,
  learnedDuration,
} from '../../shared/usecases/ready/estimates.ts';
import { releaseNode } from '../../shared/usecases/release/release.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { countedWrites } from '../../testkit/countedWrites.ts';
import { type Harness, startHarness } from '../../testkit/harness.ts';
import { type InProcessDynalite, startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';

/**
 * Duration-aware placement (issue 15, part 2 with hints given): a request's `expected-duration` puts
 * its node on the backing node whose nodes are expected to end closest to when it does, so backing
 * nodes empty together. On dynalite + fauxqs + local processes.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function place(harness: Harness, id: string, seconds?: number, requestor?: string): Promise<string> {
  await harness.send({
    kind: 'request',
    id,
    labels: ['small-node'],
    ...(seconds === undefined ? {} : { 'expected-duration': seconds }),
    ...(requestor === undefined ? {} : { requestor }),
  });
  await harness.drainRequests();
  await harness.fulfilUntil(
    async () => (await harness.pool.context.store.getRequest(id))?.state === 'fulfilled',
  );
  return (await harness.pool.context.store.getRequest(id))?.nodes[0]?.backingNodeId as string;
}

describe('duration-aware placement', () => {
  it('puts a short job beside short jobs, not on the older backing node held by a long one', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    const ctx = h.pool.context;
    const longs = await place(h, 'long-1', 3600);
    expect(await place(h, 'long-2', 3600)).toBe(longs); // the same expected end: together
    h.clock.advance(1_000); // longs is the older
    const shorts = await place(h, 'short-1', 60); // longs is full: a second backing node
    expect(shorts).not.toBe(longs);
    await releaseNode(ctx, 'long-2/0');
    // Both have one free slot; without a hint the older (longs) would take the next node.
    expect(await place(h, 'short-2', 60)).toBe(shorts);
    const recorded = await ctx.store.getBacking(shorts);
    expect(Object.keys(recorded?.ends ?? {}).sort()).toEqual(['0', '1']);
    await releaseNode(ctx, 'short-2/0');
    expect(await place(h, 'plain')).toBe(longs); // no hint: fullest first, then the oldest
    // learned-durations is off by default: nothing was learned from the releases.
    expect(await ctx.store.getEstimate('small-node')).toBeUndefined();
  });

  it('learns how long each requestor keeps its nodes and places a request without a hint by it', async () => {
    h = await startHarness(`learned-durations: true\n${baseConfig({ slots: 2 })}`);
    const ctx = h.pool.context;
    // Three nodes each: `quick` keeps its nodes a minute, `slow` an hour.
    for (const [requestor, seconds] of [
      ['quick', 60],
      ['slow', 3600],
    ] as const) {
      for (let i = 0; i < 3; i++) {
        await place(h, `${requestor}-teach-${i}`, undefined, requestor);
        h.clock.advance(seconds * 1000);
        await releaseNode(ctx, `${requestor}-teach-${i}/0`);
      }
    }
    const quick = await ctx.store.getEstimate('small-node', 'quick');
    expect(quick?.samples).toBe(3);
    expect(Math.exp(quick?.logSeconds ?? 0)).toBeCloseTo(60, 6);
    expect((await ctx.store.getEstimate('small-node'))?.samples).toBe(6);
    h.clock.advance(120_000); // past the estimate cache: the next placements read what was learned

    // As the hinted test above, with no hint: slow nodes fill the older backing node, a quick one the next.
    const slows = await place(h, 'slow-1', undefined, 'slow');
    expect(await place(h, 'slow-2', undefined, 'slow')).toBe(slows);
    h.clock.advance(1_000);
    const quicks = await place(h, 'quick-1', undefined, 'quick');
    expect(quicks).not.toBe(slows);
    await releaseNode(ctx, 'slow-2/0');
    // One free slot on each: by age alone the older (slows) would take it; by what was learned, quicks.
    expect(await place(h, 'quick-2', undefined, 'quick')).toBe(quicks);
  });

  it('learns every duration of concurrent releases: the first at once, the others with the next write', async () => {
    h = await startHarness(`learned-durations: true\n${baseConfig({ slots: 3 })}`);
    const ctx = h.pool.context;
    for (const id of ['a', 'b', 'c']) await place(h, id);
    h.clock.advance(600_000);
    await Promise.all(['a/0', 'b/0', 'c/0'].map((id) => releaseNode(ctx, id)));
    expect(await ctx.store.getEstimate('small-node')).toMatchObject({ samples: 1, version: 1 });
    await place(h, 'd');
    h.clock.advance(ESTIMATE_WRITE_INTERVAL_MS);
    await releaseNode(ctx, 'd/0');
    expect(await ctx.store.getEstimate('small-node')).toMatchObject({ samples: 4, version: 2 });
  });

  it('refuses an expected duration that is not from 1 second to a week', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    for (const [id, value] of [
      ['zero', 0],
      ['ms', 9_000_000],
      ['text', '60'],
    ] as const) {
      await h.send({ kind: 'request', id, labels: ['small-node'], 'expected-duration': value });
    }
    await h.drainRequests();
    const reasons = await Promise.all(
      ['zero', 'ms', 'text'].map(async (id) => (await h?.pool.context.store.getRequest(id))?.reason),
    );
    expect(reasons).toEqual([
      expect.stringContaining('expected-duration: must be at least 1 second'),
      expect.stringContaining('expected-duration: must be at most 604800 seconds (7 days)'),
      expect.stringContaining('expected-duration: must be a number, not a string'),
    ]);
  });
});

describe('learned estimates in the table, written by several function instances (issue 24, defect 8)', () => {
  let engine: InProcessDynalite;
  let tables = 0;
  let requests = 0;
  beforeAll(async () => {
    engine = await startInProcessDynalite();
  });
  afterAll(async () => {
    await engine.close();
  });

  async function newTable(): Promise<{ tableName: string; clock: ManualClock }> {
    const tableName = `estimates-${++tables}`;
    await ensureTable(engine.client, tableName);
    return { tableName, clock: new ManualClock(Date.parse('2026-06-01T00:00:00Z')) };
  }

  /** A function instance: its own store (so its own estimate cache) on the shared table, its writes counted. */
  function instance(table: { tableName: string; clock: ManualClock }) {
    const store = new DynamoStore(engine.client, table.tableName, table.clock);
    const { store: counted, writes } = countedWrites(store, 'putEstimate');
    const ctx = {
      store: counted,
      clock: table.clock,
      log: silentLog,
      learnedDurations: true,
    } as unknown as Context;
    return { ctx, store, writes };
  }

  /** A node of label `small` kept `seconds`, released now. */
  const release = (ctx: Context, seconds: number, requestor?: string) =>
    learnDuration(
      ctx,
      { id: `r-${++requests}`, ...(requestor === undefined ? {} : { requestor }) } as RequestRecord,
      {
        label: 'small',
        readyAt: ctx.clock.now() - seconds * 1000,
        releasedAt: ctx.clock.now(),
      } as NodeRecord,
    );

  it('writes each estimate from the version it read, at most once per instance and interval, and learns every duration', async () => {
    const table = await newTable();
    const a = instance(table);
    const b = instance(table);
    await release(a.ctx, 60, 'ci');
    await release(b.ctx, 60, 'ci'); // b writes after a: a's cached copy is stale now
    table.clock.advance(1_000);
    // a's next releases within the interval: none is written from a's stale copy, and none is lost.
    for (let i = 0; i < 20; i++) await release(a.ctx, 60, 'ci');
    expect(a.writes).toEqual({ done: 2, refused: 0 }); // its first: the label's and ci's
    table.clock.advance(ESTIMATE_WRITE_INTERVAL_MS);
    await release(a.ctx, 60, 'ci'); // the interval is over: one write per estimate, with all 21 durations
    expect(a.writes).toEqual({ done: 4, refused: 0 });
    expect(b.writes).toEqual({ done: 2, refused: 0 });
    for (const requestor of [undefined, 'ci']) {
      expect(await a.store.getEstimate('small', requestor)).toMatchObject({ samples: 23, version: 3 });
    }
  });

  it("gives a requestor's estimate an expiry that each write renews, and takes an expired one for none", async () => {
    const table = await newTable();
    const { ctx, store } = instance(table);
    for (const [requestor, seconds] of [
      ['once', 60],
      ['once', 60],
      ['once', 60],
      ['other', 3_600],
      ['other', 3_600],
      ['other', 3_600],
    ] as const) {
      await release(ctx, seconds, requestor);
      table.clock.advance(ESTIMATE_WRITE_INTERVAL_MS);
    }
    const own = await store.getEstimate('small', 'once');
    // In epoch seconds, for DynamoDB's TTL (which deletes within days of it: readers check it themselves).
    expect(own?.expiresAt).toBe(Math.ceil((own?.updatedAt ?? 0) / 1000 + REQUESTOR_ESTIMATE_TTL_MS / 1000));
    expect((await store.getEstimate('small'))?.expiresAt).toBeUndefined(); // one per label: kept
    expect((await learnedDuration(ctx, 'small', 'once'))?.seconds).toBeCloseTo(60, 6);
    table.clock.advance(REQUESTOR_ESTIMATE_TTL_MS);
    // Expired but not deleted yet: the label's estimate (once's and other's shares, pooled) is used, and a
    // new duration starts afresh.
    expect((await learnedDuration(ctx, 'small', 'once'))?.seconds).toBeGreaterThan(60);
    await release(ctx, 120, 'once');
    expect(await store.getEstimate('small', 'once')).toMatchObject({ samples: 1, version: 4 });
  });

  it('keeps a bounded number of estimates in memory, whatever the number of requestors', async () => {
    const table = await newTable();
    const { ctx, store } = instance(table);
    for (let i = 0; i < 1_100; i++) await learnedDuration(ctx, 'small', `job-${i}`);
    expect(cachedEstimates(store)).toBeLessThanOrEqual(1_000);
  });

  describe("one requestor's influence on the label's estimate (issue 25, defect 4)", () => {
    /** `n` releases of `seconds` by `requestor`, each written (a quiet interval between them). */
    async function teach(
      table: { clock: ManualClock },
      ctx: Context,
      n: number,
      seconds: number,
      requestor?: string,
    ) {
      for (let i = 0; i < n; i++) {
        await release(ctx, seconds, requestor);
        table.clock.advance(ESTIMATE_WRITE_INTERVAL_MS);
      }
    }

    it('gives a label no estimate from 12 fast releases by one requestor, but that requestor its own', async () => {
      const table = await newTable();
      const { ctx } = instance(table);
      await teach(table, ctx, 12, 1, 'ci');
      // Another requestor, or a request naming none: nothing learned that is theirs, so no estimate.
      expect(await learnedDuration(ctx, 'small', 'release')).toBeUndefined();
      expect(await learnedDuration(ctx, 'small', undefined)).toBeUndefined();
      // ci's own requests are placed by what ci taught.
      expect(await learnedDuration(ctx, 'small', 'ci')).toMatchObject({ confident: true });
      expect((await learnedDuration(ctx, 'small', 'ci'))?.seconds).toBeCloseTo(1, 6);
    });

    it('lets 12 fast releases by one requestor pull an established estimate at most halfway, and not confidently', async () => {
      const table = await newTable();
      const { ctx } = instance(table);
      await teach(table, ctx, 10, 600, 'build');
      await teach(table, ctx, 10, 600, 'test');
      await teach(table, ctx, 10, 600); // requests naming no requestor
      expect(await learnedDuration(ctx, 'small', 'newcomer')).toMatchObject({ confident: true });
      await teach(table, ctx, 12, 1, 'ci');
      const after = await learnedDuration(ctx, 'small', 'newcomer');
      // At most halfway to ci's 1 s in log (sqrt(600) ~ 24 s), and rough: no one is placed by it.
      expect(after?.seconds).toBeGreaterThan(Math.sqrt(600));
      expect(after?.confident).toBe(false);
      // The requests naming none keep their own estimate.
      expect(await learnedDuration(ctx, 'small', undefined)).toMatchObject({ confident: true });
      expect((await learnedDuration(ctx, 'small', undefined))?.seconds).toBeCloseTo(600, 6);
    });
  });
});
