/**
 * The DynamoDB calls of one warm-path allocation, step by step (issue 26): what each call reads or
 * writes and under which condition, for the three variants of part 1 (max-servers set, unset, unset with
 * min-ready 1). The real use cases as the request function runs them (requestNodes, then the min-ready
 * refill of the labels it took from; releaseNode, then the hand-off of the freed room) on an in-process
 * dynalite, one ready backing node with free slots, no provider. Not timed: it prints the calls.
 * docs/table.md ("One warm allocation, call by call") is written from its output.
 *
 *   npx tsx bench/warmCalls.ts
 */
import { pathToFileURL } from 'node:url';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { ProviderRegistry } from '../shared/core/provider.ts';
import { ensureTable } from '../shared/runtime/engines.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { keepMinReady, labelsTaken } from '../shared/usecases/ready/replenish.ts';
import { handOffFreedRoom } from '../shared/usecases/release/handOff.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import { largeNode, poolConfig, smallNode } from '../testkit/configs.ts';
import { startInProcessDynalite } from '../testkit/inProcessDynalite.ts';
import { log, readyBacking } from './common.ts';

const LABEL = 'small-node';

export interface TracedCall {
  readonly command: string;
  /** `pk` / `sk` of the item (or the index and partition a Query reads). */
  readonly target: string;
  readonly detail: string;
  readonly failed: boolean;
  /**
   * Round trips in sequence up to and including this one: 1 + the deepest call that had answered when it
   * was sent (calls sent together share a depth). The allocation's deepest call is its latency in round trips.
   */
  readonly depth: number;
}

export interface WarmTrace {
  readonly variant: string;
  /** The first allocation of the store instance: no placement of the label to start from (a Query). */
  readonly first: TracedCall[];
  readonly allocation: TracedCall[];
  readonly release: TracedCall[];
}

/** The pools measured (bench/motoCalls.ts measures the same on the AWS path). */
export const VARIANTS = [
  { name: 'max-servers-1000', maxServers: 1000, minReady: undefined },
  { name: 'max-servers-unset', maxServers: undefined, minReady: undefined },
  { name: 'min-ready-1', maxServers: undefined, minReady: 1 },
] as const;

/** The warm-path pool of a variant (bench/allocation.bench.ts times the same pool). */
export function configYaml(maxServers: number | undefined, minReady: number | undefined): string {
  return poolConfig({
    labels:
      minReady === undefined ? undefined : [{ name: 'large-node' }, { name: LABEL, 'min-ready': minReady }],
    backing: { pool: { 'max-servers': 4 }, labels: [largeNode({ 'boot-delay': 0 })] },
    meta: {
      pool: { 'max-servers': maxServers },
      labels: [smallNode({ name: LABEL, 'max-parallel-jobs': 64, 'grace-time': 86400 })],
    },
  });
}

const short = (s: unknown) =>
  typeof s === 'string' ? s.replace(/\s+/g, ' ').slice(0, 110) : s === undefined ? '' : JSON.stringify(s);

function describe(command: string, input: Record<string, unknown>): { target: string; detail: string } {
  const key = (input.Key ?? input.Item) as Record<string, unknown> | undefined;
  const values = input.ExpressionAttributeValues as Record<string, unknown> | undefined;
  if (command === 'Query') {
    const where = `${input.IndexName ?? 'table'} ${Object.values(values ?? {})
      .filter((v) => typeof v === 'string')
      .join(' ')}`;
    return { target: where, detail: `limit ${input.Limit ?? '-'}` };
  }
  if (command === 'TransactWriteItems') {
    // Each action's item and what it does (the capacity sets' transactions: a counter and its places).
    const actions = (input.TransactItems ?? []) as Record<string, Record<string, unknown>>[];
    const items = actions.map((a) => {
      const [kind, action] = Object.entries(a)[0] ?? ['?', {}];
      const k = (action.Key ?? action.Item) as Record<string, unknown> | undefined;
      return `${kind} ${k?.pk} / ${k?.sk}`;
    });
    return { target: `transaction of ${items.length}: ${items.join(', ')}`, detail: '' };
  }
  const target = key ? `${key.pk} / ${key.sk}` : '?';
  const parts = [
    input.UpdateExpression ? `update: ${short(input.UpdateExpression)}` : '',
    input.ConditionExpression ? `if: ${short(input.ConditionExpression)}` : '',
    command === 'PutItem' && key?.state ? `state ${key.state}` : '',
  ].filter(Boolean);
  return { target, detail: parts.join('; ') };
}

