import { cliCommand } from '../../client/cliCommand.ts';
import { CliError } from '../errors.ts';
import { motoClientEnv } from '../rehearse/motoEnv.ts';
import type { Rehearsal } from '../rehearse/rehearsal.ts';
import type { LogLevel, RehearsalEvent } from '../rehearse/rehearsalOptions.ts';
import { terminalJson, terminalText } from '../terminal.ts';

export interface RehearseOptions {
  readonly app?: string;
  readonly context?: readonly string[];
  readonly endpoint?: string;
  readonly port?: number;
  readonly reaperInterval?: number;
  readonly concurrency?: number;
  /** False with --no-console-keys. */
  readonly consoleKeys?: boolean;
  readonly logLevel: LogLevel;
  readonly json?: boolean;
}

/**
 * `metastatic rehearse [stack]`: the app deployed to moto and its functions run here (cli/rehearse/), until
 * SIGINT or SIGTERM; then everything is cleaned up. Progress on stderr (`--json`: one JSON object per line
 * on stdout, the functions' logs still on stderr).
 */
export async function rehearse(stack: string | undefined, opts: RehearseOptions): Promise<void> {
  const { Rehearsal } = await import('../rehearse/rehearsal.ts');
  const { RehearsalError } = await import('../rehearse/errors.ts');
  const out = opts.json
    ? (value: object) => process.stdout.write(`${terminalJson(JSON.stringify(value))}\n`)
    : undefined;
  const say = (text: string) => process.stderr.write(terminalText(`${text}\n`));
  const started = Date.now();
  const onEvent = (e: RehearsalEvent) => {
    if (out) out(e);
    else if (!idleReaperRun(e)) say(describe(e, started));
  };
  let stopping = false;
  let stopRequested: ((signal: string) => void) | undefined;
  const signals = new Promise<string>((resolve) => {
    stopRequested = resolve;
  });
  let up = false;
  const onSignal = (signal: string) => () => {
    if (!up) say(`${signal}: the rehearsal stops (and cleans up) once the deploy under way is done...`);
    stopRequested?.(signal);
  };
  const onInt = onSignal('SIGINT');
  const onTerm = onSignal('SIGTERM');
  // A signal while the app deploys: the rehearsal is stopped and cleaned up once it is up.
  process.once('SIGINT', onInt);
  process.once('SIGTERM', onTerm);

  if (!out) say('metastatic rehearse: the AWS deployment of your CDK app, rehearsed offline on moto_server');
  let rehearsal: Rehearsal;
  try {
    rehearsal = await Rehearsal.start({
      cwd: process.cwd(),
      ...(opts.app ? { app: opts.app } : {}),
      context: parseContext(opts.context ?? []),
      ...(stack ? { stack } : {}),
      ...(opts.endpoint ? { endpoint: opts.endpoint } : {}),
      ...(opts.port !== undefined ? { port: opts.port } : {}),
      ...(opts.reaperInterval !== undefined ? { reaperInterval: opts.reaperInterval } : {}),
      ...(opts.concurrency !== undefined ? { concurrency: opts.concurrency } : {}),
      consoleHostKeys: opts.consoleKeys !== false,
      logLevel: opts.logLevel,
      onEvent,
      onFunctionOutput: (role, line) => process.stderr.write(terminalText(`[${role}] ${line}\n`)),
    });
  } catch (err) {
    process.removeListener('SIGINT', onInt);
    process.removeListener('SIGTERM', onTerm);
    if (err instanceof RehearsalError) throw new CliError(err.message);
    throw err;
  }
  up = true;
  const ready = readyReport(rehearsal);
  if (out) out(ready);
  else say(readyText(ready));
  rehearsal.run();

  const signal = await signals;
  if (!stopping) {
    stopping = true;
    if (out) out({ type: 'stopping', signal });
    else
      say(
        `\n${signal}: stopping the rehearsal${rehearsal.moto.owned ? ' and moto_server' : ', destroying the stack'}...`,
      );
    try {
      await rehearsal.close();
    } catch (err) {
      const message = `error while cleaning up: ${(err as Error).message}`;
      if (out) out({ type: 'error', message });
      else say(message);
      process.exitCode = 1;
    }
    if (out) out({ type: 'stopped' });
    else say('stopped.');
  }
}

