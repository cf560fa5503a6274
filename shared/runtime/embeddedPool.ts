import { rm } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SQSClient } from '@aws-sdk/client-sqs';
import { type Clock, systemClock } from '../core/clock.ts';
import type { Log } from '../core/log.ts';
import type { ResolvedConfig } from '../core/model.ts';
import {
  backstopReceiveCount,
  EMBEDDED_VISIBILITY_SECONDS,
  WAITING_BACKOFF_CAP_SECONDS,
  WAITING_BUDGET_SECONDS,
} from '../core/timing.ts';
import { makeFulfilHandler } from '../handlers/fulfilHandler.ts';
import { makeReaperHandler } from '../handlers/reaperHandler.ts';
import { makeDeadLetterHandler, makeRequestHandler } from '../handlers/requestHandler.ts';
import type { LocalProvider } from '../providers/local/localProvider.ts';
import { DynamoStore } from '../store/dynamoStore.ts';
import type { Context } from '../usecases/context.ts';
import { LastAttempts } from '../usecases/place/waitingBudget.ts';
import { drainBacking, holdNode } from '../usecases/reap/operator.ts';
import type { ReapReport } from '../usecases/reap/reapReport.ts';
import { failBackingNode } from '../usecases/release/failure.ts';
import { type ClientKey, ensureClientKey } from './clientKey.ts';
import { embeddedContext } from './embeddedContext.ts';
import { type EmbeddedInfo, embeddedInfoPath, writeEmbeddedInfo } from './embeddedInfo.ts';
import {
  type Engine,
  ensureQueue,
  ensureTable,
  localDynamoClient,
  localEngineClientConfig,
  startDynalite,
  startSqsEngine,
} from './engines.ts';
import { sendBackTo } from './fulfilRetry.ts';
import { LiveSlotSync } from './liveSlotSync.ts';
import type { LocalTransactions } from './localTransactions.ts';
import { type OperatorCall, type OperatorEndpoint, startOperatorEndpoint } from './operatorEndpoint.ts';
import { holdPrivateUmask, makePrivateDir } from './privateState.ts';
import { ReaperSchedule, shortestGraceMs } from './reaperSchedule.ts';
import { withRoomSignal } from './roomSignal.ts';
import { SqsPoller } from './sqsPoller.ts';
import { keepAway, resendWaiting } from './waitingMessages.ts';

export interface EmbeddedPoolOptions {
  readonly config: ResolvedConfig;
  readonly configPath?: string;
  /** sha256 of the configuration file's text, recorded in dev.json for the CLI to compare. */
  readonly configHash?: string;
  readonly stateDir: string;
  /** Seconds between reaper runs (fractions allowed). */
  readonly reaperInterval: number;
  readonly log: Log;
  readonly clock?: Clock;
  /** Keep the table in memory instead of under the state dir (tests). */
  readonly inMemory?: boolean;
  /** Do not start the queue pollers (tests drive the handlers themselves). */
  readonly noPollers?: boolean;
  /**
   * Visibility timeout of the request queue in seconds: how soon a new waiting request is retried
   * (default EMBEDDED_VISIBILITY_SECONDS); later retries back off (core/timing.ts waitingVisibilitySeconds).
   */
  readonly visibilityTimeout?: number;
  /** How long a request may wait for capacity, seconds (default WAITING_BUDGET_SECONDS.embedded). */
  readonly waitingBudgetSeconds?: number;
  /** Whether waiting requests' messages back off (default true; tests that drain by hand turn it off). */
  readonly backOff?: boolean;
  /**
   * Whether a waiting request's receive skips the placement attempt when nothing was freed since its
   * last one (default true; tests that write the table behind the store's back turn it off).
   */
  readonly skipUnchanged?: boolean;
  /** The request queue's maxReceiveCount (default: backstopReceiveCount of the budget, above it). */
  readonly maxReceiveCount?: number;
}

export const REGION = 'us-east-1';

export const TABLE_NAME = 'metastatic';

/**
 * The embedded default: the same handlers as in Lambda, against dynalite and fauxqs on loopback, with
 * backing nodes as local processes. Queue pollers play Lambda's SQS event source mappings; a timer plays
 * the EventBridge schedule of the reaper (reaperSchedule.ts).
 */
