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

/** What `--json` prints once the pool is up, and the text version's content. */
export function readyReport(r: Rehearsal) {
  const env = motoClientEnv(r.moto.endpoint, r.region);
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
    network: Object.fromEntries(r.network.ids),
    notCreated: r.pool.notCreated,
    env,
    commands: [
      `export ${Object.entries(env)
        .map(([k, v]) => `${k}=${v}`)
        .join(' ')}`,
      // --endpoint-url and --region as well: the AWS CLI v1 reads neither from the environment.
      `${awsSqs} --queue-url ${r.pool.requestQueueUrl} --message-body '${request}'`,
      `npx metastatic --stack ${r.pool.stackName} status --watch`,
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
    `  not created     ${ready.notCreated.join(', ') || 'none'} (moto skips these types)`,
    '',
    'Try it from another shell:',
    `  ${exportLine}`,
    `  ${sendRequest}`,
    `  ${watch}`,
    `  ${sendRelease}         # then, after grace-time, the reaper terminates the instance`,
    `  (or: npx metastatic --stack ${ready.stackName} request ${ready.labels[0] ?? 'LABEL'} --wait)`,
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
