/**
 * Part: the warm path's DynamoDB calls on the AWS path (issue 26, item 6), so the figure is not only the
 * embedded pool's. A moto_server on loopback; the pool's table created as the stack creates it
 * (`tableDefinition`); the request function's handler (makeRequestHandler, with the stack's options: the
 * request queue's backstop and waiting budget) on the context the Lambda functions build (awsContext: the
 * EC2 provider, the EventBridge sink), its SDK clients pointed at moto. Each allocation is an SQS event
 * batch of one request record, then its node is released by a batch of one release record, as the
 * queue would deliver them. One ready backing node with free slots is already in the table (the warm
 * path), per variant: max-servers 1000, unset, and unset with min-ready 1 (as bench/warmCalls.ts).
 *
 * Counted by an SDK middleware on the store's DynamoDB client: the commands of each allocation, in order;
 * and on the EC2 and EventBridge clients (EC2 must be 0 on the warm path). Call counts, not times: moto's
 * latency says nothing of DynamoDB's.
 *
 *   npx tsx bench/motoCalls.ts      (this part alone; `npm run bench -- --only motoCalls` records it)
 */
import { pathToFileURL } from 'node:url';
import { CreateTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { EventBridgeClient } from '@aws-sdk/client-eventbridge';
import type { SQSEvent } from 'aws-lambda';
import { MOTO_CREDENTIALS, startMotoServer } from '../cli/rehearse/motoServer.ts';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { systemClock } from '../shared/core/clock.ts';
import {
  FUNCTION_TIMEOUT_SECONDS,
  visibilityTimeoutSeconds,
  WAITING_BUDGET_SECONDS,
} from '../shared/core/timing.ts';
import { makeRequestHandler } from '../shared/handlers/requestHandler.ts';
import { createEc2Client } from '../shared/providers/aws/ec2Provider.ts';
import { awsContext } from '../shared/runtime/awsContext.ts';
import { guardDynamoLimits } from '../shared/runtime/dynamoLimits.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import { tableDefinition } from '../shared/store/table.ts';
import { keepMinReady } from '../shared/usecases/ready/replenish.ts';
import { poolConfig } from '../testkit/configs.ts';
import { onPath } from '../testkit/onPath.ts';
import { log, median, readyBacking, table, yesNo } from './common.ts';
import { type TracedCall, traceWarmCalls, VARIANTS } from './warmCalls.ts';

const LABEL = 'small-node';
const REGION = 'us-east-1';
const SLOTS = 64;
/** Allocations counted per variant, after one to warm up (the count does not vary on the warm path). */
const SAMPLES = 10;
/** The aims of the embedded row (allocation.bench.ts AIM_CALLS_PER_ALLOCATION), for the same variants. */
export const MOTO_AIMS: Record<string, number> = {
  'max-servers-1000': 3,
  'max-servers-unset': 2,
  'min-ready-1': 7,
};

/** The same pool as bench/warmCalls.ts, its backing label on EC2 (the AWS path) instead of local processes. */
function configYaml(maxServers: number | undefined, minReady: number | undefined): string {
  return poolConfig({
    labels:
      minReady === undefined ? undefined : [{ name: 'large-node' }, { name: LABEL, 'min-ready': minReady }],
    backing: {
      driver: 'aws',
      provider: { region: REGION },
      pool: { 'max-servers': 4, 'subnet-ids': ['subnet-a'], 'security-group-id': 'sg-1' },
      labels: [{ name: 'large-node', 'instance-types': ['m7g.2xlarge'], 'image-id': 'ami-123' }],
    },
    meta: {
      pool: { 'max-servers': maxServers },
      labels: [
        {
          name: LABEL,
          'backing-label': 'large-node',
          'max-parallel-jobs': SLOTS,
          'grace-time': 86400,
        },
      ],
    },
  });
}

/** One call as the middleware saw it: the command, and the item (`pk / sk`) or index it reads. */
export interface MotoCall {
  readonly command: string;
  readonly target: string;
  readonly failed: boolean;
}

export interface MotoVariant {
  readonly name: string;
  /** DynamoDB calls per allocation over the samples. */
  readonly allocation: { readonly median: number; readonly min: number; readonly max: number };
  /** The calls of one allocation with the median count, in order. */
  readonly calls: readonly MotoCall[];
  readonly releaseCalls: readonly MotoCall[];
  /** EC2 calls over all the variant's allocations and releases (must be 0: nothing launches). */
  readonly ec2Calls: number;
  /** EventBridge calls per allocation (the pool's events; not DynamoDB). */
  readonly eventCalls: number;
  readonly aim: number;
  readonly aimMet: boolean;
  /** The embedded pool's calls of the same allocation (bench/warmCalls.ts, dynalite), in order. */
  readonly embeddedCalls: readonly string[];
  /** Whether the allocation sent the same commands to the same items on both, each as often (sameCalls). */
  readonly sameAsEmbedded: boolean;
}

export interface MotoCallsFigures {
  /** Why nothing was measured (moto_server absent), or undefined. */
  readonly skipped?: string;
  readonly samples: number;
  readonly variants: readonly MotoVariant[];
}

const plain = (v: unknown): string | undefined =>
  typeof v === 'string'
    ? v
    : typeof (v as { S?: unknown })?.S === 'string'
      ? (v as { S: string }).S
      : undefined;

function targetOf(command: string, input: Record<string, unknown>): string {
  if (command === 'Query' || command === 'Scan') {
    const values = Object.values((input.ExpressionAttributeValues ?? {}) as Record<string, unknown>)
      .map(plain)
      .filter((v) => v !== undefined);
    return `${(input.IndexName as string | undefined) ?? 'table'} ${values.join(' ')}`.trim();
  }
  const keyOf = (i: Record<string, unknown>) => {
    const key = (i.Key ?? i.Item) as Record<string, unknown> | undefined;
    return key ? `${plain(key.pk) ?? '?'} / ${plain(key.sk) ?? '?'}` : '?';
  };
  if (command === 'TransactWriteItems') {
    // As bench/warmCalls.ts names one: each action's kind and item.
    const actions = (input.TransactItems ?? []) as Record<string, Record<string, unknown>>[];
    const items = actions.map((a) => {
      const [kind, action] = Object.entries(a)[0] ?? ['?', {}];
      return `${kind} ${keyOf(action)}`;
    });
    return `transaction of ${items.length}: ${items.join(', ')}`;
  }
  return keyOf(input);
}

/** Calls `onCall` after each command the client sends (an SDK middleware at `initialize`). */
function watch<C extends { middlewareStack: object }>(
  client: C,
  name: string,
  onCall: (command: string, input: Record<string, unknown>, failed: boolean) => void,
): C {
  // Every client's stack takes an initialize middleware that only reads the command's name and input.
  (client.middlewareStack as DynamoDBClient['middlewareStack']).add(
    (next, context) => async (args) => {
      const command = (context.commandName ?? '?').replace(/Command$/, '');
      const input = args.input as Record<string, unknown>;
      try {
        const out = await next(args);
        onCall(command, input, false);
        return out;
      } catch (err) {
        onCall(command, input, true);
        throw err;
      }
    },
    { step: 'initialize', name },
  );
  return client;
}

/**
 * A call with the names that differ between the two runs made alike: the request's id (and the node
 * and place items named after it) and the pool's own min-ready request ids.
 */
const normalized = (c: { command: string; target: string }, requestId: string) =>
  `${c.command} ${c.target
    .split(requestId)
    .join('<request>')
    .replace(/min-ready:[^ /]+/g, 'min-ready:<seat>')}`;

const sqsEvent = (body: unknown, n: number): SQSEvent => ({
  Records: [
    {
      messageId: `m-${n}`,
      receiptHandle: `rh-${n}`,
      body: JSON.stringify(body),
      attributes: {
        ApproximateReceiveCount: '1',
        SentTimestamp: String(Date.now()),
        SenderId: 'bench',
        ApproximateFirstReceiveTimestamp: String(Date.now()),
      },
      messageAttributes: {},
      md5OfBody: '',
      eventSource: 'aws:sqs',
      eventSourceARN: `arn:aws:sqs:${REGION}:123456789012:requests`,
      awsRegion: REGION,
    },
  ],
});

export async function measureMotoCalls(
  progress: (line: string) => void = () => {},
): Promise<MotoCallsFigures> {
  if (!onPath('moto_server')) {
    const why = "moto_server is not installed (not on PATH); pip install 'moto[server]==5.2.1'";
    if (process.env.METASTATIC_REQUIRE_MOTO === '1') throw new Error(`METASTATIC_REQUIRE_MOTO=1 but ${why}`);
    progress(`motoCalls: skipped, ${why}`);
    return { skipped: why, samples: 0, variants: [] };
  }
  progress('motoCalls: starting moto_server...');
  const moto = await startMotoServer();
  const endpoint = moto.endpoint;
  const aws = { region: REGION, endpoint, credentials: MOTO_CREDENTIALS };
  let dynamodbCalls: MotoCall[] | undefined;
  let ec2Calls = 0;
  let eventCalls = 0;
  const dynamodb = watch(
    guardDynamoLimits(new DynamoDBClient(aws)),
    'motoCallsDynamodb',
    (command, input, failed) => dynamodbCalls?.push({ command, target: targetOf(command, input), failed }),
  );
  const eventBridge = watch(new EventBridgeClient(aws), 'motoCallsEvents', () => {
    eventCalls++;
  });
  const out: MotoVariant[] = [];
  progress('motoCalls: the embedded calls of the same allocations (bench/warmCalls.ts)...');
  const embedded = new Map((await traceWarmCalls()).map((t) => [t.variant, t.allocation]));
  try {
    for (const v of VARIANTS) {
      progress(`motoCalls: variant ${v.name}`);
      const tableName = `moto-calls-${v.name}`;
      await dynamodb.send(new CreateTableCommand({ TableName: tableName, ...tableDefinition }));
      const config = parseConfigOrThrow(configYaml(v.maxServers, v.minReady), `${tableName}.yaml`);
      const pool = config.metastaticPools[0];
      if (!pool) throw new Error('no metastatic pool');
      // As lambdaRuntimeFromEnv builds the functions' context, with the clients pointed at moto and watched.
      const ctx = awsContext({
        config,
        store: new DynamoStore(dynamodb, tableName, systemClock, { recordRetention: config.recordRetention }),
        region: REGION,
        poolId: 'metastatic',
        clock: systemClock,
        log,
        ec2Client: (region) =>
          watch(createEc2Client(region, { endpoint, credentials: MOTO_CREDENTIALS }), 'motoCallsEc2', () => {
            ec2Calls++;
          }),
        eventBridge,
      });
      // As functions/request/index.ts makes it.
      const handle = makeRequestHandler(ctx, {
        maxReceiveCount: 100,
        waitingBudget: {
          seconds: WAITING_BUDGET_SECONDS.aws,
          visibilitySeconds: visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.request),
        },
      });
      await ctx.store.createBacking({
        ...readyBacking({
          id: 'bn-warm',
          poolKey: pool.key,
          label: LABEL,
          backingPoolKey: config.backingPools[0]?.key ?? 'ec2/main',
          backingLabel: 'large-node',
          slots: SLOTS,
          used: 0,
          launchedAt: Date.now() - 60_000,
        }),
        resourceId: 'i-0123456789abcdef0',
      });
      if (v.minReady !== undefined) await keepMinReady(ctx, LABEL);
      ec2Calls = 0;
      let n = 0;
      const one = async (id: string) => {
        const allocation: MotoCall[] = [];
        const release: MotoCall[] = [];
        const events = eventCalls;
        dynamodbCalls = allocation;
        const placed = await handle(sqsEvent({ kind: 'request', id, labels: [LABEL] }, n++), undefined);
        const allocationEvents = eventCalls - events;
        dynamodbCalls = release;
        const released = await handle(sqsEvent({ kind: 'release', nodeId: `${id}/0` }, n++), undefined);
        dynamodbCalls = undefined;
        if (placed.batchItemFailures.length > 0 || released.batchItemFailures.length > 0)
          throw new Error(`motoCalls ${id}: the handler failed a record`);
        const state = (await ctx.store.getRequest(id))?.state;
        if (state !== 'fulfilled')
          throw new Error(`motoCalls ${id}: request ${state ?? 'missing'}, not fulfilled`);
        return { allocation, release, allocationEvents };
      };
      await one(`moto-warm-up-${v.name}`);
      const samples = [];
      for (let i = 0; i < SAMPLES; i++) samples.push(await one(`moto-${v.name}-${i}`));
      const counts = samples.map((s) => s.allocation.length);
      const mid = median(counts);
      const typical = samples.find((s) => s.allocation.length === mid) ?? samples[0];
      if (!typical) throw new Error('no sample');
      const aim = MOTO_AIMS[v.name] ?? 3;
      const typicalId = `moto-${v.name}-${samples.indexOf(typical)}`;
      const mine = typical.allocation.map((c) => normalized(c, typicalId));
      const theirs = (embedded.get(v.name) ?? []).map((c: TracedCall) => normalized(c, `traced-${v.name}`));
      out.push({
        name: v.name,
        allocation: { median: mid, min: Math.min(...counts), max: Math.max(...counts) },
        calls: typical.allocation,
        releaseCalls: typical.release,
        ec2Calls,
        eventCalls: median(samples.map((s) => s.allocationEvents)),
        aim,
        aimMet: mid <= aim && ec2Calls === 0,
        embeddedCalls: theirs,
        sameAsEmbedded: sameCalls(mine, theirs),
      });
    }
  } finally {
    dynamodb.destroy();
    eventBridge.destroy();
    await moto.stop();
  }
  return { samples: SAMPLES, variants: out };
}