/** `-c key=value` options as a map; a malformed one is a usage error. */
export function parseContext(pairs: readonly string[]): Record<string, string> {
  const context: Record<string, string> = {};
  for (const pair of pairs) {
    const at = pair.indexOf('=');
    if (at <= 0) throw new CliError(`--context ${pair}: give key=value`, 2);
    context[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return context;
}

/**
 * What the rehearsal running now shows, and what it cannot (docs/deploy.md has the whole table): said
 * when it is up, so nobody takes a rehearsal for more than it is.
 */
export function rehearsalScope(r: Rehearsal): { proves: string[]; cannotProve: string[] } {
  const short = (name: string) => `${name.slice(0, 'asset.'.length + 12)}…`;
  const { verified, problems } = r.assets;
  return {
    proves: [
      "the app synthesizes, and its template deploys through CloudFormation (moto's) with the CDK CLI",
      problems.length === 0
        ? `the functions run the code cdk deploy uploads, unchanged: ${verified.map(short).join(', ')} (each hashes to its name), your configuration in it as written`
        : `NOT that the functions run the code cdk deploy uploads: ${problems.join('; ')}`,
      "the stack's wiring: queues, dead-letter queues, the EC2 rule and its state filter, the schedule, the outputs `metastatic --stack` reads",
      `that code serving requests end to end against moto's APIs (launch, events, readiness, release, the reaper), up to ${r.concurrency} invocation(s) of a function at once`,
      r.network.ids.size === 0
        ? "your configuration launches what it says through EC2's API"
        : "your configuration launches what it says through EC2's API (moto holds your subnets, groups and images under its own ids; the rehearsal's EC2 proxy translates)",
    ],
    cannotProve: [
      r.proxy.consoleHostKeys
        ? "that your image prints its SSH host keys: moto's consoles print none, so the rehearsal adds a made-up block (marked as such); nodes carry that key, and nothing answers SSH with it"
        : "anything about host keys: moto's consoles print none and none is added (--no-console-keys), so with host-keys: console every backing node fails at boot-timeout, as with an image that prints none",
      'IAM: moto evaluates no policy (roles, queue and key policies, iam:PassRole)',
      `what moto's CloudFormation skips: ${r.pool.notCreated.join(', ') || 'nothing'}`,
      "real EC2: timing (moto launches and terminates at once), capacity, quotas, spot interruptions, the network (moto's instances are records, not machines)",
      `Lambda itself: its pollers and scaling past ${r.concurrency} at once, Node.js 24 (this runs Node.js ${process.versions.node})`,
      ...(r.config.github?.enabled
        ? [
            'the github function: deployed, not run (moto makes no function URL, no secrets, and no SSM agent runs its commands; test/aws/githubFunction.test.ts runs its handlers)',
          ]
        : []),
    ],
  };
}

/** What `--json` prints once the pool is up, and the text version's content. */
export function readyReport(r: Rehearsal) {
  // EC2 through the rehearsal's proxy, as the functions call it: your configuration's ids, not moto's.
  const env = { ...motoClientEnv(r.moto.endpoint, r.region), AWS_ENDPOINT_URL_EC2: r.proxy.endpoint };
  const label = [...r.config.metastaticLabelNames][0] ?? 'LABEL';
  const request = JSON.stringify({ kind: 'request', id: 'try-1', labels: [label], requestor: 'me' });
  const release = JSON.stringify({ kind: 'release', nodeId: 'try-1/0' });
  const awsSqs = `aws --endpoint-url ${r.moto.endpoint} --region ${r.region} sqs send-message`;
  return {
    type: 'ready' as const,
    stackName: r.pool.stackName,
    region: r.region,
    account: r.account,
    endpoint: r.moto.endpoint,
    motoOwned: r.moto.owned,
    poolId: r.pool.poolId,
    requestQueueUrl: r.pool.requestQueueUrl,
    tableName: r.pool.tableName,
    labels: [...r.config.metastaticLabelNames],
    reaperInterval: r.reaperInterval,
    functions: Object.fromEntries(
      Object.entries(r.pool.functions).map(([role, fn]) => [role, fn.functionName]),
    ),
    /** Invocations of the request or fulfil function at once (each a process); the reaper's: one. */
    concurrency: r.concurrency,
    /** `made-up`: a host-key block the rehearsal adds to moto's consoles; `none`: --no-console-keys. */
    consoleHostKeys: r.proxy.consoleHostKeys ? ('made-up' as const) : ('none' as const),
    /** The functions' code directories checked against their asset hashes, and what could not be. */
    assets: { verified: r.assets.verified, problems: r.assets.problems },
    network: Object.fromEntries(r.network.ids),
    ec2Endpoint: r.proxy.endpoint,
    notCreated: r.pool.notCreated,
    ...rehearsalScope(r),
    env,
    commands: [
      `export ${Object.entries(env)
        .map(([k, v]) => `${k}=${v}`)
        .join(' ')}`,
      // --endpoint-url and --region as well: the AWS CLI v1 reads neither from the environment.
      `${awsSqs} --queue-url ${r.pool.requestQueueUrl} --message-body '${request}'`,
      `${cliCommand()} --stack ${r.pool.stackName} status --watch`,
      `${awsSqs} --queue-url ${r.pool.requestQueueUrl} --message-body '${release}'`,
    ],
  };
}

function readyText(ready: ReturnType<typeof readyReport>): string {
  const [exportLine, sendRequest, watch, sendRelease] = ready.commands;
  return [
    '',
    `Rehearsal running: stack ${ready.stackName} (pool ${ready.poolId}) in ${ready.region}, on moto at ${ready.endpoint}`,
    `  request queue   ${ready.requestQueueUrl}`,
    `  table           ${ready.tableName}`,
    `  labels          ${ready.labels.join(', ')}`,
    `  functions       ${Object.values(ready.functions).join(', ')}: run here, fed by their queues; the reaper every ${ready.reaperInterval} s`,
    '                  (a line for each run that does something);',
    "                  EC2's state-change events sent as moto's instances change state",
    `  concurrency     up to ${ready.concurrency} invocation(s) of the request and of the fulfil function at once (--concurrency)`,
    ready.consoleHostKeys === 'made-up'
      ? "  host keys       MADE UP: moto's consoles print none, so the rehearsal adds a host-key block to each (--no-console-keys: none)"
      : "  host keys       none on moto's consoles (--no-console-keys): with host-keys: console, backing nodes fail at boot-timeout",
    `  EC2 endpoint    ${ready.ec2Endpoint} (the functions': your configuration's ids, moto's behind)`,
    `  not created     ${ready.notCreated.join(', ') || 'none'} (moto skips these types)`,
    '',
    'What this rehearsal proves:',
    ...ready.proves.map((line) => `  - ${line}`),
    'What it cannot prove (docs/deploy.md, Rehearse offline):',
    ...ready.cannotProve.map((line) => `  - ${line}`),
    '',
    'Try it from another shell:',
    `  ${exportLine}`,
    `  ${sendRequest}`,
    `  ${watch}`,
    `  ${sendRelease}         # then, after grace-time, the reaper terminates the instance`,
    `  (or: ${cliCommand()} --stack ${ready.stackName} request ${ready.labels[0] ?? 'LABEL'} --wait)`,
    ready.motoOwned
      ? 'Ctrl-C stops the rehearsal and moto_server (everything in it goes with it).'
      : 'Ctrl-C stops the rehearsal, destroys the stack and terminates the pool’s instances (the table stays, as on AWS).',
    '',
  ].join('\n');
}

/** A reaper run that found nothing to do: not worth a line of text (JSON has every run). */
function idleReaperRun(e: RehearsalEvent): boolean {
  return (
    e.type === 'reaper' &&
    !e.error &&
    e.retired.length + e.stopped.length + e.failed.length + e.errors.length === 0
  );
}

/** One progress line. */
function describe(e: RehearsalEvent, started: number): string {
  const at = `[${((Date.now() - started) / 1000).toFixed(1).padStart(6)} s]`;
  const took = (ms?: number) => (ms === undefined ? '' : ` (${(ms / 1000).toFixed(1)} s)`);
  switch (e.type) {
    case 'step':
      return `${at} ${e.message}${took(e.ms)}`;
    case 'warning':
      return `${at} warning: ${e.message}`;
    case 'error':
      return `${at} error: ${e.message}`;
    case 'delivery':
      return `${at} ${e.function}: ${e.records} record(s) from ${e.queue}, ${e.failed} failed${e.error ? ` (${e.error})` : ''}${took(e.ms)}`;
    case 'ec2':
      return `${at} ec2: ${e.instanceId} ${e.state} (event sent)`;
    case 'reaper':
      return e.error
        ? `${at} reaper: failed: ${e.error}${took(e.ms)}`
        : `${at} reaper: retired ${e.retired.length}, stopped ${e.stopped.length}, failed ${e.failed.length}${e.errors.length ? `, errors: ${e.errors.join('; ')}` : ''}${took(e.ms)}`;
  }
}
