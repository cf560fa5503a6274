import { cpSync, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import {
  CloudFormationClient,
  DeleteStackCommand,
  DescribeStacksCommand,
  waitUntilStackDeleteComplete,
} from '@aws-sdk/client-cloudformation';
import {
  DescribeInstancesCommand,
  EC2Client,
  type Instance,
  TerminateInstancesCommand,
} from '@aws-sdk/client-ec2';
import {
  EventBridgeClient,
  ListTargetsByRuleCommand,
  PutEventsCommand,
  RemoveTargetsCommand,
} from '@aws-sdk/client-eventbridge';
import { SQSClient } from '@aws-sdk/client-sqs';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import type { ResolvedConfig } from '../../shared/config/model.ts';
import { StateChangeDetailType } from '../../shared/core/stateChanges.ts';
import { TAG_POOL } from '../../shared/providers/aws/runInstancesRequest.ts';
import type { ReapReport } from '../../shared/usecases/reapReport.ts';
import { packageRoot } from '../packageInfo.ts';
import {
  type AssemblyStack,
  choosePoolStack,
  patchTemplateForMoto,
  readAssembly,
  replaceShippedConfig,
  shippedConfig,
  writeTemplate,
} from './assembly.ts';
import { findCdkCli, runCdk } from './cdkCli.ts';
import { type DeployedPool, describePool, type PoolFunctionRole } from './deployed.ts';
import { Ec2ConsoleProxy } from './ec2Console.ts';
import { RehearsalError } from './errors.ts';
import { type Delivery, QueueMapping, scheduledEvent, stateChanges } from './eventSources.ts';
import { FunctionProcess, lambdaWorkerScript } from './lambdaRuntime.ts';
import { motoClientConfig, motoEnv } from './motoEnv.ts';
import { connectMotoServer, type MotoServer, motoAccount, startMotoServer } from './motoServer.ts';
import { awsLabelSettings, createNetwork, mapConfigText, type RehearsalNetwork } from './network.ts';

/**
 * `metastatic rehearse`: the AWS deployment of a CDK app that embeds MetastaticPool, rehearsed offline
 * against moto_server. The app is synthesized and deployed with the CDK CLI as `cdk deploy` would, and
 * the functions it deployed run on this machine from the code CDK deployed, fed as Lambda feeds them: the
 * SQS event source mappings, the reaper's schedule, and the EC2 state-change events EventBridge would
 * deliver when moto's instances change state.
 *
 * moto is not AWS, and everything done here to bridge the two is in this module and the ones beside it:
 * - moto cannot make a resource with a given id: the subnets, security groups, images and launch
 *   templates the configuration names are made in moto with its ids, and the configuration shipped in
 *   the rehearsal's copy of the functions' code names those (network.ts);
 * - its CloudFormation creates no CloudWatch alarm, and refuses the dashboard's references to them: they
 *   become the ARNs the alarms would have, in the rehearsal's copy of the template (assembly.ts);
 * - a deploy through a change set leaves the stack without outputs: `--method=direct`; a stack a failed
 *   attempt left behind (REVIEW_IN_PROGRESS, ROLLBACK_COMPLETE, ...) is deleted before deploying;
 * - its Lambda creates the functions and mappings but runs nothing (no containers): this process runs
 *   them (lambdaRuntime.ts, eventSources.ts); it matches a schedule rule against every event put on the
 *   bus, then fails on its Lambda target: the schedule's target is removed and the schedule played here;
 * - its EC2 publishes no event and prints no host keys on the console: both are played here (the events
 *   put on the default bus, where the deployed rule routes them; the console by ec2Console.ts);
 * - services are told apart by host name: endpoints use `localhost`, not 127.0.0.1.
 */

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export interface RehearsalOptions {
  /** Where the app is (its cdk.json), and where the CDK CLI runs. */
  readonly cwd: string;
  /** The app: a command (as `cdk --app`), or a cloud assembly directory; default: cdk.json's. */
  readonly app?: string;
  /** Context for `cdk synth` (`-c key=value`). */
  readonly context?: Readonly<Record<string, string>>;
  /** The stack to rehearse (by name or artifact id); default: the app's only pool stack. */
  readonly stack?: string;
  /** A running moto_server; default: one started here. */
  readonly endpoint?: string;
  /** The port of the moto_server started here (default: a free one). */
  readonly port?: number;
  /** Seconds between reaper runs (default: the deployed schedule's rate). */
  readonly reaperInterval?: number;
  /** The functions' log level (POWERTOOLS_LOG_LEVEL; default warn). */
  readonly logLevel?: LogLevel;
  /** More environment for the CDK CLI and the functions' processes. */
  readonly childEnv?: Readonly<Record<string, string>>;
  readonly onEvent?: (event: RehearsalEvent) => void;
  /** Each line a function prints (its Powertools logs). */
  readonly onFunctionOutput?: (role: PoolFunctionRole, line: string) => void;
}

/** What the rehearsal reports as it goes (the CLI prints it; `--json`: one object per line). */
export type RehearsalEvent =
  | { readonly type: 'step'; readonly step: string; readonly message: string; readonly ms?: number }
  | { readonly type: 'warning'; readonly message: string }
  | {
      readonly type: 'delivery';
      readonly function: PoolFunctionRole;
      readonly queue: string;
      readonly records: number;
      readonly failed: number;
      readonly error?: string;
      readonly ms: number;
    }
  | { readonly type: 'ec2'; readonly instanceId: string; readonly state: string }
  | {
      readonly type: 'reaper';
      readonly retired: readonly string[];
      readonly stopped: readonly string[];
      readonly failed: readonly string[];
      readonly errors: readonly string[];
      readonly error?: string;
      readonly ms: number;
    }
  | { readonly type: 'error'; readonly message: string };

const TOOLKIT_STACK = 'CDKToolkit';
/** Stack states a failed earlier attempt leaves, from which CloudFormation cannot deploy: deleted first. */
const LEFTOVER_STATES = new Set([
  'REVIEW_IN_PROGRESS',
  'ROLLBACK_COMPLETE',
  'ROLLBACK_FAILED',
  'CREATE_FAILED',
  'DELETE_FAILED',
]);
const POLL_WAIT_SECONDS = 2;
const EC2_LOOK_MS = 1_000;

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
    private readonly cdkCli: string,
    private readonly proxy: Ec2ConsoleProxy,
    readonly functions: Readonly<Record<PoolFunctionRole, FunctionProcess>>,
    readonly mappings: readonly QueueMapping[],
    private readonly clients: {
      ec2: EC2Client;
      events: EventBridgeClient;
      sqs: SQSClient;
      cfn: CloudFormationClient;
    },
  ) {}

  /** Starts moto (or checks the one given), synthesizes, deploys and describes the pool: ready to run. */
  static async start(options: RehearsalOptions): Promise<Rehearsal> {
    const emit = (e: RehearsalEvent) => options.onEvent?.(e);
    const cwd = resolve(options.cwd);
    // The app's own CDK CLI, else this package's (a clone of the repository has it in its dev dependencies).
    const cdkCli = findCdkCli([cwd, packageRoot()]);
    const appDir =
      options.app && existsSync(resolve(cwd, options.app)) ? resolve(cwd, options.app) : undefined;
    if (appDir && !statSync(appDir).isDirectory()) {
      throw new RehearsalError(
        `--app ${options.app} is a file: give the command that runs it (e.g. "node ${options.app}")`,
      );
    }
    if (!options.app && !existsSync(join(cwd, 'cdk.json'))) {
      throw new RehearsalError(
        `no CDK app in ${cwd}: run this in your CDK app's directory (where its cdk.json is), or give --app "<command>" (e.g. --app "npx tsx bin/app.ts") or --app <cdk.out directory>`,
      );
    }

    let started = Date.now();
    let moto = options.endpoint
      ? await connectMotoServer(options.endpoint)
      : await startMotoServer({
          ownGroup: true,
          ...(options.port !== undefined ? { port: options.port } : {}),
        });
    emit({
      type: 'step',
      step: 'moto',
      message: moto.owned
        ? `moto_server started on ${moto.endpoint}`
        : `using the moto_server at ${moto.endpoint}`,
      ms: Date.now() - started,
    });
    const workDir = mkdtempSync(join(tmpdir(), 'metastatic-rehearse-'));
    const assemblyDir = join(workDir, 'cdk.out');
    const failEarly = async (err: unknown): Promise<never> => {
      await moto.stop();
      rmSync(workDir, { recursive: true, force: true });
      throw err;
    };
    try {
      // The app, synthesized as `cdk synth` would (with moto's account as the default one) or copied.
      started = Date.now();
      const baseRegion = options.context?.region ?? 'us-east-1';
      const cdkEnv = (region: string) => motoEnv(moto.endpoint, region, options.childEnv ?? {});
      if (appDir) {
        cpSync(appDir, assemblyDir, { recursive: true });
        emit({
          type: 'step',
          step: 'synth',
          message: `using the assembly in ${appDir}`,
          ms: Date.now() - started,
        });
      } else {
        const context = Object.entries(options.context ?? {}).flatMap(([k, v]) => ['-c', `${k}=${v}`]);
        await runCdk(
          cdkCli,
          ['synth', '-q', '-o', assemblyDir, ...(options.app ? ['--app', options.app] : []), ...context],
          { cwd, env: cdkEnv(baseRegion) },
        ).catch((err: Error) => {
          throw new RehearsalError(`the app does not synthesize: ${err.message}`, { cause: err });
        });
        emit({
          type: 'step',
          step: 'synth',
          message: `synthesized the app into ${assemblyDir}`,
          ms: Date.now() - started,
        });
      }
      const stacks = readAssembly(assemblyDir);
      const stack = choosePoolStack(stacks, options.stack);
      const shipped = shippedConfig(assemblyDir, stack.template);
      const inVpc = Object.values(stack.template.Resources ?? {}).some(
        (r) => r.Type === 'AWS::Lambda::Function' && r.Properties?.VpcConfig !== undefined,
      );
      const config = parseConfigOrThrow(shipped.text, 'metastatic.yaml', { functionsInVpc: inVpc });
      const region = stack.region ?? awsLabelSettings(config)[0]?.region ?? baseRegion;

      // The account moto answers for must be the stack's (CDK refuses to deploy a stack of another).
      let account = await motoAccount(moto.endpoint, region);
      if (stack.account && stack.account !== account) {
        if (!moto.owned) {
          throw new RehearsalError(
            `stack ${stack.stackName} is for account ${stack.account}, and the moto_server at ${moto.endpoint} ` +
              `answers for ${account}: start it with MOTO_ACCOUNT_ID=${stack.account}, or leave out --endpoint`,
          );
        }
        await moto.stop();
        moto = await startMotoServer({ ownGroup: true, port: moto.port, account: stack.account });
        account = stack.account;
      }
      const clientConfig = { ...motoClientConfig(moto.endpoint, region) };
      const clients = {
        ec2: new EC2Client(clientConfig),
        events: new EventBridgeClient(clientConfig),
        sqs: new SQSClient({ ...clientConfig, useQueueUrlAsEndpoint: false }),
        cfn: new CloudFormationClient(clientConfig),
      };

      // What the configuration names in the account, made in moto.
      started = Date.now();
      const network = await createNetwork(clients.ec2, config);
      if (network.ids.size > 0) replaceShippedConfig(shipped.files, mapConfigText(shipped.text, network.ids));
      emit({
        type: 'step',
        step: 'network',
        message: `made in moto what the configuration names: ${network.made.join('; ') || 'nothing'}`,
        ms: Date.now() - started,
      });
      for (const warning of reachabilityWarnings(config, inVpc)) emit({ type: 'warning', message: warning });

      for (const s of stacks) {
        if (patchTemplateForMoto(s.template) > 0) writeTemplate(s);
      }

      // Bootstrap (unless moto has it already) and deploy, leftovers of a failed attempt deleted first.
      started = Date.now();
      const env = cdkEnv(region);
      const toolkit = await stackStatus(clients.cfn, TOOLKIT_STACK);
      if (toolkit === undefined || !toolkit.endsWith('_COMPLETE') || LEFTOVER_STATES.has(toolkit)) {
        await deleteLeftover(clients.cfn, TOOLKIT_STACK);
        await runCdk(cdkCli, ['bootstrap', `aws://${account}/${region}`, '--app', assemblyDir], { cwd, env });
        emit({
          type: 'step',
          step: 'bootstrap',
          message: `bootstrapped aws://${account}/${region}`,
          ms: Date.now() - started,
        });
      }
      started = Date.now();
      await deleteLeftover(clients.cfn, stack.stackName);
      await runCdk(
        cdkCli,
        ['deploy', stack.id, '--app', assemblyDir, '--method=direct', '--require-approval', 'never'],
        { cwd, env },
      );
      emit({
        type: 'step',
        step: 'deploy',
        message: `deployed stack ${stack.stackName}`,
        ms: Date.now() - started,
      });

      const pool = await describePool(
        { ...clients, endpoint: moto.endpoint, region },
        stack.stackName,
        assemblyDir,
        stack.template,
      );
      // The schedule is played here; moto would fail every PutEvents on its Lambda target.
      const targets = await clients.events.send(
        new ListTargetsByRuleCommand({ Rule: pool.schedule.ruleName }),
      );
      const ids = (targets.Targets ?? []).map((t) => t.Id as string);
      if (ids.length > 0)
        await clients.events.send(new RemoveTargetsCommand({ Rule: pool.schedule.ruleName, Ids: ids }));

      const proxy = await Ec2ConsoleProxy.start(moto.endpoint);
      const script = await lambdaWorkerScript();
      const functions = Object.fromEntries(
        (
          Object.entries(pool.functions) as Array<[PoolFunctionRole, DeployedPool['functions']['request']]>
        ).map(([role, fn]) => [
          role,
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
              // The functions' EC2 calls go through the console proxy (host keys on the console).
              AWS_ENDPOINT_URL_EC2: proxy.endpoint,
              ...(options.childEnv ?? {}),
            }),
            (line) => options.onFunctionOutput?.(role, line),
          ),
        ]),
      ) as Record<PoolFunctionRole, FunctionProcess>;
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
      return failEarly(err);
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

  /** Runs the mappings, the schedule and the EC2 events until `stop`. */
  run(): void {
    if (this.running) return;
    this.running = true;
    for (const mapping of this.mappings) {
      const role = mapping.fn === this.functions.request ? 'request' : 'fulfil';
      this.loops.push(
        this.loop(async () => {
          // A short long-poll rather than an abort signal: `stop` waits at most this long for a receive.
          const d = await mapping.deliverOnce(POLL_WAIT_SECONDS);
          if (d.records > 0) this.reportDelivery(role, mapping, d);
        }),
      );
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

/**
 * What can never work on moto: the functions connect to the instances (their port, an SSH host key scan)
 * when they run in the instances' VPC or the instances have public addresses, and moto's instances are
 * records, not machines: readiness would wait for a port that never answers.
 */
export function reachabilityWarnings(config: ResolvedConfig, inVpc: boolean): string[] {
  const reaching = awsLabelSettings(config).filter((l) => inVpc || l.publicIpv4 || l.hostKeys === 'scan');
  if (reaching.length === 0) return [];
  const why = inVpc ? 'the functions run in the instances’ VPC' : 'public-ipv4 or host-keys: scan';
  return [
    `the functions connect to the instances of ${[...new Set(reaching.map((l) => `${l.poolKey}/${l.label}`))].join(', ')} ` +
      `(${why}), and moto's instances are not machines: their backing nodes will wait for a port that never answers and fail. ` +
      'Rehearse with the functions outside the VPC, no public-ipv4 and host-keys: console or none.',
  ];
}

async function stackStatus(cfn: CloudFormationClient, stackName: string): Promise<string | undefined> {
  try {
    const out = await cfn.send(new DescribeStacksCommand({ StackName: stackName }));
    return out.Stacks?.[0]?.StackStatus;
  } catch (err) {
    if (/does not exist/.test((err as Error).message)) return undefined;
    throw err;
  }
}

/** Deletes a stack a failed attempt left in a state CloudFormation cannot deploy from; true if it did. */
export async function deleteLeftover(cfn: CloudFormationClient, stackName: string): Promise<boolean> {
  const status = await stackStatus(cfn, stackName);
  if (status === undefined || !LEFTOVER_STATES.has(status)) return false;
  await cfn.send(new DeleteStackCommand({ StackName: stackName }));
  await waitUntilStackDeleteComplete(
    { client: cfn, maxWaitTime: 120, minDelay: 1, maxDelay: 2 },
    { StackName: stackName },
  );
  return true;
}
