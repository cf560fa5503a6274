/**
 * Part 10: how long a new EC2 backing node takes to become ready once its SSH host keys are in its console
 * output (issue 40, defect 2): the seconds from the moment cloud-init's host-key block shows to the moment
 * the backing node is recorded ready, on the simulated EC2 (testkit/fakeEc2.ts), its console output
 * appearing late, as on real EC2 (a minute or more after `running`).
 *
 * The AWS path as the stack runs it: the request and fulfil use cases and handlers of the Lambda
 * functions (awsContext, host keys from the console: the functions outside the VPC), on an in-process
 * dynalite, with the fulfil queue and the reaper's schedule played on a manual clock: an EC2 event reaches
 * the fulfil handler when it happens; a record the handler fails comes back after the queue's visibility
 * timeout (180 s); a record it sends back (FulfilHandlerOptions.retryLater) comes back after its delay;
 * the reaper runs every minute. Each trial launches one instance (max-parallel-jobs 1), its host keys
 * showing `consoleDelay` after it runs (spread evenly over 30-90 s across trials) and the reaper's minute
 * at a phase spread likewise. The time calls take is not simulated (they take none of the clock's).
 *
 * Two ways, side by side: with the fulfil function sending the event back, delayed (what it does now),
 * and without (the record fails and comes back after the visibility timeout, so the reaper's next run
 * readies it: before issue 40).
 *
 *   npx tsx bench/boot.ts      (this part alone; `npm run bench` runs it with the others)
 */

import { pathToFileURL } from 'node:url';
import { EventBridgeClient } from '@aws-sdk/client-eventbridge';
import type { SQSEvent, SQSRecord } from 'aws-lambda';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { ManualClock } from '../shared/core/clock.ts';
import {
  BOOT_RETRY_SECONDS,
  FUNCTION_TIMEOUT_SECONDS,
  visibilityTimeoutSeconds,
} from '../shared/core/timing.ts';
import { makeFulfilHandler } from '../shared/handlers/fulfilHandler.ts';
import { TAG_BACKING_NODE_ID } from '../shared/providers/aws/runInstancesRequest.ts';
import { awsContext } from '../shared/runtime/awsContext.ts';
import { ensureTable } from '../shared/runtime/engines.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { requestNodes } from '../shared/usecases/place/requestNodes.ts';
import { reap } from '../shared/usecases/reap/reap.ts';
import { poolConfig } from '../testkit/configs.ts';
import { FakeEc2 } from '../testkit/fakeEc2.ts';
import { startInProcessDynalite } from '../testkit/inProcessDynalite.ts';
import { log, quantile, round, table, yesNo } from './common.ts';

export const BOOT = {
  /** Trials per way: one instance each. */
  trials: 40,
  /** pending -> running, as the fake's default. */
  bootDelayMs: 30_000,
  /** running -> host keys in the console output: spread evenly over this range across trials. */
  consoleDelayMs: [30_000, 90_000] as const,
  reaperIntervalMs: 60_000,
  visibilitySeconds: visibilityTimeoutSeconds(FUNCTION_TIMEOUT_SECONDS.fulfil),
  /** The aims: seconds from host keys to ready, p50 and p95. */
  aimP50Seconds: 10,
  aimP95Seconds: 20,
} as const;

export interface BootWay {
  /** `sent back`: the fulfil function sends the event back, delayed; `visibility`: the record fails. */
  readonly way: 'sent back' | 'visibility';
  /** Seconds from the host keys in the console output to the backing node ready, one per trial. */
  readonly seconds: readonly number[];
  readonly p50: number;
  readonly p95: number;
  readonly max: number;
  /** Trials whose backing node the reaper readied (the rest: a fulfil delivery). */
  readonly byReaper: number;
  /** Fulfil deliveries per trial (the first event and every try after it), mean. */
  readonly deliveriesPerTrial: number;
  /** Console reads (GetConsoleOutput) per trial, mean. */
  readonly consoleReadsPerTrial: number;
  /** Trials that did not end ready (none expected). */
  readonly notReady: number;
}

export interface BootFigures {
  readonly trials: number;
  readonly consoleDelaySeconds: readonly [number, number];
  readonly retrySeconds: typeof BOOT_RETRY_SECONDS;
  readonly visibilitySeconds: number;
  readonly reaperIntervalSeconds: number;
  readonly ways: readonly BootWay[];
  readonly aim: { readonly p50: number; readonly p95: number };
  readonly aimMet: boolean;
}

