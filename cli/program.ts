import { Argument, Command, Option } from 'commander';
import { MAX_LEASE, MIN_LEASE } from '../shared/core/leases.ts';
import type { Target } from './client.ts';
import type { Level } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { leaseSeconds, positiveSeconds, requestOptions, seconds } from './options.ts';
import { packageVersion } from './packageInfo.ts';
import { addJobCommands } from './programJobs.ts';
import { addRehearse } from './programRehearse.ts';

/**
 * The `metastatic` command line: every command, its arguments and options, and its help. Each command's
 * work is in its own module under commands/, imported only when that command runs, so `--help` and a
 * quick `list` load none of the modules the others need (the embedded engines, the CDK, ...). The
 * commands that run jobs on nodes (ssh, run, inventory) are in programJobs.ts, `rehearse` in
 * programRehearse.ts, the option parsers they share in options.ts.
 */

interface GlobalOptions {
  readonly stateDir?: string;
  readonly stack?: string;
  readonly region?: string;
  readonly stackConfig?: string;
}

export function buildProgram(): Command {
  const program = new Command()
    .name('metastatic')
    .description(
      'A pool of small nodes packed as slots onto larger backing machines.\n' +
        'Run an embedded pool with `metastatic dev`, then request nodes from another shell.',
    )
    .option(
      '--state-dir <dir>',
      'state directory of the embedded pool (default: $METASTATIC_STATE_DIR or .metastatic)',
    )
    .option('--stack <name>', 'use a pool deployed with `cdk deploy` instead (default: $METASTATIC_STACK)')
    .option('--region <region>', 'with --stack: its region (default: $AWS_REGION)')
    .option('--stack-config <file>', 'with --stack: the pool configuration, for hold / drain / reap')
    .version(packageVersion(), '-V, --version', 'print the version')
    .showHelpAfterError('(run with --help for usage)')
    .exitOverride();

  const stateDir = async () =>
    (await import('../shared/runtime/embeddedInfo.ts')).stateDirFrom(program.opts<GlobalOptions>().stateDir);
  /** Where the pool is: an embedded pool by state dir, or a deployed one by --stack / METASTATIC_STACK. */
  const target = async (): Promise<Target> => {
    const o = program.opts<GlobalOptions>();
    return {
      stateDir: await stateDir(),
      stack: o.stack ?? process.env.METASTATIC_STACK,
      region: o.region,
      config: o.stackConfig,
    };
  };

  program
    .command('dev')
    .description(
      'run the pool on this machine: DynamoDB (dynalite), SQS (fauxqs) and local backing processes',
    )
    .option(
      '-c, --config <file>',
      'pool configuration (default: ./metastatic.yaml if present, else the shipped example)',
    )
    .option('--reaper-interval <seconds>', 'seconds between reaper runs', seconds('--reaper-interval'), 60)
    .addOption(
      new Option('--log-level <level>', 'log level')
        .choices(['debug', 'info', 'warn', 'error'])
        .default('info'),
    )
    .option('--log-json', 'log JSON lines (as in Lambda) instead of text')
    .action(async (opts: { config?: string; reaperInterval: number; logLevel: Level; logJson?: boolean }) => {
      const { dev } = await import('./commands/dev.ts');
      await dev(await stateDir(), opts);
    });

  requestOptions(
    program
      .command('request')
      .description(
        'request one node per LABEL (several labels form a node set, served all-or-nothing), or nodes by shape (--cores, --memory, --disk)',
      )
      .argument('[labels...]', 'labels to request (or give a shape instead)'),
    'the nodes will be kept',
  )
    .option(
      '--lease <seconds>',
      `client lease: renew it with \`metastatic renew\` or the reaper releases the nodes (${MIN_LEASE} to ${MAX_LEASE})`,
      leaseSeconds,
    )
    .option('-w, --wait', 'wait until the request is fulfilled or failed')
    .option('--timeout <seconds>', 'with --wait: give up after this many seconds', seconds('--timeout'), 300)
    .option('--json', 'print the request as JSON')
    .action(async (labels: string[], opts) => {
      const { request } = await import('./commands/request.ts');
      await request(await target(), labels, opts);
    });

  program
    .command('release')
    .description(
      'release a node, or every node of a request (--request): slots are freed and backing nodes may go after grace-time',
    )
    .argument('[node-id]', 'the node id, as printed by `request` (<request-id>/<index>)')
    .option('--request <id>', 'release every node of this request instead (held ones kept without --force)')
    .option(
      '--timeout <seconds>',
      'wait at most this long for the release to be applied',
      seconds('--timeout'),
      30,
    )
    .option('--force', 'release a held node too')
    .option('--json', 'print the node as JSON')
    .action(async (nodeId: string | undefined, opts) => {
      const { release, releaseRequest } = await import('./commands/request.ts');
      if ((nodeId === undefined) === (opts.request === undefined)) {
        throw new CliError('give a node id or --request <id>, not both (nor neither)', 2);
      }
      if (opts.request !== undefined) await releaseRequest(await target(), opts.request, opts);
      else await release(await target(), nodeId as string, opts);
    });

  program
    .command('renew')
    .description(
      "renew a request's lease from now (its own length, or --lease): without renewals the reaper releases its nodes",
    )
    .argument('<request-id>', 'the request id, as printed by `request`')
    .option(
      '--lease <seconds>',
      `a new lease length (${MIN_LEASE} to ${MAX_LEASE}, within max-lease)`,
      leaseSeconds,
    )
    .option(
      '--timeout <seconds>',
      'wait at most this long for the renewal to be applied',
      seconds('--timeout'),
      30,
    )
    .option('--json', 'print the request as JSON')
    .action(async (requestId: string, opts) => {
      const { renew } = await import('./commands/request.ts');
      await renew(await target(), requestId, opts);
    });

  program
    .command('cancel')
    .description(
      'end a request that is not fulfilled yet: a waiting one fails, a placed one fails with its nodes',
    )
    .argument('<request-id>', 'the request id, as printed by `request`')
    .option('--reason <text>', 'why, recorded as the request\'s reason after "cancelled: "')
    .option(
      '--timeout <seconds>',
      'wait at most this long for the cancel to be applied',
      seconds('--timeout'),
      30,
    )
    .option('--json', 'print the request as JSON')
    .action(async (requestId: string, opts) => {
      const { cancel } = await import('./commands/request.ts');
      await cancel(await target(), requestId, opts);
    });

  program
    .command('hold')
    .description('keep a node, and so its backing node, until it is released with --force')
    .argument('<node-id>', 'the node id (<request-id>/<index>)')
    .option('--json', 'print the node as JSON')
    .action(async (nodeId: string, opts) => {
      const { hold } = await import('./commands/operator.ts');
      await hold(await target(), nodeId, opts);
    });

  program
    .command('drain')
    .description('stop new allocations on a backing node; it is stopped as soon as it is empty')
    .argument('<backing-id>', 'the backing node id (see `metastatic list backing`)')
    .option('--json', 'print the backing node as JSON')
    .action(async (id: string, opts) => {
      const { drain } = await import('./commands/operator.ts');
      await drain(await target(), id, opts);
    });

  program
    .command('reap')
    .description('run the reaper once now: retire idle backing nodes, enforce deadlines, reconcile')
    .option('--json', 'print the reaper report as JSON')
    .action(async (opts) => {
      const { reap } = await import('./commands/operator.ts');
      await reap(await target(), opts);
    });

  addJobCommands(program, target);

  program
    .command('list')
    .description('list nodes, backing nodes or requests')
    .addArgument(new Argument('<what>', 'what to list').choices(['nodes', 'backing', 'requests']))
    .option('--all', 'include released nodes, stopped backing nodes and finished requests')
    .option('--json', 'print JSON')
    .action(async (what: 'nodes' | 'backing' | 'requests', opts) => {
      const { list } = await import('./commands/list.ts');
      await list(await target(), what, opts);
    });

  program
    .command('status')
    .description(
      'the pool on one screen: labels, backing nodes with their slots, waiting requests, last events',
    )
    .option('-w, --watch', 'refresh in place like top until Ctrl-C (plain snapshots when not a terminal)')
    .option(
      '--interval <seconds>',
      'with --watch: seconds between refreshes',
      positiveSeconds('--interval'),
      2,
    )
    .option('--json', 'print JSON (with --watch: one object per line)')
    .action(async (opts) => {
      const { status } = await import('./commands/status.ts');
      await status(await target(), opts);
    });

  addRehearse(program);

  program
    .command('validate')
    .description('check a configuration file; prints every error with its YAML path')
    .argument('<file>', 'the YAML configuration')
    .option(
      '--shape <shape>',
      'check that a request by this shape (cores=2,memory=4GiB) can be served, and by which label; repeatable',
      (v: string, all: string[] = []) => [...all, v],
    )
    .option('--json', "print the errors, the labels' slot shapes and the checked shapes as JSON")
    .option(
      '--functions-in-vpc',
      "check for an AWS deployment whose functions run in the instances' VPC (cdk synth -c vpcId=…); " +
        'default: outside any VPC, as synth deploys them without one',
    )
    .action(async (file: string, opts) => {
      const { validate } = await import('./commands/config.ts');
      await validate(file, opts);
    });

  program
    .command('schema')
    .description('print the JSON Schema of the configuration (for editors)')
    .option('--out <file>', 'write it to a file instead')
    .action(async (opts) => {
      const { schema } = await import('./commands/config.ts');
      await schema(opts);
    });

  return program;
}