export class EmbeddedPool {
  private readonly pollers: SqsPoller[] = [];
  /** Plays the reaper's EventBridge schedule. */
  private readonly reaper: ReaperSchedule;
  private stopped = false;
  private operatorEndpoint: OperatorEndpoint | undefined;
  /** What dev.json says (info, with the endpoints started after it). */
  private published: EmbeddedInfo | undefined;

  private constructor(
    readonly info: EmbeddedInfo,
    readonly context: Context,
    readonly dynamodb: DynamoDBClient,
    /** Runs the table's transactions (dynalite has none): tests reach its crash hook here. */
    readonly transactions: LocalTransactions,
    readonly sqs: SQSClient,
    readonly localProvider: LocalProvider,
    readonly handlers: {
      request: ReturnType<typeof makeRequestHandler>;
      /** The request dead-letter queue's consumer: ends what the request handler's last delivery could not. */
      deadLetters: ReturnType<typeof makeDeadLetterHandler>;
      fulfil: ReturnType<typeof makeFulfilHandler>;
      reaper: () => Promise<ReapReport>;
    },
    private readonly engines: Engine[],
    private readonly options: EmbeddedPoolOptions,
    /** Gives back the private umask held while the stack runs (privateState.ts). */
    private readonly releaseUmask: () => void,
    /** The SSH client key every local backing node lets in (clientKey.ts). */
    readonly clientKey: ClientKey,
    private readonly liveSlots: LiveSlotSync,
  ) {
    this.reaper = new ReaperSchedule(handlers.reaper, options.reaperInterval, context.clock, context.log, {
      shortestGraceMs: shortestGraceMs(options.config),
    });
  }

  /** Adds the GitHub webhook listener's URL (started after the pool: it is a client of it) to dev.json. */
  async recordGithubWebhook(url: string): Promise<void> {
    this.published = { ...(this.published ?? this.info), githubWebhookUrl: url };
    await writeEmbeddedInfo(this.published);
  }