const CONFIG = poolConfig({
  backing: {
    driver: 'aws',
    provider: { region: 'eu-west-1' },
    pool: { 'subnet-ids': ['subnet-a'], 'security-group-id': 'sg-1' },
    labels: [{ name: 'large', 'instance-types': ['m7g.2xlarge'], 'image-id': 'ami-123' }],
  },
  meta: { labels: [{ name: 'small', 'backing-label': 'large', 'max-parallel-jobs': 1 }] },
});

/** An SQS record of the fulfil queue, as Lambda hands one over. */
function record(body: string, n: number): SQSRecord {
  return {
    messageId: `m-${n}`,
    receiptHandle: `rh-${n}`,
    body,
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: '0',
      SenderId: 'bench',
      ApproximateFirstReceiveTimestamp: '0',
    },
    messageAttributes: {},
    md5OfBody: '',
    eventSource: 'aws:sqs',
    eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:fulfil',
    awsRegion: 'eu-west-1',
  };
}

async function measureWay(
  engine: Awaited<ReturnType<typeof startInProcessDynalite>>,
  way: BootWay['way'],
): Promise<BootWay> {
  const tableName = `bench-boot-${way.replace(' ', '-')}`;
  await ensureTable(engine.client, tableName);
  const clock = new ManualClock(Date.parse('2026-06-01T00:00:00Z'));
  /** The fulfil queue: bodies and when each is received. */
  let queue: { body: string; dueAt: number }[] = [];
  const ec2 = new FakeEc2({
    region: 'eu-west-1',
    clock,
    bootDelayMs: BOOT.bootDelayMs,
    onEvent: (e) => void queue.push({ body: JSON.stringify(e), dueAt: clock.now() }),
  });
  try {
    const ctx: Context = awsContext({
      config: parseConfigOrThrow(CONFIG, 'bench-boot.yaml'),
      store: new DynamoStore(engine.client, tableName, clock),
      region: 'eu-west-1',
      poolId: 'bench-pool',
      clock,
      log,
      ec2Client: () => ec2.client,
      eventBridge: new EventBridgeClient({ region: 'eu-west-1' }),
    });
    const events: Context = { ...ctx, events: undefined };
    const fulfil = makeFulfilHandler(
      events,
      way === 'sent back'
        ? {
            retryLater: async (r, seconds) =>
              void queue.push({ body: r.body, dueAt: clock.now() + seconds * 1000 }),
          }
        : {},
    );
    const seconds: number[] = [];
    let byReaper = 0;
    let deliveries = 0;
    let notReady = 0;
    let messages = 0;
    const reads: number[] = [];
    const [low, high] = BOOT.consoleDelayMs;
    for (let i = 0; i < BOOT.trials; i++) {
      const share = (i + 0.5) / BOOT.trials;
      ec2.consoleDelayMs = Math.round(low + (high - low) * share);
      ec2.resetCalls();
      const id = `boot-${i}`;
      await requestNodes(events, { kind: 'request', id, labels: ['small'] });
      const backingId = (await ctx.store.getRequest(id))?.nodes[0]?.backingNodeId as string;
      await ec2.advance(BOOT.bootDelayMs);
      const instance = ec2.instances.find((x) => x.tags[TAG_BACKING_NODE_ID] === backingId);
      const runningAt = instance?.runningAt ?? clock.now();
      const keysAt = runningAt + ec2.consoleDelayMs;
      // The reaper's minute, at a phase of its own relative to this instance's boot.
      let nextReap =
        runningAt + Math.round((BOOT.reaperIntervalMs * ((i * 7 + 3) % BOOT.trials)) / BOOT.trials);
      const until = runningAt + 300_000;
      let readyAt: number | undefined;
      let readiedByReaper = false;
      while (readyAt === undefined && clock.now() < until) {
        const nextMessage = Math.min(...queue.map((m) => m.dueAt));
        const at = Math.min(nextMessage, nextReap);
        clock.set(Math.max(clock.now(), at));
        if (nextMessage <= nextReap) {
          const due = queue.filter((m) => m.dueAt <= clock.now());
          queue = queue.filter((m) => m.dueAt > clock.now());
          const batch: SQSEvent = { Records: due.map((m) => record(m.body, ++messages)) };
          deliveries += due.length;
          const out = await fulfil(batch);
          const failed = new Set(out.batchItemFailures.map((f) => f.itemIdentifier));
          for (const r of batch.Records) {
            if (failed.has(r.messageId)) {
              queue.push({ body: r.body, dueAt: clock.now() + BOOT.visibilitySeconds * 1000 });
            }
          }
        } else {
          await reap(events);
          nextReap += BOOT.reaperIntervalMs;
          const b = await ctx.store.getBacking(backingId);
          if (b?.state === 'ready') readiedByReaper = true;
        }
        const b = await ctx.store.getBacking(backingId);
        if (b?.state === 'ready') readyAt = b.readyAt ?? clock.now();
      }
      if (readyAt === undefined) {
        notReady++;
      } else {
        seconds.push((readyAt - keysAt) / 1000);
        if (readiedByReaper) byReaper++;
      }
      // The trial's leftovers (copies still queued for a ready backing node) are not the next one's.
      queue = [];
      clock.advance(BOOT.reaperIntervalMs);
      reads.push(ec2.inputs('GetConsoleOutput').length);
    }
    return {
      way,
      seconds: seconds.map((s) => round(s, 1)),
      p50: round(quantile(seconds, 0.5), 1),
      p95: round(quantile(seconds, 0.95), 1),
      max: round(Math.max(...seconds), 1),
      byReaper,
      deliveriesPerTrial: round(deliveries / BOOT.trials, 1),
      consoleReadsPerTrial: round(reads.reduce((a, b) => a + b, 0) / BOOT.trials, 1),
      notReady,
    };
  } finally {
    ec2.restore();
  }
}

