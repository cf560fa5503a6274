import { rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { DescribeInstancesCommand, type Instance, TerminateInstancesCommand } from '@aws-sdk/client-ec2';
import { PutEventsCommand } from '@aws-sdk/client-eventbridge';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import { StateChangeDetailType } from '../../shared/core/stateChanges.ts';
import { TAG_POOL } from '../../shared/providers/aws/runInstancesRequest.ts';
import type { ReapReport } from '../../shared/usecases/reap/reapReport.ts';
import type { AssemblyStack, AssetCheck } from './assembly.ts';
import { runCdk } from './cdkCli.ts';
import { deployApp, type RehearsalClients } from './deployApp.ts';
import type { DeployedPool, PoolFunctionRole } from './deployed.ts';
import { Ec2Proxy } from './ec2Proxy.ts';
import { type Delivery, QueueMapping, scheduledEvent, stateChanges } from './eventSources.ts';
import { FunctionPool, FunctionProcess, lambdaWorkerScript } from './lambdaRuntime.ts';
import { motoEnv } from './motoEnv.ts';
import type { MotoServer } from './motoServer.ts';
import type { RehearsalNetwork } from './network.ts';
import type { RehearsalEvent, RehearsalOptions } from './rehearsalOptions.ts';

/**
 * `metastatic rehearse`: a CDK app embedding MetastaticPool deployed with the CDK CLI into moto_server,
 * offline, and the deployed functions run here from the code CDK deployed (checked against its asset
 * hashes: assembly.ts verifyAssetHashes), fed as Lambda feeds them: the SQS event source mappings, the
 * reaper's schedule, and the EC2 events EventBridge would deliver. moto is not AWS; what bridges the two
 * is in this module and the ones beside it (the deploy in deployApp.ts):
 * - moto cannot make a resource with a given id: the subnets, security groups, images and launch
 *   templates the configuration names are made in moto with its ids (network.ts), and the functions'
 *   EC2 endpoint is a proxy that translates between those and the configuration's (ec2Proxy.ts);
 * - its CloudFormation creates no CloudWatch alarm, and refuses the dashboard's references to them: they
 *   become the ARNs the alarms would have, in the rehearsal's copy of the template (assembly.ts);
 * - a deploy through a change set leaves the stack without outputs: `--method=direct`; a stack a failed
 *   attempt left behind (REVIEW_IN_PROGRESS, ROLLBACK_COMPLETE, ...) is deleted before deploying
 *   (leftoverStacks.ts);
 * - its Lambda creates the functions and mappings but runs nothing (no containers): this process runs
 *   them (lambdaRuntime.ts, eventSources.ts); it matches a schedule rule against every event put on the
 *   bus, then fails on its Lambda target: the schedule's target is removed and the schedule played here;
 * - its EC2 publishes no event and prints no host keys on the console: the events are played here (put
 *   on the default bus, where the deployed rule routes them); the proxy adds a host-key block, made up
 *   and announced as such, to each console output unless `consoleHostKeys` is false (ec2Proxy.ts);
 * - a function has up to `concurrency` processes (2 by default; the reaper 1, its schedule played one run
 *   at a time), each mapping as many pollers (at most its maxConcurrency), as Lambda's containers; services
 *   are told apart by host name: endpoints use `localhost`, not 127.0.0.1.
 */

const POLL_WAIT_SECONDS = 2;
const EC2_LOOK_MS = 1_000;
export const DEFAULT_CONCURRENCY = 2; // invocations of a function at once, by default (`--concurrency`)

export class Rehearsal {
  private running = false;
  private readonly loops: Promise<void>[] = [];
  private readonly abort = new AbortController();
  private reaperTimer: NodeJS.Timeout | undefined;
  /** Instance id -> state last seen (those before the deploy included: they publish nothing). */
  private readonly seen = new Map<string, string>();
  private closed = false;

  private constructor(
    readonly options: RehearsalOptions,
    readonly moto: MotoServer,
    readonly account: string,
    readonly region: string,
    readonly workDir: string,
    readonly assemblyDir: string,
    readonly stack: AssemblyStack,
    readonly config: ResolvedConfig,
    readonly network: RehearsalNetwork,
    readonly pool: DeployedPool,
    readonly assets: AssetCheck,
    private readonly cdkCli: string,
    readonly proxy: Ec2Proxy,
    readonly functions: Readonly<Record<PoolFunctionRole, FunctionPool>>,
    readonly mappings: readonly QueueMapping[],
    private readonly clients: RehearsalClients,
  ) {}

  /** Deploys the app to moto (deployApp.ts) and starts its functions' processes: ready to run. */
  static async start(options: RehearsalOptions): Promise<Rehearsal> {
    const concurrency = options.concurrency ?? DEFAULT_CONCURRENCY;
    if (!Number.isInteger(concurrency) || concurrency < 1)
      throw new Error(`concurrency: a whole number of 1 or more, not ${concurrency}`);
    const app = await deployApp(options);
    const { moto, account, region, workDir, assemblyDir, stack, config, network, pool, assets } = app;
    const { cdkCli, clients } = app;
    try {
      const proxy = await Ec2Proxy.start({
        motoEndpoint: moto.endpoint,
        ids: network.ids,
        consoleHostKeys: options.consoleHostKeys ?? true,
      });
      const script = await lambdaWorkerScript();
      const functions = Object.fromEntries(
        (
          Object.entries(pool.functions) as Array<[PoolFunctionRole, DeployedPool['functions']['request']]>
        ).map(([role, fn]) => [
          role,
          new FunctionPool(
            fn,
            role === 'reaper' ? 1 : concurrency,
            () =>
              new FunctionProcess(
                fn,
                script,
                motoEnv(moto.endpoint, region, {
                  // What the Lambda runtime sets (AWS_EXECUTION_ENV is left out: it would turn X-Ray tracing on).
                  AWS_LAMBDA_FUNCTION_NAME: fn.functionName,
                  AWS_LAMBDA_FUNCTION_MEMORY_SIZE: String(fn.memorySize),
                  AWS_LAMBDA_FUNCTION_VERSION: '$LATEST',
                  LAMBDA_TASK_ROOT: fn.codeDir,
                  _HANDLER: fn.handler,
                  METASTATIC_REHEARSAL_FUNCTION_ARN: fn.functionArn,
                  POWERTOOLS_LOG_LEVEL: (options.logLevel ?? 'warn').toUpperCase(),
                  // The metrics would be EMF lines in the log, read by nothing here.
                  POWERTOOLS_METRICS_DISABLED: 'true',
                  ...fn.environment,
                  // The functions' EC2 calls go through the proxy (ids translated, host keys on the console).
                  AWS_ENDPOINT_URL_EC2: proxy.endpoint,
                  ...(options.childEnv ?? {}),
                }),
                (line) => options.onFunctionOutput?.(role, line),
              ),
          ),
        ]),
      ) as Record<PoolFunctionRole, FunctionPool>;
      const mappings = (['request', 'fulfil'] as const).flatMap((role) =>
        pool.functions[role].eventSources.map(
          (s) => new QueueMapping(clients.sqs, functions[role], s, region),
        ),
      );
      const rehearsal = new Rehearsal(
        options,
        moto,
        account,
        region,
        workDir,
        assemblyDir,
        stack,
        config,
        network,
        pool,
        assets,
        cdkCli,
        proxy,
        functions,
        mappings,
        clients,
      );
      for (const instance of await rehearsal.instances())
        rehearsal.seen.set(instance.InstanceId as string, instance.State?.Name ?? '');
      return rehearsal;
    } catch (err) {
      await moto.stop();
      rmSync(workDir, { recursive: true, force: true });
      throw err;
    }
  }

  /** The mapping of a function on a queue (by ARN; default: its first). */
  mapping(role: 'request' | 'fulfil', queueArn?: string): QueueMapping {
    const found = this.mappings.find(
      (m) => m.fn === this.functions[role] && (queueArn === undefined || m.source.queueArn === queueArn),
    );
    if (!found) throw new Error(`the ${role} function has no mapping on ${queueArn ?? 'any queue'}`);
    return found;
  }

  /** One delivery of a function's mapping (receive, invoke, delete what did not fail). */
  async deliver(role: 'request' | 'fulfil', queueArn?: string, waitSeconds = 1): Promise<Delivery> {
    const mapping = this.mapping(role, queueArn);
    const delivery = await mapping.deliverOnce(waitSeconds);
    if (delivery.records > 0) this.reportDelivery(role, mapping, delivery);
    return delivery;
  }

  /** One reaper run, as its schedule would start it; the reaper's report (it throws when a step failed). */
  async reap(): Promise<ReapReport> {
    const started = Date.now();
    const ruleArn = `arn:aws:events:${this.region}:${this.account}:rule/${this.pool.schedule.ruleName}`;
    try {
      const report = await this.functions.reaper.invoke<ReapReport>(
        scheduledEvent(this.account, this.region, ruleArn),
      );
      this.emit({
        type: 'reaper',
        retired: report?.retired ?? [],
        stopped: report?.stopped ?? [],
        failed: report?.failed ?? [],
        errors: report?.errors ?? [],
        ms: Date.now() - started,
      });
      return report;
    } catch (err) {
      this.emit({
        type: 'reaper',
        retired: [],
        stopped: [],
        failed: [],
        errors: [],
        error: (err as Error).message,
        ms: Date.now() - started,
      });
      throw err;
    }
  }

  /** Every instance moto has in the region. */
  async instances(): Promise<Instance[]> {
    const out: Instance[] = [];
    let NextToken: string | undefined;
    do {
      const page = await this.clients.ec2.send(new DescribeInstancesCommand({ NextToken }));
      out.push(...(page.Reservations ?? []).flatMap((r) => r.Instances ?? []));
      NextToken = page.NextToken;
    } while (NextToken);
    return out;
  }

  /** The pool's instances (tagged with its pool id). */
  async poolInstances(): Promise<Instance[]> {
    return (await this.instances()).filter((i) =>
      (i.Tags ?? []).some((t) => t.Key === TAG_POOL && t.Value === this.pool.poolId),
    );
  }

  /**
   * Looks at moto's instances and publishes, for each one whose state changed since the last look, the
   * state-change events EC2 would have (on the default bus, where the deployed rule picks them up).
   */
  async publishInstanceChanges(): Promise<Array<{ instanceId: string; state: string }>> {
    const published: Array<{ instanceId: string; state: string }> = [];
    for (const instance of await this.instances()) {
      const id = instance.InstanceId as string;
      const now = instance.State?.Name ?? '';
      for (const state of stateChanges(this.seen.get(id), now)) {
        await this.publishState(id, state);
        published.push({ instanceId: id, state });
      }
      this.seen.set(id, now);
    }
    return published;
  }

  /** Puts one EC2 state-change event on the default bus, as EC2 would (`source` other than aws.ec2: a test's). */
  async publishState(instanceId: string, state: string, source = 'aws.ec2'): Promise<void> {
    const out = await this.clients.events.send(
      new PutEventsCommand({
        Entries: [
          {
            Source: source,
            DetailType: StateChangeDetailType,
            Detail: JSON.stringify({ 'instance-id': instanceId, state }),
            Resources: [`arn:aws:ec2:${this.region}:${this.account}:instance/${instanceId}`],
          },
        ],
      }),
    );
    if ((out.FailedEntryCount ?? 0) > 0) {
      throw new Error(
        `EventBridge refused the ${state} event of ${instanceId}: ${JSON.stringify(out.Entries)}`,
      );
    }
    if (source === 'aws.ec2') this.emit({ type: 'ec2', instanceId, state });
  }

  /** Seconds between reaper runs. */
  get reaperInterval(): number {
    return this.options.reaperInterval ?? this.pool.schedule.seconds ?? 60;
  }

  /** Invocations of the request or fulfil function that may run at once (the reaper's: one). */
  get concurrency(): number {
    return this.functions.request.size;
  }

  /** How many pollers feed a mapping: the concurrency, at most the mapping's maxConcurrency. */
  pollers(mapping: QueueMapping): number {
    return Math.max(1, Math.min(this.concurrency, mapping.source.maxConcurrency ?? this.concurrency));
  }

  /** Runs the mappings, the schedule and the EC2 events until `stop`. */
  run(): void {
    if (this.running) return;
    this.running = true;
    for (const mapping of this.mappings) {
      const role = mapping.fn === this.functions.request ? 'request' : 'fulfil';
      for (let i = 0; i < this.pollers(mapping); i++) {
        this.loops.push(
          this.loop(async () => {
            // A short long-poll rather than an abort signal: `stop` waits at most this long for a receive.
            const d = await mapping.deliverOnce(POLL_WAIT_SECONDS);
            if (d.records > 0) this.reportDelivery(role, mapping, d);
          }),
        );
      }
    }
    this.loops.push(
      this.loop(async () => {
        await this.publishInstanceChanges();
        await this.sleep(EC2_LOOK_MS);
      }),
    );
    const tick = () => {
      if (!this.running) return;
      this.reap()
        .catch(() => undefined) // reported as an event
        .finally(() => {
          if (this.running) this.reaperTimer = setTimeout(tick, this.reaperInterval * 1000);
        });
    };
    this.reaperTimer = setTimeout(tick, this.reaperInterval * 1000);
  }

  /** Stops feeding the functions (the invocations under way finish) and ends their processes. */
  async stop(): Promise<void> {
    this.running = false;
    this.abort.abort();
    if (this.reaperTimer) clearTimeout(this.reaperTimer);
    await Promise.allSettled(this.loops);
    await Promise.all(Object.values(this.functions).map((f) => f.stop()));
    await this.proxy.stop();
  }

  /**
   * Stops, and cleans up: a moto_server started here is stopped (and everything in it with it); in one
   * given with --endpoint, the stack is destroyed (`cdk destroy`) and the pool's instances terminated
   * (the table is retained, as on AWS). The work directory (the assembly) is removed.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.stop();
    try {
      if (!this.moto.owned) await this.destroy();
    } finally {
      for (const c of Object.values(this.clients)) c.destroy();
      await this.moto.stop();
      rmSync(this.workDir, { recursive: true, force: true });
    }
  }

  /** `cdk destroy` of the stack, and the pool's instances terminated (the stack never terminates them). */
  async destroy(): Promise<number> {
    const started = Date.now();
    const live = (await this.poolInstances())
      .filter((i) => i.State?.Name !== 'terminated' && i.State?.Name !== 'shutting-down')
      .map((i) => i.InstanceId as string);
    if (live.length > 0) await this.clients.ec2.send(new TerminateInstancesCommand({ InstanceIds: live }));
    await runCdk(this.cdkCli, ['destroy', this.stack.id, '--app', this.assemblyDir, '--force'], {
      cwd: resolve(this.options.cwd),
      env: motoEnv(this.moto.endpoint, this.region, this.options.childEnv ?? {}),
    });
    const ms = Date.now() - started;
    this.emit({ type: 'step', step: 'destroy', message: `destroyed stack ${this.stack.stackName}`, ms });
    return ms;
  }

  private reportDelivery(role: PoolFunctionRole, mapping: QueueMapping, d: Delivery): void {
    this.emit({
      type: 'delivery',
      function: role,
      queue: mapping.source.queueArn.split(':').pop() as string,
      records: d.records,
      failed: d.failed.length,
      ...(d.error ? { error: d.error } : {}),
      ms: d.ms,
    });
  }

  private async loop(body: () => Promise<void>): Promise<void> {
    let backoff = 200;
    while (this.running) {
      try {
        await body();
        backoff = 200;
      } catch (err) {
        if (!this.running) break;
        this.emit({ type: 'error', message: (err as Error).message });
        await this.sleep(backoff);
        backoff = Math.min(backoff * 2, 5_000);
      }
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.abort.signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.abort.signal.addEventListener('abort', done, { once: true });
    });
  }

  private emit(event: RehearsalEvent): void {
    this.options.onEvent?.(event);
  }
}
