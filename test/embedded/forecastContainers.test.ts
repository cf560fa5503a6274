import { afterEach, describe, expect, it } from 'vitest';
import { hourOfWeek, minuteOf } from '../../shared/core/forecast.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * Arrival forecasts (`min-ready: auto`) on Lambda's shape (issue 40): the request function runs in
 * containers of its own, each with its own module state (its buffer of arrivals, keyed by its store), and
 * the reaper in another. Each container here is the pool's context on a DynamoStore of its own over the
 * same table, driven through the real handlers.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

/** A Lambda container: the pool's context with a store (and so module state) of its own. */
function container(harness: Harness): Context {
  const store = new DynamoStore(harness.pool.dynamodb, harness.pool.info.tableName, harness.clock);
  return { ...harness.pool.context, store };
}

/** Moves the clock to `seconds` past the start of the next hour (the arrivals below stay in one hour). */
function intoNextHour(harness: Harness, seconds: number): number {
  const start = (Math.floor(harness.clock.now() / 3_600_000) + 1) * 3_600_000;
  harness.clock.set(start + seconds * 1000);
  return start;
}

const request = (id: string, requestor?: string) =>
  JSON.stringify({ kind: 'request', id, labels: ['small-node'], ...(requestor ? { requestor } : {}) });
const release = (id: string) => JSON.stringify({ kind: 'release', nodeId: `${id}/0` });

describe('arrival forecasts with the request function in containers of its own (issue 40)', () => {
  it('defect 5: a burst on one request container is in the table when its invocations end, for the reaper in another container', async () => {
    h = await startHarness(baseConfig({ slots: 24, grace: 0, readyAuto: { target: 0.9, max: 3 } }));
    await readyNode(h, 'base'); // a backing node of 24 slots: the burst is placed without a launch
    const handle = makeRequestHandler(container(h));
    intoNextHour(h, 10);
    // The review's reproduction: 20 placements in 9.5 s, one invocation each, on one container.
    for (let i = 0; i < 20; i++) {
      expect((await handle(sqsEvent([request(`burst-${i}`)]))).batchItemFailures).toEqual([]);
      if (i < 19) h.clock.advance(500);
    }
    // The reaper, in a container of its own (nothing buffered there), folds the minute.
    h.clock.advance(50_000);
    const reaper = container(h);
    expect((await reap(reaper)).errors).toEqual([]);
    const counted = async () => {
      const model = await h?.pool.context.store.getForecast('small-node');
      return (model?.hourCount ?? 0) + (model?.pending ?? 0);
    };
    // The burst is in the table, but for its last arrival (was 0: the first was written at once and
    // folded into the minutes before the burst, the other 19 stayed in the container's buffer, waiting for
    // a placement 10 s after it). The last came within a second of the container's last write: it waits
    // for the container's next invocation (a container writes an item at most once a second).
    expect(await counted()).toBeCloseTo(19, 9);
    expect((await h.pool.context.store.getForecast('small-node'))?.shortRate).toBeGreaterThan(2);
    expect((await handle(sqsEvent([release('burst-0')]))).batchItemFailures).toEqual([]);
    h.clock.advance(60_000);
    expect((await reap(reaper)).errors).toEqual([]);
    expect(await counted()).toBeCloseTo(20, 9);
  }, 120_000);

  it('defect 6: requests placed and released within seconds teach the weekly profile nothing, and one requestor counts at most 30 arrivals a minute', async () => {
    h = await startHarness(baseConfig({ slots: 100, grace: 0, readyAuto: { target: 0.9, max: 10 } }));
    await readyNode(h, 'base');
    const requests = makeRequestHandler(container(h));
    const releases = makeRequestHandler(container(h));
    const hourStart = intoNextHour(h, 5);
    // The adversarial run: 48 requests placed and released within 21 s, by one requestor, on one
    // container; their releases, 2 s after each placement, on another.
    for (let i = 0; i < 48; i++) {
      expect((await requests(sqsEvent([request(`bogus-${i}`, 'bogus')]))).batchItemFailures).toEqual([]);
      h.clock.advance(200);
      if (i >= 10) {
        const back = `bogus-${i - 10}`;
        expect((await releases(sqsEvent([release(back)]))).batchItemFailures).toEqual([]);
      }
    }
    for (let i = 38; i < 48; i++) {
      h.clock.advance(200);
      expect((await releases(sqsEvent([release(`bogus-${i}`)]))).batchItemFailures).toEqual([]);
    }
    // Another requestor, within the same minute: 40 requests whose nodes it keeps (jobs), and one more
    // requestor with 5. One requestor counts at most 30 in a minute; the others whole.
    for (let i = 0; i < 40; i++) {
      expect((await requests(sqsEvent([request(`ci-${i}`, 'ci')]))).batchItemFailures).toEqual([]);
      h.clock.advance(100);
    }
    for (let i = 0; i < 5; i++) {
      expect((await requests(sqsEvent([request(`docs-${i}`, 'docs')]))).batchItemFailures).toEqual([]);
    }
    // Each container's next invocation writes what it counted within a second of its last write.
    h.clock.advance(1_000);
    for (const handle of [requests, releases]) {
      expect((await handle(sqsEvent([release('bogus-0')]))).batchItemFailures).toEqual([]); // already released
    }
    expect(h.clock.now() - hourStart).toBeLessThan(60_000); // all within the hour's first minute
    // Releases of the jobs' nodes much later do not take anything back.
    h.clock.set(hourStart + 20 * 60_000);
    for (const id of ['ci-0', 'docs-0']) {
      expect((await releases(sqsEvent([release(id)]))).batchItemFailures).toEqual([]);
    }
    const reaper = container(h);
    h.clock.set(hourStart + 30 * 60_000);
    expect((await reap(reaper)).errors).toEqual([]);
    const mid = await h.pool.context.store.getForecast('small-node');
    // 30 of ci's 40 and docs' 5; bogus's 30 counted (of 48) taken back by their releases.
    expect((mid?.hourCount ?? 0) + (mid?.pending ?? 0)).toBeCloseTo(35, 9);
    // The hour ends: its bucket of the weekly profile learns 35 arrivals, none of the bogus ones.
    h.clock.set(hourStart + 61 * 60_000);
    expect((await reap(reaper)).errors).toEqual([]);
    const model = await h.pool.context.store.getForecast('small-node');
    const bucket = hourOfWeek(minuteOf(hourStart));
    expect(model?.profile[bucket]).toBeCloseTo(35 / 60, 9);
  }, 180_000);
});