  static async start(options: EmbeddedPoolOptions): Promise<EmbeddedPool> {
    const stateDir = resolve(options.stateDir);
    const releaseUmask = holdPrivateUmask();
    await makePrivateDir(stateDir);
    const clock = options.clock ?? systemClock;
    const engines: Engine[] = [];
    let endpoint: OperatorEndpoint | undefined;
    try {
      const ddbEngine = await startDynalite({
        path: options.inMemory ? undefined : join(stateDir, 'dynamodb'),
      });
      engines.push(ddbEngine);
      const sqsEngine = await startSqsEngine();
      engines.push(sqsEngine);
      // dynalite has no transactions: this client runs them (one at a time, all or nothing).
      const { client: dynamodb, transactions } = localDynamoClient(
        localEngineClientConfig(ddbEngine.endpoint, REGION),
        ddbEngine.endpoint,
        ddbEngine.inProcess,
      );
      const sqs = new SQSClient(localEngineClientConfig(sqsEngine.endpoint, REGION));
      await ensureTable(dynamodb, TABLE_NAME);
      // A transaction the last run was killed inside is rolled back before anything reads the table.
      const rolledBack = await transactions.recover(TABLE_NAME);
      if (rolledBack > 0) options.log.warn(`${rolledBack} transaction(s) cut short by a crash rolled back`);
      const visibilityTimeout = options.visibilityTimeout ?? EMBEDDED_VISIBILITY_SECONDS;
      const waitingBudget = {
        seconds: options.waitingBudgetSeconds ?? WAITING_BUDGET_SECONDS.embedded,
        visibilitySeconds: visibilityTimeout,
      };
      const maxReceiveCount =
        options.maxReceiveCount ?? backstopReceiveCount(waitingBudget.seconds, visibilityTimeout);
      const requestQueue = await ensureQueue(sqs, 'metastatic-requests', {
        visibilityTimeout,
        maxReceiveCount,
      });
      // Lease renewals have a queue of their own, as on AWS: never behind placements.
      const leaseQueue = await ensureQueue(sqs, 'metastatic-leases', {
        visibilityTimeout,
        maxReceiveCount: 5,
      });
      const fulfilQueue = await ensureQueue(sqs, 'metastatic-fulfil', {
        visibilityTimeout: 5,
        maxReceiveCount: 5,
      });

      // dynalite has no TTL: ended records get their purge time all the same (the table is the same
      // shape as on AWS) and stay until the state dir goes.
      const store = new DynamoStore(dynamodb, TABLE_NAME, clock, {
        recordRetention: options.config.recordRetention,
      });
      const clientKey = await ensureClientKey(stateDir);
      // Every writer of this table runs in this process, through this store: it counts the writes that
      // may let a waiting request in, so a waiting request's receive can skip a futile attempt.
      const signalled = withRoomSignal(store);
      const { context: embedded, localProvider } = embeddedContext({
        config: options.config,
        stateDir,
        store: signalled.store,
        sqs,
        fulfilQueueUrl: fulfilQueue.url,
        clock,
        log: options.log,
        authorizedKeys: [clientKey.publicKey],
      });
      // Deliveries run only in this process: what one that started before it holds is abandoned (its
      // claims and places are taken over, or given back by the reaper, at once).
      const context: Context = { ...embedded, deliveriesDeadBefore: clock.now() };
      const liveSlots = new LiveSlotSync(
        store,
        localProvider,
        new Set(options.config.backingPools.filter((p) => p.driver === 'local').map((p) => p.key)),
        options.log,
      );
      // Every handler run may make a node ready or end one: the backing processes learn it before the
      // run counts as done (a client that saw the node ready finds its slot live).
      const thenSync =
        <A extends unknown[], R>(run: (...args: A) => Promise<R>) =>
        async (...args: A): Promise<R> => {
          try {
            return await run(...args);
          } finally {
            await liveSlots.sync();
          }
        };
      const handlers = {
        request: thenSync(
          makeRequestHandler(context, {
            maxReceiveCount,
            waitingBudget,
            ...(options.skipUnchanged === false
              ? {}
              : {
                  lastAttempts: new LastAttempts(
                    signalled.signal.generation,
                    WAITING_BACKOFF_CAP_SECONDS * 1000,
                  ),
                }),
            ...(options.backOff === false
              ? {}
              : { backOff: (record, seconds) => keepAway(sqs, requestQueue.url, record, seconds) }),
            // No retrySoon: the queue's own timeout (2 s) brings a failed lease renewal back sooner.
          }),
        ),
        deadLetters: thenSync(makeDeadLetterHandler(context)),
        // A backing node not ready yet is tried again within seconds: sent back delayed, as on AWS.
        fulfil: thenSync(makeFulfilHandler(context, { retryLater: sendBackTo(sqs, fulfilQueue.url) })),
        reaper: thenSync(makeReaperHandler(context)),
      };
      const info: EmbeddedInfo = {
        region: REGION,
        dynamodbEndpoint: ddbEngine.endpoint,
        sqsEndpoint: sqsEngine.endpoint,
        requestQueueUrl: requestQueue.url,
        leaseQueueUrl: leaseQueue.url,
        requestDlqUrl: requestQueue.dlqUrl,
        fulfilQueueUrl: fulfilQueue.url,
        tableName: TABLE_NAME,
        stateDir,
        configPath: options.configPath,
        configHash: options.configHash,
        pid: process.pid,
        startedAt: new Date(clock.now()).toISOString(),
      };
      const stack = new EmbeddedPool(
        info,
        context,
        dynamodb,
        transactions,
        sqs,
        localProvider,
        handlers,
        engines,
        options,
        releaseUmask,
        clientKey,
        liveSlots,
      );
      if (!options.noPollers) {
        // A previous run may have left backing processes (adopted now) or lost some (kill -9, a
        // reboot): reconcile before serving anything, so no request lands on a dead backing node.
        try {
          const report = await stack.reapNow();
          if (report.failed.length || report.orphans.length) {
            options.log.info('startup reconciliation', { failed: report.failed, orphans: report.orphans });
          }
        } catch (err) {
          options.log.error('startup reconciliation failed', { error: err as Error });
        }
        await resendWaiting(context, sqs, requestQueue.url, options.log);
        // A release starts a grace-time: let the reaper know so the backing node goes when it ends (a
        // lapsed lease's release, made by a reaper run, does the same: reaperSchedule.ts).
        const requestAndNudge: typeof handlers.request = async (event) => {
          const response = await handlers.request(event);
          if (event.Records.some((r) => r.body.includes('"release"'))) stack.reaper.released();
          return response;
        };
        stack.pollers.push(
          new SqsPoller(sqs, requestQueue.url, requestQueue.arn, requestAndNudge, options.log, {
            region: REGION,
          }),
          new SqsPoller(sqs, leaseQueue.url, leaseQueue.arn, handlers.request, options.log, {
            region: REGION,
          }),
          new SqsPoller(sqs, fulfilQueue.url, fulfilQueue.arn, handlers.fulfil, options.log, {
            region: REGION,
          }),
          new SqsPoller(sqs, requestQueue.dlqUrl, requestQueue.dlqArn, handlers.deadLetters, options.log, {
            region: REGION,
          }),
        );
        for (const p of stack.pollers) p.start();
        // spares are made by the reaper: its first run comes at once, not an interval later.
        stack.reaper.schedule(
          options.config.minReady.size > 0 || options.config.readyAuto?.size
            ? stack.context.clock.now()
            : undefined,
        );
      }
      // The CLI's operator verbs are run here, so that no backing process is ever the CLI's child.
      endpoint = await startOperatorEndpoint((call) => stack.operate(call), options.log);
      stack.operatorEndpoint = endpoint;
      stack.published = { ...info, operatorUrl: endpoint.url, operatorToken: endpoint.token };
      await writeEmbeddedInfo(stack.published);
      return stack;
    } catch (err) {
      await endpoint?.close();
      await Promise.allSettled(engines.map((e) => e.close()));
      releaseUmask();
      throw err;
    }
  }

