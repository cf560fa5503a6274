import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readyBacking } from '../../bench/common.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { ProviderRegistry } from '../../shared/core/provider.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { CLAIMED_REUSE_MS } from '../../shared/usecases/place/candidates.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { type InProcessDynalite, startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';

/**
 * A placement starts from the backing node this store instance's last placement of the label went to
 * (usecases/place/candidates.ts, issue 26), and asks the free index as before whenever that is not the right
 * start: the node changed elsewhere, it is older than CLAIMED_REUSE_MS, or candidates are ordered by
 * expected end. Two store instances on one table play two function instances.
 */
describe('the backing node of the last placement', () => {
  let engine: InProcessDynalite;
  let n = 0;
  const calls: string[] = [];

  beforeAll(async () => {
    engine = await startInProcessDynalite();
    engine.client.middlewareStack.add(
      (next, context) => async (args) => {
        const input = args.input as { IndexName?: string; Key?: { pk?: string } };
        calls.push(
          `${context.commandName?.replace(/Command$/, '')} ${input.IndexName ?? input.Key?.pk ?? ''}`,
        );
        return next(args);
      },
      { step: 'initialize', name: 'candidateMemoryTrace' },
    );
  });
  afterAll(async () => {
    await engine?.close();
  });

  /** A table with two ready backing nodes of 4 slots (A the older, so first among equals), two instances. */
  async function setup() {
    const table = `memory-${++n}`;
    await ensureTable(engine.client, table);
    const config = parseConfigOrThrow(
      poolConfig({ meta: { labels: [smallNode({ name: 'small-node', 'max-parallel-jobs': 4 })] } }),
      `${table}.yaml`,
    );
    const pool = config.metastaticPools[0];
    if (!pool) throw new Error('no pool');
    const clock = new ManualClock(Date.now());
    const providers: ProviderRegistry = {
      forPool: () => {
        throw new Error('a launch was asked for');
      },
      forResource: () => undefined,
    };
    const instance = (): Context => ({
      store: new DynamoStore(engine.client, table),
      config,
      providers,
      clock,
      log: silentLog,
    });
    const [one, two] = [instance(), instance()];
    for (const [id, age] of [
      ['bn-a', 120_000],
      ['bn-b', 60_000],
    ] as const) {
      await one.store.createBacking(
        readyBacking({
          id,
          poolKey: pool.key,
          label: 'small-node',
          backingPoolKey: config.backingPools[0]?.key ?? 'local/main',
          backingLabel: config.backingPools[0]?.labels.keys().next().value ?? 'large-node',
          slots: 4,
          used: 0,
          launchedAt: clock.now() - age,
        }),
      );
    }
    let r = 0;
    /** Places a one-node request through `ctx`: its backing node and the calls it made. */
    const place = async (ctx: Context, extra: Record<string, unknown> = {}) => {
      calls.length = 0;
      const id = `${table}-r${++r}`;
      const out = await requestNodes(ctx, { kind: 'request', id, labels: ['small-node'], ...extra });
      if (out.kind !== 'placed') throw new Error(`${id}: ${out.kind}`);
      return { on: out.request.nodes[0]?.backingNodeId, calls: [...calls] };
    };
    return { one, two, clock, place };
  }

  const queries = (c: readonly string[]) => c.filter((x) => x.startsWith('Query free'));

  it('is where the next placement claims, without a Query', async () => {
    const { one, place } = await setup();
    const first = await place(one);
    expect(first.on).toBe('bn-a');
    expect(queries(first.calls)).toHaveLength(1);
    const next = await place(one);
    expect(next.on).toBe('bn-a');
    expect(queries(next.calls)).toEqual([]);
  });

  it('filled by another instance: the claim is refused and the index asked, and the node lands elsewhere', async () => {
    const { one, two, place } = await setup();
    expect((await place(one)).on).toBe('bn-a'); // one remembers bn-a with 3 free slots
    for (let i = 0; i < 3; i++) expect((await place(two)).on).toBe('bn-a'); // two fills it
    const next = await place(one);
    expect(next.on).toBe('bn-b');
    expect(next.calls.filter((c) => c === 'UpdateItem BACKING#bn-a')).toHaveLength(1); // refused
    expect(queries(next.calls)).toHaveLength(1);
    // ... and bn-b is remembered now.
    const after = await place(one);
    expect(after.on).toBe('bn-b');
    expect(queries(after.calls)).toEqual([]);
  });

  it('is where only a lone placement starts: concurrent ones of the same process ask the index', async () => {
    const { one, place } = await setup();
    await place(one);
    calls.length = 0;
    const ids = ['c1', 'c2'].map((c) => `${c}-${Date.now()}`);
    const out = await Promise.all(
      ids.map((id) => requestNodes(one, { kind: 'request', id, labels: ['small-node'] })),
    );
    expect(out.map((o) => o.kind)).toEqual(['placed', 'placed']);
    // The second claimant (ticket 1) spreads over the index's candidates; the first claims on bn-a.
    expect(queries(calls)).toHaveLength(1);
  });

  it(`is forgotten after ${CLAIMED_REUSE_MS / 1000} s: the index is asked again`, async () => {
    const { one, clock, place } = await setup();
    await place(one);
    // Used just before the limit (so the Query below is the limit's doing, not a memory never used)...
    clock.advance(CLAIMED_REUSE_MS - 1);
    expect(queries((await place(one)).calls)).toEqual([]);
    // ...and remembered anew by that placement: forgotten once that one is as old.
    clock.advance(CLAIMED_REUSE_MS);
    expect(queries((await place(one)).calls)).toHaveLength(1);
  });

  it('is not where a node with an expected end goes: candidates ordered by expected end come from the index', async () => {
    const { one, place } = await setup();
    await place(one);
    const timed = await place(one, { 'expected-duration': 600 });
    expect(queries(timed.calls)).toHaveLength(1);
    // The same placement without an expected end, right after, starts from the remembered node.
    expect(queries((await place(one)).calls)).toEqual([]);
  });
});