const callList = (calls: readonly MotoCall[]) =>
  calls.map((c, i) => `  ${i + 1}. ${c.command}${c.failed ? ' (failed)' : ''} ${c.target}`);

export function motoCallsReport(f: MotoCallsFigures): string {
  if (f.skipped)
    return `DynamoDB calls per warm-path allocation on the AWS path (moto): skipped, ${f.skipped}`;
  const lines = [
    `DynamoDB calls per warm-path allocation on the AWS path: the request function's handler on moto, one ` +
      `SQS record per batch, ${f.samples} allocations per variant after one to warm up`,
    '',
    table(
      f.variants.map((v) => [
        v.name,
        `${v.allocation.median} (${v.allocation.min}-${v.allocation.max})`,
        String(v.releaseCalls.length),
        String(v.ec2Calls),
        String(v.eventCalls),
        String(v.embeddedCalls.length),
        yesNo(v.sameAsEmbedded),
        `<= ${v.aim}`,
        yesNo(v.aimMet),
      ]),
      [
        'variant',
        'DynamoDB / allocation',
        '/ release',
        'EC2 (all)',
        'events / alloc.',
        'embedded',
        'same calls',
        'aim',
        'met',
      ],
    ),
  ];
  for (const v of f.variants) {
    lines.push('', `${v.name}: allocation, ${v.calls.length} DynamoDB calls`, ...callList(v.calls));
    if (!v.sameAsEmbedded)
      lines.push('  the embedded pool (bench/warmCalls.ts):', ...v.embeddedCalls.map((c) => `    ${c}`));
    lines.push(`${v.name}: release, ${v.releaseCalls.length} DynamoDB calls`, ...callList(v.releaseCalls));
  }
  return lines.join('\n');
}