/**
 * Traces one warm allocation and its release in each variant, after one of each to warm up (traced too:
 * the first allocation of a store instance, which has no placement of the label to start from).
 */
export async function traceWarmCalls(): Promise<WarmTrace[]> {
  const engine = await startInProcessDynalite();
  let trace: TracedCall[] | undefined;
  engine.client.middlewareStack.add(
    (next, context) => async (args) => {
      const command = (context.commandName ?? '?').replace(/Command$/, '');
      const described = describe(command, args.input as Record<string, unknown>);
      const into = trace;
      const depth = 1 + Math.max(0, ...(into ?? []).map((c) => c.depth));
      try {
        const out = await next(args);
        into?.push({ command, ...described, failed: false, depth });
        return out;
      } catch (err) {
        into?.push({ command, ...described, failed: true, depth });
        throw err;
      }
    },
    { step: 'initialize', name: 'warmCallsTrace' },
  );
  const out: WarmTrace[] = [];
  try {
    for (const v of VARIANTS) {
      const table = `warm-${v.name}`;
      await ensureTable(engine.client, table);
      const config = parseConfigOrThrow(configYaml(v.maxServers, v.minReady), `${table}.yaml`);
      const pool = config.metastaticPools[0];
      if (!pool) throw new Error('no metastatic pool');
      const providers: ProviderRegistry = {
        forPool: () => {
          throw new Error('warmCalls: a launch was asked for; the warm path has a free slot');
        },
        forResource: () => undefined,
      };
      const ctx: Context = {
        store: new DynamoStore(engine.client, table),
        config,
        providers,
        clock: systemClock,
        log,
      };
      await ctx.store.createBacking(
        readyBacking({
          id: 'bn-warm',
          poolKey: pool.key,
          label: LABEL,
          backingPoolKey: config.backingPools[0]?.key ?? 'local/main',
          backingLabel: 'large-node',
          slots: 64,
          used: 0,
          launchedAt: Date.now() - 60_000,
        }),
      );
      if (v.minReady !== undefined) await keepMinReady(ctx, LABEL);
      const one = async (id: string) => {
        const allocation: TracedCall[] = [];
        const release: TracedCall[] = [];
        trace = allocation;
        const placed = await requestNodes(ctx, { kind: 'request', id, labels: [LABEL] });
        // As the request function refills after a take (requestHandler.ts replenishTaken).
        if (placed.kind === 'placed') {
          const seen = placed.spares;
          for (const l of labelsTaken(placed.request))
            await keepMinReady(ctx, l, seen ? { taken: { seen, taker: placed.request } } : {});
        }
        trace = release;
        const released = await releaseNode(ctx, `${id}/0`);
        if (released.kind === 'released' && released.poolKey)
          await handOffFreedRoom(ctx, released.poolKey, released.node.label);
        trace = undefined;
        if (placed.request.state !== 'fulfilled') throw new Error(`${id}: ${placed.request.state}`);
        return { allocation, release };
      };
      const first = await one(`warm-up-${v.name}`);
      out.push({ variant: v.name, first: first.allocation, ...(await one(`traced-${v.name}`)) });
    }
  } finally {
    await engine.close();
  }
  return out;
}

/** Round trips in sequence of a traced operation: the latency a network round trip per call gives it. */
export const roundTrips = (calls: readonly TracedCall[]) => Math.max(0, ...calls.map((c) => c.depth));

export function warmCallsReport(traces: readonly WarmTrace[]): string {
  const lines: string[] = [];
  for (const t of traces) {
    for (const [what, calls] of [
      ['first allocation of the instance', t.first],
      ['allocation', t.allocation],
      ['release', t.release],
    ] as const) {
      lines.push(
        `${t.variant}: ${what}, ${calls.length} DynamoDB calls, ${roundTrips(calls)} round trips in sequence`,
      );
      calls.forEach((c, i) => {
        lines.push(
          `  ${i + 1}. [${c.depth}] ${c.command}${c.failed ? ' (condition failed)' : ''} ${c.target}  ${c.detail}`,
        );
      });
    }
  }
  return lines.join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  console.log(warmCallsReport(await traceWarmCalls()));
}
