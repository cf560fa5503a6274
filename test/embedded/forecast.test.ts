import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { SHORT_HALF_LIFE_MIN } from '../../shared/core/forecast.ts';
import { silentLog } from '../../shared/core/log.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import {
  countArrival,
  FORECAST_WRITE_INTERVAL_MS,
  flushArrivals,
  foldForecast,
  writeArrivals,
} from '../../shared/usecases/ready/forecasts.ts';
import { poolConfig } from '../../testkit/configs.ts';
import { countedWrites } from '../../testkit/countedWrites.ts';
import { type InProcessDynalite, startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';

/**
 * Arrival forecasts in the table (issue 27): the request function's containers count arrivals of labels
 * with `min-ready: auto` and write them, conditionally, into one item per label at the end of each
 * invocation (at most once a second per container, issue 40); the reaper folds the minutes that ended.
 * On dynalite, with several containers writing at once.
 */
describe('arrival forecasts in the table, written by several function instances (issue 27)', () => {
  let engine: InProcessDynalite;
  let tables = 0;
  beforeAll(async () => {
    engine = await startInProcessDynalite();
  });
  afterAll(async () => {
    await engine.close();
  });

  const config = parseConfigOrThrow(
    poolConfig({ labels: [{ name: 'large-node' }, { name: 'small-node', 'min-ready': 'auto' }] }),
    'forecast.yaml',
  );

  async function newTable(): Promise<{ tableName: string; clock: ManualClock }> {
    const tableName = `forecast-${++tables}`;
    await ensureTable(engine.client, tableName);
    // The start of a minute: every write below until the clock moves a minute is within it.
    return { tableName, clock: new ManualClock(Date.parse('2026-06-01T00:00:00Z')) };
  }

  /** A function instance: its own store (so its own buffer) on the shared table, its writes counted. */
  function instance(table: { tableName: string; clock: ManualClock }) {
    const store = new DynamoStore(engine.client, table.tableName, table.clock);
    const { store: counted, writes } = countedWrites(store, 'putForecast');
    const ctx = { store: counted, config, clock: table.clock, log: silentLog } as unknown as Context;
    return { ctx, store, writes };
  }

  it('counts every arrival of containers writing at the end of their invocations, each write from the version it read, one per container and second', async () => {
    const table = await newTable();
    const instances = [instance(table), instance(table), instance(table)];
    // An invocation of 50 placements on each container, the three at once, by ten requestors (15
    // arrivals each in all, within the 30 a requestor counts in a minute): each writes once, at its end.
    const invocation = async (ctx: Context, n: number) => {
      for (let i = 0; i < n; i++) await countArrival(ctx, 'small-node', `team-${i % 10}`);
      await writeArrivals(ctx);
    };
    await Promise.all(instances.map(({ ctx }) => invocation(ctx, 50)));
    for (const { writes } of instances) expect(writes.done).toBe(1);
    expect((await instances[0]?.store.getForecast('small-node'))?.pending).toBe(150);
    // Another invocation within the second: its arrival waits for the container's next write.
    await Promise.all(instances.map(({ ctx }) => invocation(ctx, 1)));
    for (const { writes } of instances) expect(writes.done).toBe(1);
    // A label without min-ready auto is not counted: no item, no write.
    await countArrival(instances[0]?.ctx as Context, 'large-node');
    await writeArrivals(instances[0]?.ctx as Context);
    expect(await instances[0]?.store.getForecast('large-node')).toBeUndefined();

    table.clock.advance(FORECAST_WRITE_INTERVAL_MS);
    await Promise.all(instances.map(({ ctx }) => writeArrivals(ctx)));
    const model = await instances[0]?.store.getForecast('small-node');
    // Still the first minute: all 153 wait in `pending`, none lost to a conflict, none counted twice.
    expect(model?.pending).toBe(153);
    const done = instances.reduce((n, { writes }) => n + writes.done, 0);
    expect(done).toBe(6); // two writes per container; conflicts were re-read and retried
    expect(model?.version).toBe(6);
    // The reaper's flush writes what is left whenever it runs: nothing here.
    await Promise.all(instances.map(({ ctx }) => flushArrivals(ctx)));
    expect(instances.reduce((n, { writes }) => n + writes.done, 0)).toBe(6);
  });

  it('folds a minute once whichever reaper folds it, and lets the rate of a quiet label decay', async () => {
    const table = await newTable();
    const a = instance(table);
    const b = instance(table);
    for (let i = 0; i < 30; i++) await countArrival(a.ctx, 'small-node');
    await flushArrivals(a.ctx);
    table.clock.advance(60_000);
    const [fa, fb] = await Promise.all([
      foldForecast(a.ctx, 'small-node'),
      foldForecast(b.ctx, 'small-node'),
    ]);
    const folded = await a.store.getForecast('small-node');
    // One of the two folded the minute; the other found it folded (no second write, the same model).
    expect(a.writes.done + b.writes.done).toBe(2);
    expect(fa?.version).toBe(folded?.version);
    expect(fb?.version).toBe(folded?.version);
    expect(folded?.pending).toBe(0);
    const rate = 30 * (1 - 2 ** (-1 / SHORT_HALF_LIFE_MIN));
    expect(folded?.shortRate).toBeCloseTo(rate, 9);

    table.clock.advance(10 * 60_000);
    const quiet = await foldForecast(b.ctx, 'small-node');
    expect(quiet?.shortRate).toBeCloseTo(rate * 2 ** (-10 / SHORT_HALF_LIFE_MIN), 9);
    expect(await a.store.getForecast('small-node')).toEqual(quiet);
  });
});