/**
 * The same calls, each as often, whatever their order: calls sent together (the places' transaction and
 * the candidates' Query, or the slot claim) are listed as they answered, which moto and dynalite need not
 * do in the same order.
 */
export function sameCalls(a: readonly string[], b: readonly string[]): boolean {
  const sorted = (x: readonly string[]) => [...x].sort();
  const [x, y] = [sorted(a), sorted(b)];
  return x.length === y.length && x.every((c, i) => c === y[i]);
}

/** Aims as the embedded row's: max-servers set and unset (min-ready's figure is in the figures). */
const ROW_VARIANTS = ['max-servers-1000', 'max-servers-unset'];

export function motoCallsSummary(f: MotoCallsFigures): Array<{
  figure: string;
  measured: string;
  aim: string;
  met: string;
}> {
  const figure = 'DynamoDB calls per warm-path allocation on the AWS path (moto; max-servers-1000 / unset)';
  if (f.skipped) return [{ figure, measured: `not measured: ${f.skipped}`, aim: '<= 4 / 3', met: '-' }];
  const rows = ROW_VARIANTS.map((name) => f.variants.find((v) => v.name === name));
  const both = (g: (v: MotoVariant) => string) => rows.map((v) => (v ? g(v) : '?')).join(' / ');
  const ec2 = f.variants.reduce((s, v) => s + v.ec2Calls, 0);
  return [
    {
      figure,
      measured: `${both((v) => String(v.allocation.median))} (same calls as embedded: ${both((v) => yesNo(v.sameAsEmbedded))}; EC2 calls: ${ec2})`,
      aim: `<= ${both((v) => String(v.aim))}`,
      met: both((v) => yesNo(v.aimMet)),
    },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  console.log(motoCallsReport(await measureMotoCalls((l) => console.error(l))));
}