  /** An operator verb posted by the CLI (operatorEndpoint.ts), run with this pool's context. */
  private async operate(call: OperatorCall): Promise<unknown> {
    if (this.stopped) throw new Error('the pool is stopping');
    switch (call.verb) {
      case 'hold':
        return holdNode(this.context, call.id);
      case 'drain':
        return drainBacking(this.context, call.id);
      case 'reap':
        return this.reapNow();
    }
  }

  /** Tells every local backing process which slots are live now (tests that write the table directly). */
  syncLiveSlots(): Promise<void> {
    return this.liveSlots.sync();
  }

  /** Runs the reaper now (waits for a run already in progress first). */
  reapNow(): Promise<ReapReport> {
    return this.reaper.runNow();
  }

  /**
   * Terminates every local backing process, those adopted from an earlier run included, and records
   * their backing nodes failed: their ready nodes fail (they are gone), waiting nodes stay for the
   * next start to move (the provider is closed now, so moving them would only spend their attempts).
   */
  private async recordShutdown(): Promise<void> {
    const local = new Set(
      this.options.config.backingPools.filter((p) => p.driver === 'local').map((p) => p.key),
    );
    await this.localProvider.shutdown();
    for (const r of await this.localProvider.list()) {
      await this.localProvider.terminate(r.resourceId).catch((err: unknown) => {
        this.context.log.warn('could not stop an adopted backing process', {
          resourceId: r.resourceId,
          error: err as Error,
        });
      });
    }
    await this.localProvider.flush();
    const live = [
      ...(await this.context.store.backingInPhase('idle')),
      ...(await this.context.store.backingInPhase('launching')),
      ...(await this.context.store.backingInPhase('active')),
    ];
    for (const b of live) {
      if (!local.has(b.backingPoolKey)) continue;
      await failBackingNode(this.context, b.id, 'the embedded pool was stopped', {
        resourceGone: true,
        deferRehoming: true,
      }).catch((err: unknown) => {
        this.context.log.warn('could not record a backing node as stopped', {
          backingNodeId: b.id,
          error: err as Error,
        });
      });
    }
  }

  /** Stops pollers and the reaper, terminates every backing process, closes the engines. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.reaper.stop();
    await this.operatorEndpoint?.close();
    await Promise.allSettled(this.pollers.map((p) => p.stop()));
    await this.reaper.settled();
    await this.recordShutdown();
    this.dynamodb.destroy();
    this.sqs.destroy();
    await Promise.allSettled(this.engines.map((e) => e.close()));
    await rm(embeddedInfoPath(this.info.stateDir), { force: true });
    this.releaseUmask();
  }
}
