/**
 * Allocation benchmark on the embedded engines (dynalite + fauxqs, in-process). Not a test: it measures
 * and reports, it never asserts timing. See bench/README.md for the method and the figures.
 *
 *   npm run bench            (or: npx tsx bench/allocation.bench.ts)
 *
 * Two variants of one configuration run one after the other, each on a fresh DevStack with its queue
 * pollers running: the metastatic pool with max-servers set (a capacity-set write per allocation) and
 * with max-servers unset. For each: one backing node is primed through the real launch/fulfil flow, then
 *   1. DynamoDB calls per warm-path allocation and per release (SDK middleware on the stack's client);
 *   2. enqueue-to-fulfilled latency of a warm-path request vs the floor of the same engines.
 * Writes bench/results.json.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import {
  CreateQueueCommand,
  DeleteMessageCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
} from '@aws-sdk/client-sqs';
import { DynamoDBDocumentClient, GetCommand, PutCommand, QueryCommand } from '@aws-sdk/lib-dynamodb';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import type { BackingRecord, RequestRecord } from '../shared/core/records.ts';
import { DevStack, REGION, TABLE_NAME } from '../shared/runtime/devStack.ts';
import { backingItem, FREE_INDEX, keys, requestItem } from '../shared/store/table.ts';
import type { Log } from '../shared/usecases/context.ts';

// ---- parameters -----------------------------------------------------------------------------------

/** Sequential warm-path allocations (+ releases) whose DynamoDB calls are counted. */
const COUNT_SAMPLES = 200;
/** Latency: warm-up pairs (real + floor) discarded, then measured pairs, interleaved. */
const LATENCY_WARMUP = 20;
const LATENCY_SAMPLES = 100;
/** Cross-check: requests observed from outside by a GetItem poller. */
const POLL_SAMPLES = 20;
const POLL_INTERVAL_MS = 2;
/** Long-poll wake-up probes (is a message sent during a waiting receive returned at once?). */
const WAKEUP_PROBES = 10;
/** A wake-up slower than this means fauxqs answers at the end of the wait, not on arrival. */
const WAKEUP_OK_MS = 250;
const METASTATIC_MAX_SERVERS = 1000;
const SLOTS = 64;
/** Pause after each handled message so the poller is back in its long-poll receive. */
const SETTLE_MS = 5;
const WAIT_LIMIT_MS = 30_000;

const AIM_CALLS_PER_ALLOCATION = 3;
const AIM_LATENCY_RATIO = 1.5;
const LABEL = 'small-node';

function configYaml(maxServers: number | undefined): string {
  return `
providers:
  - name: local
    driver: local
    pools:
      - name: main
        max-servers: 4
        labels:
          - name: large-node
            boot-delay: 0
  - name: meta
    driver: metastatic
    pools:
      - name: main
${maxServers === undefined ? '' : `        max-servers: ${maxServers}\n`}        labels:
          - name: ${LABEL}
            backing-label: large-node
            max-parallel-jobs: ${SLOTS}
            grace-time: 86400
`;
}