export async function measureBoot(progress: (line: string) => void = () => {}): Promise<BootFigures> {
  const engine = await startInProcessDynalite();
  try {
    const ways: BootWay[] = [];
    for (const way of ['sent back', 'visibility'] as const) {
      progress(`boot: ${BOOT.trials} instances whose host keys show 30-90 s after running (${way})...`);
      ways.push(await measureWay(engine, way));
    }
    const now = ways[0] as BootWay;
    return {
      trials: BOOT.trials,
      consoleDelaySeconds: [BOOT.consoleDelayMs[0] / 1000, BOOT.consoleDelayMs[1] / 1000],
      retrySeconds: BOOT_RETRY_SECONDS,
      visibilitySeconds: BOOT.visibilitySeconds,
      reaperIntervalSeconds: BOOT.reaperIntervalMs / 1000,
      ways,
      aim: { p50: BOOT.aimP50Seconds, p95: BOOT.aimP95Seconds },
      aimMet: now.notReady === 0 && now.p50 <= BOOT.aimP50Seconds && now.p95 <= BOOT.aimP95Seconds,
    };
  } finally {
    await engine.close();
  }
}

export function bootReport(f: BootFigures): string {
  const row = (label: string, pick: (w: BootWay) => string) => [label, ...f.ways.map(pick)];
  return [
    `10. From host keys in the console output to node ready: ${f.trials} EC2 instances (testkit/fakeEc2.ts), keys ${f.consoleDelaySeconds[0]}-${f.consoleDelaySeconds[1]} s after running, reaper every ${f.reaperIntervalSeconds} s, fulfil queue visibility ${f.visibilitySeconds} s (bench/boot.ts)`,
    table(
      [
        row('seconds from keys to ready, p50 / p95', (w) => `${w.p50.toFixed(1)} / ${w.p95.toFixed(1)}`),
        row('  max', (w) => w.max.toFixed(1)),
        row('readied by the reaper / trials', (w) => `${w.byReaper} / ${f.trials}`),
        row('fulfil deliveries per trial (mean)', (w) => w.deliveriesPerTrial.toFixed(1)),
        row('GetConsoleOutput per trial (mean)', (w) => w.consoleReadsPerTrial.toFixed(1)),
        row('not ready', (w) => String(w.notReady)),
      ],
      [
        '',
        ...f.ways.map((w) => (w.way === 'sent back' ? 'event sent back, delayed' : 'record fails (before)')),
      ],
    ),
    `tries ${f.retrySeconds.first}, ${f.retrySeconds.first * 2}, ${f.retrySeconds.first * 4} s... at most ${f.retrySeconds.cap} s apart; aim p50 <= ${f.aim.p50} s and p95 <= ${f.aim.p95} s: ${yesNo(f.aimMet)}`,
  ].join('\n');
}

export function bootSummary(f: BootFigures) {
  const now = f.ways.find((w) => w.way === 'sent back');
  const before = f.ways.find((w) => w.way === 'visibility');
  return [
    {
      figure: 'seconds from host keys in the console output to node ready (p50 / p95)',
      measured: now
        ? `${now.p50.toFixed(1)} / ${now.p95.toFixed(1)}${before ? ` (record failing: ${before.p50.toFixed(1)} / ${before.p95.toFixed(1)})` : ''}`
        : '-',
      aim: `<= ${f.aim.p50} / ${f.aim.p95}`,
      met: yesNo(f.aimMet),
    },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const figures = await measureBoot((line) => console.log(line));
  console.log(bootReport(figures));
  console.log(
    table(
      bootSummary(figures).map((r) => [r.figure, r.measured, r.aim, r.met]),
      ['figure', 'measured', 'aim', 'met'],
    ),
  );
}
