import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readyBacking } from '../../bench/common.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { systemClock } from '../../shared/core/clock.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { ProviderRegistry } from '../../shared/core/provider.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { type InProcessDynalite, startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { whileWatching } from '../../testkit/sdkWatch.ts';

/**
 * Concurrent allocations of one label in one process (the embedded pool's consumer, a Lambda batch) on
 * dynalite (issue 26, item 3): they read the same candidates, fullest first, and used to aim all at the
 * fullest, where all but its free slots lost their conditional claim. Each now aims at a free slot of
 * its own among the fullest few (core/claimants.ts).
 */
const LABEL = 'small-node';
let engine: InProcessDynalite;

beforeAll(async () => {
  engine = await startInProcessDynalite();
});
afterAll(async () => {
  await engine?.close();
});

describe('concurrent allocations in one process', () => {
  it('aim at different free slots of the fullest few, so hardly any claim is lost', async () => {
    await ensureTable(engine.client, 'contention');
    const config = parseConfigOrThrow(
      poolConfig({
        meta: { labels: [smallNode({ name: LABEL, 'max-parallel-jobs': 8, 'grace-time': 86400 })] },
      }),
      'contention.yaml',
    );
    const pool = config.metastaticPools[0];
    if (!pool) throw new Error('no metastatic pool');
    const providers: ProviderRegistry = {
      forPool: () => {
        throw new Error('a launch was asked for; there are free slots');
      },
      forResource: () => undefined,
    };
    const store = new DynamoStore(engine.client, 'contention');
    const ctx: Context = { store, config, providers, clock: systemClock, log: silentLog };
    // Free slots, fullest first: 5, 6, 8.
    for (const [id, used] of [
      ['bn-1', 3],
      ['bn-2', 2],
      ['bn-3', 0],
    ] as const) {
      await store.createBacking(
        readyBacking({
          id,
          poolKey: pool.key,
          label: LABEL,
          backingPoolKey: config.backingPools[0]?.key ?? 'local/main',
          backingLabel: 'large-node',
          slots: 8,
          used,
          launchedAt: Date.now() - 60_000,
        }),
      );
    }
    let lost = 0;
    const placed = await (async () => {
      let out: Awaited<ReturnType<typeof requestNodes>>[] = [];
      await whileWatching(
        engine.client,
        async (_, __, send) => {
          try {
            return await send();
          } catch (err) {
            if ((err as Error).name === 'ConditionalCheckFailedException') lost++;
            throw err;
          }
        },
        async () => {
          out = await Promise.all(
            Array.from({ length: 12 }, (_, i) =>
              requestNodes(ctx, { kind: 'request', id: `c-${i}`, labels: [LABEL] }),
            ),
          );
        },
      );
      return out;
    })();
    expect(placed.map((p) => p.request.state)).toEqual(Array(12).fill('fulfilled'));
    // All twelve aimed at bn-1's 5 free slots before: at least 7 lost claims.
    expect(lost).toBeLessThanOrEqual(2);
    // Packed as twelve allocations one after another would be: the fullest filled first.
    const used = await Promise.all(
      ['bn-1', 'bn-2', 'bn-3'].map(async (id) => (await store.getBacking(id))?.used),
    );
    expect(used[0]).toBe(8);
    expect((used[0] ?? 0) + (used[1] ?? 0) + (used[2] ?? 0)).toBe(5 + 12);
  }, 60_000);
});