// ---- small helpers --------------------------------------------------------------------------------

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function within<T>(p: Promise<T>, what: string, ms = WAIT_LIMIT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
  });
  try {
    return await Promise.race([p, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Linear-interpolated quantile (q in [0, 1]) of unsorted numbers. */
function quantile(values: readonly number[], q: number): number {
  const s = [...values].sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

interface Summary {
  readonly median: number;
  readonly p90: number;
  readonly n: number;
}

const summarize = (values: readonly number[]): Summary => ({
  median: round(quantile(values, 0.5)),
  p90: round(quantile(values, 0.9)),
  n: values.length,
});

const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;

/** Logs only warnings and errors (to stderr): the stack's info logging would swamp the output. */
const log: Log = {
  debug() {},
  info() {},
  warn: (message, ...extra) => console.error(`[warn] ${message}`, ...extra),
  error: (message, ...extra) => console.error(`[error] ${message}`, ...extra),
};

// ---- instrumentation ------------------------------------------------------------------------------

/** DynamoDB commands seen while a window is open, by command name, and the time they took. */
class Window {
  readonly calls = new Map<string, number>();
  dynamodbMs = 0;

  total(): number {
    let n = 0;
    for (const c of this.calls.values()) n += c;
    return n;
  }
}

/**
 * SDK middleware on the stack's own clients: counts every DynamoDB command (per open window), notes the
 * moment a request item is written as `fulfilled`, and when the request queue's poller received and
 * deleted a message (so the benchmark knows a message was handled without touching the poller).
 */
class Probe {
  window: Window | undefined;
  lastReceivedAt = 0;
  private readonly fulfilled = new Map<string, (at: number) => void>();
  private readonly processed: Array<() => void> = [];

  constructor(
    stack: DevStack,
    private readonly requestQueueUrl: string,
  ) {
    stack.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const w = this.window;
        const name = (context.commandName ?? 'unknown').replace(/Command$/, '');
        if (w) w.calls.set(name, (w.calls.get(name) ?? 0) + 1);
        const started = performance.now();
        const out = await next(args);
        const ended = performance.now();
        if (w) w.dynamodbMs += ended - started;
        // At the initialize step the document client's input is not marshalled yet: plain values.
        const item = (args.input as { Item?: Record<string, unknown> }).Item;
        if (name === 'PutItem' && item?.sk === 'REQUEST' && item.state === 'fulfilled') {
          const id = String(item.id);
          this.fulfilled.get(id)?.(ended);
          this.fulfilled.delete(id);
        }
        return out;
      },
      { step: 'initialize', name: 'benchCounter' },
    );
    stack.sqs.middlewareStack.add(
      (next, context) => async (args) => {
        const out = await next(args);
        const input = args.input as { QueueUrl?: string };
        if (input.QueueUrl === this.requestQueueUrl) {
          if (context.commandName === 'ReceiveMessageCommand') {
            const messages = (out.output as { Messages?: unknown[] }).Messages ?? [];
            if (messages.length > 0) this.lastReceivedAt = performance.now();
          } else if (context.commandName === 'DeleteMessageBatchCommand') {
            this.processed.shift()?.();
          }
        }
        return out;
      },
      { step: 'initialize', name: 'benchQueueObserver' },
    );
  }

  /** Resolves with the time the PutItem writing request `id` as fulfilled returned. */
  whenFulfilled(id: string): Promise<number> {
    return new Promise((resolve) => this.fulfilled.set(id, resolve));
  }

  /** Resolves when the request queue's poller next deletes a batch (it has handled a message). */
  whenProcessed(): Promise<void> {
    return new Promise((resolve) => this.processed.push(resolve));
  }
}

// ---- one variant ----------------------------------------------------------------------------------

interface CallFigures {
  /** Mean calls per operation (they do not vary on the warm path; min/max show it). */
  readonly mean: number;
  readonly min: number;
  readonly max: number;
  /** Mean calls per operation by command name. */
  readonly byCommand: Record<string, number>;
}

interface LatencyFigures {
  /** SendMessage -> the PutItem writing the request `fulfilled` returned (in the request handler). */
  readonly real: Summary;
  /** SendMessage -> poller's ReceiveMessage returned. */
  readonly realQueueLeg: Summary;
  /** ReceiveMessage returned -> fulfilled write returned: the request handler up to its last write. */
  readonly realHandlerLeg: Summary;
  /** DynamoDB time inside the whole handled message (request handler). */
  readonly realDynamodbTime: Summary;
  /** Send + Receive + Query + conditional Put + Put + Delete, sequential. */
  readonly floor: Summary;
  /** The same floor up to its last DynamoDB write (no DeleteMessage): the real figure's exact counterpart. */
  readonly floorToLastWrite: Summary;
  readonly floorQueueLeg: Summary;
  readonly floorDynamodbLeg: Summary;
  readonly ratio: number;
  readonly ratioToLastWrite: number;
  /** Cross-check: SendMessage -> an external GetItem poller (separate client) first reads `fulfilled`. */
  readonly externalPoll: Summary;
}

interface VariantResult {
  readonly name: string;
  readonly maxServers: number | undefined;
  readonly primeMs: number;
  readonly allocation: CallFigures;
  readonly release: CallFigures;
  readonly floorCalls: Record<string, number>;
  readonly latency: LatencyFigures;
  readonly wakeupMs: Summary;
  readonly backingNodes: number;
}

function callFigures(windows: readonly Window[]): CallFigures {
  const totals = windows.map((w) => w.total());
  const byCommand: Record<string, number> = {};
  for (const w of windows) {
    for (const [name, n] of w.calls) byCommand[name] = (byCommand[name] ?? 0) + n;
  }
  for (const name of Object.keys(byCommand)) byCommand[name] = round((byCommand[name] ?? 0) / windows.length);
  return {
    mean: round(totals.reduce((a, b) => a + b, 0) / totals.length),
    min: Math.min(...totals),
    max: Math.max(...totals),
    byCommand: Object.fromEntries(Object.entries(byCommand).sort(([a], [b]) => (a < b ? -1 : 1))),
  };
}

async function runVariant(name: string, maxServers: number | undefined): Promise<VariantResult> {
  const stateDir = await mkdtemp(join(tmpdir(), 'metastatic-bench-'));
  const config = parseConfigOrThrow(configYaml(maxServers), `bench-${name}.yaml`);
  const stack = await DevStack.start({
    config,
    stateDir,
    reaperInterval: 3600, // the reaper never runs during the benchmark: its Queries would be counted
    log,
    inMemory: true,
  });
  const observer = new DynamoDBClient({
    endpoint: stack.info.dynamodbEndpoint,
    region: REGION,
    credentials: { accessKeyId: 'bench', secretAccessKey: 'bench' },
  });
  try {
    const { sqs } = stack;
    const doc = DynamoDBDocumentClient.from(stack.dynamodb, {
      marshallOptions: { removeUndefinedValues: true },
    });
    const probe = new Probe(stack, stack.info.requestQueueUrl);
    const send = (body: object) =>
      sqs.send(
        new SendMessageCommand({ QueueUrl: stack.info.requestQueueUrl, MessageBody: JSON.stringify(body) }),
      );

    // Prime one backing node through the real flow: request -> launch -> fulfil event -> ready.
    const primeStart = performance.now();
    const primeFulfilled = probe.whenFulfilled('prime');
    const primeProcessed = probe.whenProcessed();
    await send({ kind: 'request', id: 'prime', labels: [LABEL] });
    await within(primeProcessed, 'the priming request to be handled');
    await within(primeFulfilled, 'the priming request to be fulfilled (backing node ready)');
    const primeMs = performance.now() - primeStart;
    await sleep(200); // let any trailing provider events be handled before counting starts

    /** One warm-path request and its release, through the queue and the running pollers. */
    let seq = 0;
    const allocate = async (onSent?: (id: string, sentAt: number) => void) => {
      const id = `${name}-${seq++}`;
      const requestWindow = new Window();
      const releaseWindow = new Window();
      const fulfilled = probe.whenFulfilled(id);
      let processed = probe.whenProcessed();
      probe.window = requestWindow;
      const sentAt = performance.now();
      await send({ kind: 'request', id, labels: [LABEL] });
      onSent?.(id, sentAt);
      const fulfilledAt = await within(fulfilled, `request ${id} to be fulfilled`);
      await within(processed, `request ${id} to be handled`);
      const receivedAt = probe.lastReceivedAt;
      probe.window = undefined;
      await sleep(SETTLE_MS);
      processed = probe.whenProcessed();
      probe.window = releaseWindow;
      await send({ kind: 'release', nodeId: `${id}/0` });
      await within(processed, `release of ${id}/0 to be handled`);
      probe.window = undefined;
      await sleep(SETTLE_MS);
      return { id, sentAt, receivedAt, fulfilledAt, requestWindow, releaseWindow };
    };

    // 1. DynamoDB calls per warm-path allocation and release.
    const requestWindows: Window[] = [];
    const releaseWindows: Window[] = [];
    for (let i = 0; i < COUNT_SAMPLES; i++) {
      const s = await allocate();
      requestWindows.push(s.requestWindow);
      releaseWindows.push(s.releaseWindow);
    }

    // Long-poll wake-up on the same fauxqs: a receive waits, a message is sent 50 ms later.
    const floorQueueUrl = (await sqs.send(new CreateQueueCommand({ QueueName: 'bench-floor' })))
      .QueueUrl as string;
    const wakeups: number[] = [];
    for (let i = 0; i < WAKEUP_PROBES; i++) {
      const receive = sqs.send(
        new ReceiveMessageCommand({ QueueUrl: floorQueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }),
      );
      await sleep(50);
      const sentAt = performance.now();
      await sqs.send(new SendMessageCommand({ QueueUrl: floorQueueUrl, MessageBody: 'wake' }));
      const out = await receive;
      wakeups.push(performance.now() - sentAt);
      for (const m of out.Messages ?? []) {
        await sqs.send(new DeleteMessageCommand({ QueueUrl: floorQueueUrl, ReceiptHandle: m.ReceiptHandle }));
      }
    }

    // 2. The floor: the same engines and clients, an allocation's minimal work, no metastatic code.
    const backing = (await stack.context.store.listBacking())[0] as BackingRecord;
    const sampleRequest = (await stack.context.store.getRequest(`${name}-0`)) as RequestRecord;
    const floorPartition = `FREE#bench-floor#${name}`;
    let floorVersion = 0;
    const floorBacking = () => ({
      ...backingItem({ ...backing, version: floorVersion }),
      ...keys.backing(`bench-floor-${name}`),
      fpk: floorPartition,
      fsk: `${String(floorVersion).padStart(5, '0')}#${backing.launchedAt}#bench-floor`,
      rpk: undefined,
      rsk: undefined,
    });
    const floorRequest = (n: number) => ({
      ...requestItem({
        ...sampleRequest,
        id: `bench-floor-${name}-${n}`,
        state: 'fulfilled',
        nodes: sampleRequest.nodes.map(({ releasedAt: _, ...node }) => ({
          ...node,
          state: 'ready' as const,
        })),
      }),
      sk: 'FLOOR', // not a request item: the probe's fulfilled hook ignores it
    });
    await doc.send(new PutCommand({ TableName: TABLE_NAME, Item: floorBacking() }));
    const floorWindows: Window[] = [];
    let floorSeq = 0;
    const floorSample = async () => {
      const w = new Window();
      probe.window = w;
      const t0 = performance.now();
      await sqs.send(new SendMessageCommand({ QueueUrl: floorQueueUrl, MessageBody: JSON.stringify({}) }));
      const out = await sqs.send(
        new ReceiveMessageCommand({
          QueueUrl: floorQueueUrl,
          MaxNumberOfMessages: 10,
          WaitTimeSeconds: 1,
          MessageSystemAttributeNames: ['All'],
          MessageAttributeNames: ['All'],
        }),
      );
      const t1 = performance.now();
      await doc.send(
        new QueryCommand({
          TableName: TABLE_NAME,
          IndexName: FREE_INDEX,
          KeyConditionExpression: 'fpk = :p',
          ExpressionAttributeValues: { ':p': floorPartition },
          Limit: 10,
        }),
      );
      const expected = floorVersion++;
      await doc.send(
        new PutCommand({
          TableName: TABLE_NAME,
          Item: floorBacking(),
          ConditionExpression: '#version = :expectedVersion AND #state IN (:s0, :s1)',
          ExpressionAttributeNames: { '#version': 'version', '#state': 'state' },
          ExpressionAttributeValues: { ':expectedVersion': expected, ':s0': 'launching', ':s1': 'ready' },
        }),
      );
      await doc.send(new PutCommand({ TableName: TABLE_NAME, Item: floorRequest(floorSeq++) }));
      const t2 = performance.now();
      const message = out.Messages?.[0];
      if (!message) throw new Error('floor: the message just sent was not received');
      await sqs.send(
        new DeleteMessageCommand({ QueueUrl: floorQueueUrl, ReceiptHandle: message.ReceiptHandle }),
      );
      const t3 = performance.now();
      probe.window = undefined;
      floorWindows.push(w);
      return { total: t3 - t0, toLastWrite: t2 - t0, queueLeg: t1 - t0, dynamodbLeg: t2 - t1 };
    };

    // Interleaved real/floor pairs, the first LATENCY_WARMUP pairs discarded.
    const real: number[] = [];
    const realQueue: number[] = [];
    const realHandler: number[] = [];
    const realDynamodb: number[] = [];
    const floor: number[] = [];
    const floorToLastWrite: number[] = [];
    const floorQueue: number[] = [];
    const floorDynamodb: number[] = [];
    for (let i = 0; i < LATENCY_WARMUP + LATENCY_SAMPLES; i++) {
      const r = await allocate();
      const f = await floorSample();
      await sleep(SETTLE_MS);
      if (i < LATENCY_WARMUP) continue;
      real.push(r.fulfilledAt - r.sentAt);
      realQueue.push(r.receivedAt - r.sentAt);
      realHandler.push(r.fulfilledAt - r.receivedAt);
      realDynamodb.push(r.requestWindow.dynamodbMs);
      floor.push(f.total);
      floorToLastWrite.push(f.toLastWrite);
      floorQueue.push(f.queueLeg);
      floorDynamodb.push(f.dynamodbLeg);
    }

    // Cross-check from outside: a separate client polls GetItem every 2 ms until it reads `fulfilled`.
    const observerDoc = DynamoDBDocumentClient.from(observer);
    const polled: number[] = [];
    for (let i = 0; i < POLL_SAMPLES; i++) {
      let watch: Promise<number> = Promise.resolve(Number.NaN);
      await allocate((id, sentAt) => {
        watch = (async () => {
          for (;;) {
            const out = await observerDoc.send(
              new GetCommand({ TableName: TABLE_NAME, Key: keys.request(id), ConsistentRead: true }),
            );
            if (out.Item?.state === 'fulfilled' || out.Item?.state === 'released') {
              return performance.now() - sentAt;
            }
            if (performance.now() - sentAt > WAIT_LIMIT_MS) throw new Error(`poll: ${id} never fulfilled`);
            await sleep(POLL_INTERVAL_MS);
          }
        })();
      });
      polled.push(await watch);
    }

    const backingNodes = (await stack.context.store.listBacking()).length;
    const floorCalls = callFigures(floorWindows).byCommand;
    const medianReal = quantile(real, 0.5);
    return {
      name,
      maxServers,
      primeMs: round(primeMs, 1),
      allocation: callFigures(requestWindows),
      release: callFigures(releaseWindows),
      floorCalls,
      latency: {
        real: summarize(real),
        realQueueLeg: summarize(realQueue),
        realHandlerLeg: summarize(realHandler),
        realDynamodbTime: summarize(realDynamodb),
        floor: summarize(floor),
        floorToLastWrite: summarize(floorToLastWrite),
        floorQueueLeg: summarize(floorQueue),
        floorDynamodbLeg: summarize(floorDynamodb),
        ratio: round(medianReal / quantile(floor, 0.5), 2),
        ratioToLastWrite: round(medianReal / quantile(floorToLastWrite, 0.5), 2),
        externalPoll: summarize(polled),
      },
      wakeupMs: summarize(wakeups),
      backingNodes,
    };
  } finally {
    observer.destroy();
    await stack.stop();
    await rm(stateDir, { recursive: true, force: true });
  }
}

// ---- report ---------------------------------------------------------------------------------------

function table(rows: readonly (readonly string[])[], header: readonly string[]): string {
  const all = [header, ...rows];
  const widths = header.map((_, c) => Math.max(...all.map((r) => (r[c] ?? '').length)));
  const line = (r: readonly string[]) =>
    r
      .map((cell, c) => (c === 0 ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0)))
      .join('   ')
      .trimEnd();
  const rule = widths.map((w) => '-'.repeat(w)).join('   ');
  return [line(header), rule, ...rows.map(line)].join('\n');
}

const fmtCalls = (f: CallFigures) => (f.min === f.max ? String(f.mean) : `${f.mean} (${f.min}-${f.max})`);
const fmtMs = (s: Summary) => `${s.median.toFixed(2)} / ${s.p90.toFixed(2)}`;
const yesNo = (ok: boolean) => (ok ? 'yes' : 'NO');

function report(variants: readonly VariantResult[]): string {
  const header = ['', ...variants.map((v) => v.name), 'aim', 'met'];
  const commands = [...new Set(variants.flatMap((v) => [...Object.keys(v.allocation.byCommand)]))].sort();
  const releaseCommands = [...new Set(variants.flatMap((v) => Object.keys(v.release.byCommand)))].sort();
  const callRows: string[][] = [
    [
      'per allocation (request handler)',
      ...variants.map((v) => fmtCalls(v.allocation)),
      `<= ${AIM_CALLS_PER_ALLOCATION}`,
      variants.map((v) => yesNo(v.allocation.max <= AIM_CALLS_PER_ALLOCATION)).join(' / '),
    ],
    ...commands.map((c) => [
      `  ${c}`,
      ...variants.map((v) => String(v.allocation.byCommand[c] ?? 0)),
      '',
      '',
    ]),
    ['per release', ...variants.map((v) => fmtCalls(v.release)), '', ''],
    ...releaseCommands.map((c) => [
      `  ${c}`,
      ...variants.map((v) => String(v.release.byCommand[c] ?? 0)),
      '',
      '',
    ]),
    [
      'floor (for comparison)',
      ...variants.map((v) => String(Object.values(v.floorCalls).reduce((a, b) => a + b, 0))),
      '',
      '',
    ],
  ];
  const lat = (pick: (l: LatencyFigures) => Summary) => variants.map((v) => fmtMs(pick(v.latency)));
  const latencyRows: string[][] = [
    ['real: SendMessage -> request fulfilled', ...lat((l) => l.real), '', ''],
    ['  queue leg: send -> poller receive returned', ...lat((l) => l.realQueueLeg), '', ''],
    ['  handler leg: receive -> fulfilled write', ...lat((l) => l.realHandlerLeg), '', ''],
    ['  DynamoDB time in the request handler', ...lat((l) => l.realDynamodbTime), '', ''],
    ['floor: send+receive+3 DynamoDB+delete', ...lat((l) => l.floor), '', ''],
    ['  queue leg: send + receive', ...lat((l) => l.floorQueueLeg), '', ''],
    ['  DynamoDB leg: Query + cond. Put + Put', ...lat((l) => l.floorDynamodbLeg), '', ''],
    ['  floor without DeleteMessage', ...lat((l) => l.floorToLastWrite), '', ''],
    [
      'ratio real/floor (medians)',
      ...variants.map((v) => v.latency.ratio.toFixed(2)),
      `<= ${AIM_LATENCY_RATIO}`,
      variants.map((v) => yesNo(v.latency.ratio <= AIM_LATENCY_RATIO)).join(' / '),
    ],
    [
      'ratio real/floor without DeleteMessage',
      ...variants.map((v) => v.latency.ratioToLastWrite.toFixed(2)),
      `<= ${AIM_LATENCY_RATIO}`,
      variants.map((v) => yesNo(v.latency.ratioToLastWrite <= AIM_LATENCY_RATIO)).join(' / '),
    ],
    [`cross-check: external ${POLL_INTERVAL_MS} ms GetItem poll`, ...lat((l) => l.externalPoll), '', ''],
  ];
  const infoRows: string[][] = [
    ['long-poll wake-up (send -> waiting receive)', ...variants.map((v) => fmtMs(v.wakeupMs)), '', ''],
    ['priming: cold request -> fulfilled (ms)', ...variants.map((v) => v.primeMs.toFixed(1)), '', ''],
    ['backing nodes at the end (warm path = 1)', ...variants.map((v) => String(v.backingNodes)), '', ''],
  ];
  return [
    `DynamoDB calls per operation (warm path, ${COUNT_SAMPLES} sequential allocations + releases)`,
    table(callRows, header),
    '',
    `Latency in ms, median / p90 (${LATENCY_SAMPLES} interleaved real/floor pairs after ${LATENCY_WARMUP} warm-up; cross-check ${POLL_SAMPLES})`,
    table(latencyRows, header),
    '',
    table(infoRows, header),
  ].join('\n');
}

async function main(): Promise<void> {
  const started = performance.now();
  const machine = {
    cpus: cpus().length,
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
  };
  console.log(
    `metastatic allocation benchmark: embedded engines (dynalite + fauxqs, in-process), ` +
      `${machine.cpus} cpus, node ${machine.node}, ${machine.platform}\n`,
  );
  const variants: VariantResult[] = [];
  for (const [name, maxServers] of [
    [`max-servers ${METASTATIC_MAX_SERVERS}`, METASTATIC_MAX_SERVERS],
    ['max-servers unset', undefined],
  ] as const) {
    process.stdout.write(`running variant "${name}"...\n`);
    variants.push(await runVariant(name.replace(/ /g, '-'), maxServers));
  }
  console.log('');
  console.log(report(variants));
  const wakeupOk = variants.every((v) => v.wakeupMs.median < WAKEUP_OK_MS);
  console.log(
    wakeupOk
      ? '\nfauxqs returns a message sent during a waiting long-poll receive at once: the poller wait is not counted.'
      : `\nWARNING: fauxqs answered waiting receives only after ${WAKEUP_OK_MS}+ ms: the real latency includes ` +
          'the long-poll wait and is not comparable with the floor.',
  );
  const seconds = (performance.now() - started) / 1000;
  console.log(`total ${seconds.toFixed(1)} s`);

  const results = {
    machine,
    date: new Date().toISOString(),
    figures: {
      parameters: {
        countSamples: COUNT_SAMPLES,
        latencyWarmup: LATENCY_WARMUP,
        latencySamples: LATENCY_SAMPLES,
        pollSamples: POLL_SAMPLES,
        pollIntervalMs: POLL_INTERVAL_MS,
        slotsPerBackingNode: SLOTS,
      },
      aims: { dynamodbCallsPerAllocation: AIM_CALLS_PER_ALLOCATION, latencyRatio: AIM_LATENCY_RATIO },
      longPollWakeupPrompt: wakeupOk,
      variants: Object.fromEntries(
        variants.map((v) => [
          v.name,
          {
            metastaticMaxServers: v.maxServers ?? null,
            dynamodbCallsPerAllocation: {
              ...v.allocation,
              aimMet: v.allocation.max <= AIM_CALLS_PER_ALLOCATION,
            },
            dynamodbCallsPerRelease: v.release,
            floorDynamodbCalls: v.floorCalls,
            latencyMs: { ...v.latency, aimMet: v.latency.ratio <= AIM_LATENCY_RATIO },
            longPollWakeupMs: v.wakeupMs,
            primeColdRequestMs: v.primeMs,
            backingNodesAtEnd: v.backingNodes,
          },
        ]),
      ),
      totalSeconds: round(seconds, 1),
    },
  };
  const out = fileURLToPath(new URL('./results.json', import.meta.url));
  await writeFile(out, `${JSON.stringify(results, null, 2)}\n`);
  console.log(`wrote ${out}`);
}

await main();
