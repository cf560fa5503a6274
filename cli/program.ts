import { Argument, Command, InvalidArgumentError, Option } from 'commander';
import { MAX_LEASE, MIN_LEASE } from '../shared/core/leases.ts';
import { MAX_PRIORITY } from '../shared/core/priority.ts';
import type { Target } from './client.ts';
import type { Level } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { packageVersion } from './packageInfo.ts';

/**
 * The `metastatic` command line: every command, its arguments and options, and its help. Each command's
 * work is in its own module under commands/, imported only when that command runs, so `--help` and a
 * quick `list` load none of the modules the others need (the embedded engines, the CDK, ...).
 */

const seconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0)
    throw new InvalidArgumentError(`${name} must be a number of seconds >= 0`);
  return n;
};

const positiveSeconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0.1 || n > 3600)
    throw new InvalidArgumentError(`${name} must be a number of seconds from 0.1 to 3600`);
  return n;
};

/**
 * A priority as a message carries it: an integer written in decimal, within the bounds. Strict, where
 * parseInt read `1e300` as 1 and `0x10` as 0.
 */
const priority = (value: string) => {
  const n = Number(value);
  if (!/^[+-]?\d{1,7}$/.test(value.trim()) || Math.abs(n) > MAX_PRIORITY)
    throw new InvalidArgumentError(`--priority must be an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY}`);
  return n;
};

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
      Number,
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
      Number,
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

  program
    .command('ssh')
    .description(
      "log in to a node with OpenSSH's ssh, or run COMMAND there; exits with ssh's exit status (the command's)",
    )
    .argument('<node-id>', 'the node id (<request-id>/<index>)')
    .argument('[command...]', 'after --: the remote command and its arguments (no local shell reads them)')
    .option(
      '-i, --identity <file>',
      "private key to log in with (default: the embedded pool's client key, <state-dir>/client_ed25519; required with --stack)",
    )
    .option('-l, --user <name>', "log in as this user (default: the node's username)")
    .option('--timeout <seconds>', 'wait this long for a pending node to be ready', seconds('--timeout'), 300)
    .addHelpText(
      'after',
      [
        '',
        'The host is verified: ssh runs with StrictHostKeyChecking=yes and a known_hosts written for this',
        "call from the node's recorded host keys (never your own ~/.ssh/known_hosts), IdentitiesOnly=yes,",
        'no password. A released, failed or unknown node is refused with the reason.',
        '',
        'Examples:',
        '  metastatic ssh req-1/0                    an interactive shell on the node',
        '  metastatic ssh req-1/0 -- uname -a        run a command; its exit status is this one',
        '  metastatic --stack pool ssh req-1/0 -i ~/.ssh/ci_ed25519 -- make test',
      ].join('\n'),
    )
    .action(async (nodeId: string, command: string[], opts) => {
      const { ssh } = await import('./commands/ssh.ts');
      await ssh(await target(), nodeId, command, opts);
    });

  requestOptions(
    program
      .command('run')
      .description(
        "request nodes, run COMMAND on the first over SSH, release them whatever happens; exits with the command's status",
      )
      .argument('[labels...]', 'labels to request (or a shape), then -- and the command with its arguments')
      .usage('[options] [labels...] -- command [args...]'),
    'the command will run',
  )
    .option(
      '--lease <seconds>',
      `client lease, renewed every third of it while the command runs (${MIN_LEASE} to ${MAX_LEASE}, default 60)`,
      Number,
    )
    .option(
      '--timeout <seconds>',
      'give up waiting for the nodes after this many seconds',
      seconds('--timeout'),
      300,
    )
    .option(
      '-i, --identity <file>',
      "private key to log in with (default: the embedded pool's client key; required with --stack)",
    )
    .option('-l, --user <name>', "log in as this user (default: the node's username)")
    .option('-q, --quiet', 'no progress lines on stderr (errors are still printed)')
    .addHelpText(
      'after',
      [
        '',
        'Everything after -- is the command, passed to the node as one shell-quoted command line: each',
        'argument reaches it exactly as given (no local shell reads it; spaces, quotes, $ and ; stay as they',
        "are). Use sh -c '...' for shell syntax. stdin, stdout and stderr are the command's, byte for byte;",
        "metastatic's own progress goes to stderr only. Logging in is as `metastatic ssh` does it (host",
        "verified from the node's record, StrictHostKeyChecking=yes, the pool's client key).",
        '',
        'The request always takes a lease (--lease, default 60 s), renewed while the command runs: if this',
        'process is killed (kill -9), the nodes are released within the lease plus one reaper interval.',
        'Whatever happens (the command exits, an error, Ctrl-C, SIGTERM, SIGHUP) the request is released.',
        'With several labels the command runs on the first node; every node is listed in',
        '$METASTATIC_NODES on the node (a line each: id host port username, the first one first), the',
        'request id is in $METASTATIC_REQUEST_ID, and the other nodes are printed on stderr.',
        '',
        'Exit status:',
        "  0-255  the command's own (128+n when a signal n killed it; 255 when ssh itself failed)",
        '  2      usage: bad options, no command after --, labels the pool does not have',
        '  123    the pool stopped, or ended the node (released elsewhere, lease lapsed), under the command',
        '  124    no node could be had: the request failed (its reason is printed) or --timeout passed',
        '  125    metastatic run failed before the command ran: no pool running, a key file others can read,',
        '         a node without host keys, ssh not installed',
        '  128+n  this process got signal n (SIGINT 130, SIGTERM 143, SIGHUP 129); its nodes were released',
        '',
        'Examples:',
        "  metastatic run small-node -- sh -c 'echo hi; exit 3'        prints hi, exits 3",
        '  metastatic run --cores 2 --memory 4GiB --lease 120 -- make -j2 test',
        '  metastatic --stack pool run small-node -i ~/.ssh/ci_ed25519 -- ./ci.sh',
      ].join('\n'),
    )
    .action(async (operands: string[], opts) => {
      const { run } = await import('./commands/run.ts');
      const { labels, command } = splitCommand(operands, process.argv);
      await run(await target(), labels, command, opts);
    });

  program
    .command('inventory')
    .description(
      "print an Ansible inventory of a request's ready nodes (YAML, or JSON), and write the known_hosts it needs",
    )
    .argument('<request-id>', 'the request whose nodes to list')
    .option('--json', 'print the inventory as JSON (Ansible reads it from a file named *.json)')
    .option(
      '--known-hosts <file>',
      "write the nodes' host keys here, 0600 (default: <state-dir>/known_hosts.d/<request-id>; required with --stack)",
    )
    .option(
      '-i, --identity <file>',
      "private key the inventory logs in with (default: the embedded pool's client key; with --stack: none, ssh's own)",
    )
    .option(
      '--timeout <seconds>',
      'wait this long for a request still being served',
      seconds('--timeout'),
      300,
    )
    .option('--ready-only', 'leave released or failed nodes out (default: refuse a request that has any)')
    .addHelpText(
      'after',
      [
        '',
        'Each node is a host named after its node id (req-1/0 -> req-1-0), with ansible_host, ansible_port,',
        'ansible_user, ansible_connection, ansible_python_interpreter (python-path; auto = discovery),',
        'ansible_shell_type (shell-type, when set), ansible_ssh_private_key_file and a `metastatic` variable',
        '(node_id, request_id, label, slot, backing_node_id, attributes); one group per label (small-node ->',
        'small_node). The host is verified as `metastatic ssh` does it: ansible_ssh_common_args point ssh at',
        'the written known_hosts only (StrictHostKeyChecking=yes, never your ~/.ssh/known_hosts) and',
        'ansible_host_key_checking is true. Every string is marked !unsafe: Ansible never templates it.',
        'Progress and notes go to stderr; exit 1 for an unknown or failed request, 2 for a bad request id.',
        '',
        'Examples:',
        '  metastatic request small-node small-node --id job --wait',
        '  metastatic inventory job > inventory.yaml && ansible-playbook -i inventory.yaml site.yaml',
        '  metastatic --stack pool inventory job --known-hosts job.known_hosts -i ~/.ssh/ci_ed25519 --json > inv.json',
      ].join('\n'),
    )
    .action(async (requestId: string, opts) => {
      const { inventory } = await import('./commands/inventory.ts');
      await inventory(await target(), requestId, opts);
    });

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

  program
    .command('rehearse')
    .description(
      'deploy your CDK app (one that embeds MetastaticPool) to moto_server and run its functions here, as Lambda would, until Ctrl-C',
    )
    .argument('[stack]', "the stack to rehearse (default: the app's only stack with a pool)")
    .option(
      '--app <command|dir>',
      "the CDK app, as `cdk --app` takes it: a command, or a cloud assembly directory (default: cdk.json's)",
    )
    .option(
      '-c, --context <key=value>',
      "context for `cdk synth`; repeatable (e.g. -c config=my-pool.yaml for this repository's app)",
      (v: string, all: string[] = []) => [...all, v],
    )
    .option('--endpoint <url>', 'use the moto_server running there (default: start one)')
    .option('--port <n>', 'the port of the moto_server started (default: a free one)', (v: string) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 1 || n > 65535)
        throw new InvalidArgumentError('--port must be a port number (1-65535)');
      return n;
    })
    .option(
      '--reaper-interval <seconds>',
      "seconds between reaper runs (default: the deployed schedule's rate)",
      positiveSeconds('--reaper-interval'),
    )
    .addOption(
      new Option('--log-level <level>', "the functions' log level (their logs go to stderr)")
        .choices(['debug', 'info', 'warn', 'error'])
        .default('warn'),
    )
    .option('--json', 'print progress as JSON lines on stdout (one object each)')
    .addHelpText(
      'after',
      [
        '',
        "It synthesizes the app and deploys it with the CDK CLI (the app's own aws-cdk, else this package's),",
        "into moto_server (pip install 'moto[server]'), then runs the deployed functions' code on this machine:",
        "polling the deployed queues as Lambda's event source mappings do (batches, partial batch failures,",
        'visibility timeouts), the reaper on its schedule, and the EC2 state-change events EventBridge would',
        "deliver as moto's instances change state. It prints what to type in another shell (aws sqs",
        'send-message, metastatic --stack ... status --watch, with the endpoint settings) and runs until Ctrl-C,',
        'then stops moto (or, with --endpoint, destroys the stack). What it proves and what it cannot (IAM,',
        'real timing, real capacity): docs/deploy.md.',
        '',
        'Examples:',
        "  metastatic rehearse                                  in your CDK app's directory (its cdk.json)",
        '  metastatic rehearse --app "node out/app.js" CiPool   a compiled app, one of its stacks',
        "  metastatic rehearse -c config=my-pool.yaml           this repository's app (bin/cdk.ts)",
        '  metastatic rehearse --endpoint http://localhost:5000 --reaper-interval 5 --json',
      ].join('\n'),
    )
    .action(async (stack: string | undefined, opts) => {
      const { rehearse } = await import('./commands/rehearse.ts');
      await rehearse(stack, opts);
    });

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

