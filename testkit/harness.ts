import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import type { SQSEvent, SQSRecord } from 'aws-lambda';
import { onTestFailed } from 'vitest';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { ManualClock } from '../shared/core/clock.ts';
import { type Log, silentLog } from '../shared/core/log.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import { EmbeddedPool } from '../shared/runtime/embeddedPool.ts';
import { SqsPoller } from '../shared/runtime/sqsPoller.ts';

/**
 * What the pool logged (info and up), kept quiet unless the test fails: then they are printed, so a
 * failure that depends on timing (a backing process that died, a scan that failed) shows its cause.
 */
function recordingLog(): Log {
  const lines: string[] = [];
  const keep =
    (level: string) =>
    (message: string, fields?: object): void => {
      lines.push(`${new Date().toISOString()} ${level} ${message} ${JSON.stringify(fields ?? {})}`);
    };
  try {
    onTestFailed(() => {
      if (lines.length > 0) console.error(`what the pool logged:\n${lines.join('\n')}`);
    });
  } catch {
    // Started outside a test (beforeAll): nothing to attach the report to.
  }
  return { debug() {}, info: keep('info'), warn: keep('warn'), error: keep('error') };
}

/**
 * A test pool: the embedded pool (dynalite in memory, fauxqs, the real local provider) with the queue
 * pollers off, so a test decides when each queue is drained and what time it is.
 */
export interface Harness {
  readonly pool: EmbeddedPool;
  readonly clock: ManualClock;
  /** Sends a raw body to the request queue. */
  send(body: unknown): Promise<void>;
  /** Drains the request queue once through the request handler. */
  drainRequests(): Promise<number>;
  /**
   * Waits for provider events and drains the fulfil queue until `until` holds, or fails after `timeoutMs`
   * (default 45 s: backing processes boot in about a second, many times that on a loaded machine).
   */
  fulfilUntil(until: () => Promise<boolean>, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

/**
 * `config`: the YAML text, or a configuration already resolved (one the current validation would refuse,
 * as a pool deployed by an earlier version runs it).
 */
export async function startHarness(
  config: string | ResolvedConfig,
  options: {
    maxReceiveCount?: number;
    /** The pool's waiting budget, seconds; default a week, so no test's clock reaches it unawares. */
    waitingBudgetSeconds?: number;
    /**
     * Back off waiting requests' messages (default off: with a visibility timeout of 0, a waiting
     * request comes back at the next drain, whatever the test's clock says).
     */
    backOff?: boolean;
    /**
     * Skip a waiting request's attempt when nothing was freed since its last (default off: tests write
     * the table directly, behind the counting store's back).
     */
    skipUnchanged?: boolean;
  } = {},
): Promise<Harness> {
  const stateDir = await mkdtemp(join(tmpdir(), 'metastatic-test-'));
  const clock = new ManualClock(Date.now());
  const pool = await EmbeddedPool.start({
    config: typeof config === 'string' ? parseConfigOrThrow(config, 'test.yaml') : config,
    stateDir,
    reaperInterval: 3600,
    log: recordingLog(),
    clock,
    inMemory: true,
    noPollers: true,
    visibilityTimeout: 0,
    maxReceiveCount: options.maxReceiveCount ?? 3,
    waitingBudgetSeconds: options.waitingBudgetSeconds ?? 7 * 86400,
    backOff: options.backOff ?? false,
    skipUnchanged: options.skipUnchanged ?? false,
  });
  const requestPoller = new SqsPoller(
    pool.sqs,
    pool.info.requestQueueUrl,
    'arn:test:requests',
    pool.handlers.request,
    silentLog,
    {
      waitSeconds: 0,
    },
  );
  const fulfilPoller = new SqsPoller(
    pool.sqs,
    pool.info.fulfilQueueUrl,
    'arn:test:fulfil',
    pool.handlers.fulfil,
    silentLog,
    {
      waitSeconds: 0,
    },
  );
  return {
    pool,
    clock,
    async send(body) {
      await pool.sqs.send(
        new SendMessageCommand({
          QueueUrl: pool.info.requestQueueUrl,
          MessageBody: typeof body === 'string' ? body : JSON.stringify(body),
        }),
      );
    },
    async drainRequests() {
      let total = 0;
      for (;;) {
        const n = await requestPoller.pollOnce();
        total += n;
        if (n === 0) return total;
      }
    },
    async fulfilUntil(until, timeoutMs = 45_000) {
      const deadline = Date.now() + timeoutMs;
      while (!(await until())) {
        if (Date.now() > deadline) throw new Error('condition not reached before timeout');
        const n = await fulfilPoller.pollOnce();
        if (n === 0) await new Promise((r) => setTimeout(r, 20));
      }
    },
    async close() {
      await pool.stop();
      await rm(stateDir, { recursive: true, force: true });
    },
  };
}

/** A hand-built SQS event, for handler tests that need exact control over a batch. */
/** Requests one small-node node under `id` and drives the queues until the request is fulfilled. */
export async function readyNode(harness: Harness, id: string): Promise<void> {
  await harness.send({ kind: 'request', id, labels: ['small-node'] });
  await harness.drainRequests();
  await harness.fulfilUntil(
    async () => (await harness.pool.context.store.getRequest(id))?.state === 'fulfilled',
  );
}

export function sqsEvent(bodies: readonly string[], receiveCount = 1, sentAt = 0): SQSEvent {
  return {
    Records: bodies.map(
      (body, i): SQSRecord => ({
        messageId: `m-${i}`,
        receiptHandle: `rh-${i}`,
        body,
        attributes: {
          ApproximateReceiveCount: String(receiveCount),
          SentTimestamp: String(sentAt),
          SenderId: 'test',
          ApproximateFirstReceiveTimestamp: '0',
        },
        messageAttributes: {},
        md5OfBody: '',
        eventSource: 'aws:sqs',
        eventSourceARN: 'arn:test:requests',
        awsRegion: 'us-east-1',
      }),
    ),
  };
}