/**
 * A command's operands split at the `--` that ended its options: the labels before it, the command after.
 * Commander drops that `--` from the operands; the first `--` of the command line whose rest is the
 * operands' tail is it (an earlier one was an option's value; later ones belong to the command).
 */
export function splitCommand(
  operands: readonly string[],
  argv: readonly string[],
): { labels: string[]; command: string[] } {
  for (let i = argv.indexOf('--'); i >= 0; i = argv.indexOf('--', i + 1)) {
    const rest = argv.slice(i + 1);
    const at = operands.length - rest.length;
    if (at >= 0 && rest.every((a, k) => operands[at + k] === a)) {
      return { labels: operands.slice(0, at), command: rest };
    }
  }
  return { labels: [...operands], command: [] };
}

/** What a request is made of, as `request` and `run` take it: labels or a shape, and how to place it. */
function requestOptions(command: Command, kept: string): Command {
  return command
    .option('--cores <n>', 'by shape: cores each node needs', (v) => {
      const n = Number(v);
      if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError('--cores must be a number > 0');
      return n;
    })
    .option('--memory <size>', 'by shape: memory each node needs ("4GiB")')
    .option('--disk <size>', 'by shape: disk each node needs ("20GiB")')
    .option('--count <n>', 'by shape: how many nodes of that shape, served together (default: 1)', (v) =>
      Number(v),
    )
    .option('--id <id>', 'request id (default: generated); re-sending the same id never allocates twice')
    .option('--requestor <name>', 'who asks (recorded with the request)', 'cli')
    .option(
      '--priority <n>',
      `request priority: an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY}, lower first (default: 100)`,
      priority,
    )
    .option(
      '--expected-duration <seconds>',
      `how long ${kept}: placed beside nodes expected to end about then`,
      seconds('--expected-duration'),
    );
}
