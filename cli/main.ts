import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Argument, Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { configJsonSchema } from '../shared/config/jsonSchema.ts';
import { formatConfigErrors, loadConfigFile } from '../shared/config/load.ts';
import { PermanentError } from '../shared/core/errors.ts';
import { parseNodeId } from '../shared/core/ids.ts';
import { MAX_NODE_SET, RequestMessage } from '../shared/core/messages.ts';
import type { NodeRecord, RequestRecord } from '../shared/core/records.ts';
import { stateDirFrom } from '../shared/runtime/devInfo.ts';
import { DevStack } from '../shared/runtime/devStack.ts';
import type { Context } from '../shared/usecases/context.ts';
import { drainBacking, holdNode } from '../shared/usecases/operator.ts';
import { reap } from '../shared/usecases/reap.ts';
import { connect } from './client.ts';
import { consoleLog, type Level } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { ago, backingJson, nodeJson, requestJson, table } from './format.ts';
import { terminalJson, terminalText } from './terminal.ts';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const exampleConfig = join(packageRoot, 'examples', 'local.yaml');

const seconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0)
    throw new InvalidArgumentError(`${name} must be a number of seconds >= 0`);
  return n;
};

const print = (text: string) => process.stdout.write(`${terminalText(text)}\n`);
const printJson = (value: unknown) =>
  process.stdout.write(`${terminalJson(JSON.stringify(value, null, 2))}\n`);

const program = new Command()
  .name('metastatic')
  .description(
    'A pool of small nodes packed as slots onto larger backing machines.\n' +
      'Run a local pool with `metastatic dev`, then request nodes from another shell.',
  )
  .option(
    '--state-dir <dir>',
    'state directory of the local pool (default: $METASTATIC_STATE_DIR or .metastatic)',
  )
  .option('--stack <name>', 'use a pool deployed with `cdk deploy` instead (default: $METASTATIC_STACK)')
  .option('--region <region>', 'with --stack: its region (default: $AWS_REGION)')
  .option('--stack-config <file>', 'with --stack: the pool configuration, for hold / drain / reap')
  .showHelpAfterError('(run with --help for usage)')
  .exitOverride();

const stateDir = () => stateDirFrom(program.opts<{ stateDir?: string }>().stateDir);
/** Where the pool is: a local stack by state dir, or a deployed one by --stack / METASTATIC_STACK. */
const target = () => {
  const o = program.opts<{ stateDir?: string; stack?: string; region?: string; stackConfig?: string }>();
  return {
    stateDir: stateDir(),
    stack: o.stack ?? process.env.METASTATIC_STACK,
    region: o.region,
    config: o.stackConfig,
  };
};

program
  .command('dev')
  .description('run the pool on this machine: DynamoDB (dynalite), SQS (fauxqs) and local backing processes')
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
    const configPath = resolve(
      opts.config ?? (existsSync('metastatic.yaml') ? 'metastatic.yaml' : exampleConfig),
    );
    const loaded = await loadConfigFile(configPath);
    if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
    const log = consoleLog(opts.logLevel, opts.logJson);
    for (const n of loaded.config.notices) log.warn(`${configPath}: ${n.path}: ${n.message}`);
    const stack = await DevStack.start({
      config: loaded.config,
      configPath,
      stateDir: stateDir(),
      reaperInterval: opts.reaperInterval,
      log,
    });
    const labels = [...loaded.config.metastaticLabelNames].join(', ');
    process.stderr.write(
      [
        `metastatic pool running (config ${configPath})`,
        `  state dir       ${stack.info.stateDir}`,
        `  DynamoDB        ${stack.info.dynamodbEndpoint}  table ${stack.info.tableName}`,
        `  SQS             ${stack.info.sqsEndpoint}`,
        `  request queue   ${stack.info.requestQueueUrl}`,
        `  labels          ${labels}`,
        `  reaper every    ${opts.reaperInterval}s`,
        `Try it from another shell:  npx metastatic request ${[...loaded.config.metastaticLabelNames][0] ?? 'LABEL'} --wait`,
        'Ctrl-C stops the pool and every backing process.',
        '',
      ]
        .map(terminalText)
        .join('\n'),
    );
    await new Promise<void>((done) => {
      let stopping = false;
      const stop = (signal: string) => {
        if (stopping) return;
        stopping = true;
        process.stderr.write(`\n${signal}: stopping the pool...\n`);
        stack.stop().then(done, (err) => {
          process.stderr.write(terminalText(`error while stopping: ${(err as Error).message}\n`));
          done();
        });
      };
      process.once('SIGINT', () => stop('SIGINT'));
      process.once('SIGTERM', () => stop('SIGTERM'));
    });
    process.stderr.write('stopped.\n');
  });

program
  .command('request')
  .description('request one node per LABEL (several labels form a node set, served all-or-nothing)')
  .argument('<labels...>', 'labels to request')
  .option('--id <id>', 'request id (default: generated); re-sending the same id never allocates twice')
  .option('--requestor <name>', 'who asks (recorded with the request)', 'cli')
  .option('--priority <n>', 'request priority', (v) => Number.parseInt(v, 10))
  .option('-w, --wait', 'wait until the request is fulfilled or failed')
  .option('--timeout <seconds>', 'with --wait: give up after this many seconds', seconds('--timeout'), 300)
  .option('--json', 'print the request as JSON')
  .action(
    async (
      labels: string[],
      opts: {
        id?: string;
        requestor: string;
        priority?: number;
        wait?: boolean;
        timeout: number;
        json?: boolean;
      },
    ) => {
      const id = opts.id ?? `req-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
      const parsed = RequestMessage.safeParse({
        kind: 'request',
        id,
        labels,
        requestor: opts.requestor,
        priority: opts.priority,
      });
      if (!parsed.success) {
        throw new CliError(parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('\n'), 2);
      }
      if (labels.length > MAX_NODE_SET) throw new CliError(`at most ${MAX_NODE_SET} labels per request`, 2);
      const client = await connect(target());
      try {
        await client.send(parsed.data);
        if (!opts.wait) {
          const r = await client.store.getRequest(id);
          const shown = r ? requestJson(r) : { id, state: 'requested', labels, nodes: [] };
          if (opts.json) printJson(shown);
          else print(`request ${id} sent (${shown.state}); follow it with: metastatic list requests`);
          return;
        }
        const r = await waitForRequest(client.store, id, opts.timeout);
        if (opts.json)
          printJson(r ? requestJson(r) : { id, state: 'requested', labels, nodes: [], reason: 'timed out' });
        else if (r) printRequest(r);
        if (!r || r.state !== 'fulfilled') {
          const why =
            !r || r.state === 'requested' || r.state === 'pending'
              ? `timed out after ${opts.timeout}s`
              : r.reason;
          process.exitCode = 1;
          if (!opts.json)
            process.stderr.write(
              terminalText(`request ${id} ${r?.state === 'failed' ? 'failed' : 'not fulfilled'}: ${why}\n`),
            );
        }
      } finally {
        client.close();
      }
    },
  );

program
  .command('release')
  .description('release a node: its slot is freed and its backing node may go after grace-time')
  .argument('<node-id>', 'the node id, as printed by `request` (<request-id>/<index>)')
  .option(
    '--timeout <seconds>',
    'wait at most this long for the release to be applied',
    seconds('--timeout'),
    30,
  )
  .option('--force', 'release a held node too')
  .option('--json', 'print the node as JSON')
  .action(async (nodeIdArg: string, opts: { timeout: number; force?: boolean; json?: boolean }) => {
    const parsed = parseNodeId(nodeIdArg);
    if (!parsed)
      throw new CliError(`"${nodeIdArg}" is not a node id (node ids look like <request-id>/<index>)`, 2);
    const client = await connect(target());
    try {
      const node = (await client.store.getRequest(parsed.requestId))?.nodes[parsed.index];
      if (!node) throw new CliError(`unknown node ${nodeIdArg}`);
      if (node.held && !opts.force && (node.state === 'ready' || node.state === 'pending')) {
        throw new CliError(`node ${nodeIdArg} is held; release it with --force`);
      }
      if (node.state !== 'released' && node.state !== 'failed') {
        await client.send({ kind: 'release', nodeId: nodeIdArg, ...(opts.force ? { force: true } : {}) });
        const deadline = Date.now() + opts.timeout * 1000;
        let current: NodeRecord | undefined = node;
        while (
          current &&
          current.state !== 'released' &&
          current.state !== 'failed' &&
          Date.now() < deadline
        ) {
          await sleep(100);
          current = (await client.store.getRequest(parsed.requestId))?.nodes[parsed.index];
        }
        if (!current || (current.state !== 'released' && current.state !== 'failed')) {
          throw new CliError(`release of ${nodeIdArg} was sent but not applied within ${opts.timeout}s`);
        }
        if (opts.json) printJson(nodeJson(current));
        else
          print(current.state === 'released' ? `released ${nodeIdArg}` : `${nodeIdArg} is ${current.state}`);
      } else if (opts.json) printJson(nodeJson(node));
      else print(`${nodeIdArg} was already ${node.state}`);
    } finally {
      client.close();
    }
  });

program
  .command('hold')
  .description('keep a node, and so its backing node, until it is released with --force')
  .argument('<node-id>', 'the node id (<request-id>/<index>)')
  .option('--json', 'print the node as JSON')
  .action(async (nodeIdArg: string, opts: { json?: boolean }) => {
    if (!parseNodeId(nodeIdArg)) {
      throw new CliError(`"${nodeIdArg}" is not a node id (node ids look like <request-id>/<index>)`, 2);
    }
    await withOperator(async (ctx) => {
      const node = await holdNode(ctx, nodeIdArg);
      if (opts.json) printJson(nodeJson(node));
      else print(`holding ${nodeIdArg}; release it with: metastatic release ${nodeIdArg} --force`);
    });
  });

program
  .command('drain')
  .description('stop new allocations on a backing node; it is stopped as soon as it is empty')
  .argument('<backing-id>', 'the backing node id (see `metastatic list backing`)')
  .option('--json', 'print the backing node as JSON')
  .action(async (id: string, opts: { json?: boolean }) => {
    await withOperator(async (ctx) => {
      const b = await drainBacking(ctx, id);
      if (opts.json) printJson(backingJson(b));
      else print(`draining ${id} (${b.used}/${b.slots} slots in use); it goes when empty`);
    });
  });

program
  .command('reap')
  .description('run the reaper once now: retire idle backing nodes, enforce deadlines, reconcile')
  .option('--json', 'print the reaper report as JSON')
  .action(async (opts: { json?: boolean }) => {
    await withOperator(async (ctx) => {
      const report = await reap(ctx);
      if (opts.json) {
        printJson(report);
        return;
      }
      print(
        table(
          [
            'RETIRED',
            'STOPPED',
            'FAILED',
            'MOVED',
            'ORPHANS',
            'SLOTS RECLAIMED',
            'PLACES RECLAIMED',
            'CONFLICTS',
            'ERRORS',
          ],
          [
            [
              report.retired.length,
              report.stopped.length,
              report.failed.length,
              report.moved,
              report.orphans.length,
              report.reclaimedSlots,
              report.reclaimedPlaces,
              report.conflicts,
              report.errors.length,
            ],
          ],
        ),
      );
      for (const e of report.errors) process.stderr.write(terminalText(`error: ${e}\n`));
      if (report.errors.length > 0) process.exitCode = 1;
    });
  });

program
  .command('list')
  .description('list nodes, backing nodes or requests')
  .addArgument(new Argument('<what>', 'what to list').choices(['nodes', 'backing', 'requests']))
  .option('--all', 'include released nodes, stopped backing nodes and finished requests')
  .option('--json', 'print JSON')
  .action(async (what: 'nodes' | 'backing' | 'requests', opts: { all?: boolean; json?: boolean }) => {
    const client = await connect(target());
    const now = Date.now();
    try {
      if (what === 'backing') {
        const items = (await client.store.listBacking())
          .filter((b) => opts.all || b.state !== 'stopped')
          .sort((a, b) => a.launchedAt - b.launchedAt);
        if (opts.json) {
          printJson(items.map(backingJson));
          return;
        }
        print(
          table(
            ['ID', 'LABEL', 'STATE', 'SLOTS', 'HOST:PORT', 'LAUNCHED', 'LAST USED'],
            items.map((b) => [
              b.id,
              b.label,
              b.state,
              `${b.used}/${b.slots}`,
              b.host ? `${b.host}:${b.port}` : '-',
              ago(b.launchedAt, now),
              ago(b.lastUsedAt, now),
            ]),
          ),
        );
        return;
      }
      const requests = (await client.store.listRequests()).sort((a, b) => a.createdAt - b.createdAt);
      if (what === 'requests') {
        const shown = requests.filter(
          (r) => opts.all || r.nodes.some((n) => isLive(n)) || r.state === 'requested',
        );
        if (opts.json) {
          printJson(shown.map(requestJson));
          return;
        }
        print(
          table(
            ['ID', 'STATE', 'LABELS', 'NODES', 'CREATED', 'REASON'],
            shown.map((r) => [
              r.id,
              r.state,
              r.labels.join(','),
              nodeSummary(r),
              ago(r.createdAt, now),
              r.reason,
            ]),
          ),
        );
        return;
      }
      const nodes = requests.flatMap((r) => r.nodes).filter((n) => opts.all || isLive(n));
      if (opts.json) {
        printJson(nodes.map(nodeJson));
        return;
      }
      print(
        table(
          ['ID', 'LABEL', 'STATE', 'BACKING', 'SLOT', 'HOST:PORT'],
          nodes.map((n) => [
            n.id,
            n.label,
            n.state,
            n.backingNodeId,
            n.slot,
            n.host ? `${n.host}:${n.port}` : '-',
          ]),
        ),
      );
    } finally {
      client.close();
    }
  });

program
  .command('validate')
  .description('check a configuration file; prints every error with its YAML path')
  .argument('<file>', 'the YAML configuration')
  .option('--json', 'print the errors as JSON')
  .action(async (file: string, opts: { json?: boolean }) => {
    const result = await loadConfigFile(file);
    if (opts.json) {
      printJson(
        result.ok
          ? { valid: true, errors: [], warnings: result.config.notices }
          : { valid: false, errors: result.errors, warnings: [] },
      );
    } else if (result.ok) {
      const c = result.config;
      print(
        `${file}: valid (${c.metastaticPools.length} metastatic pool(s), labels ${[...c.metastaticLabelNames].join(', ')})`,
      );
      for (const n of c.notices)
        process.stderr.write(terminalText(`warning: ${file}: ${n.path}: ${n.message}\n`));
    } else {
      process.stderr.write(terminalText(`${formatConfigErrors(result.errors)}\n`));
    }
    if (!result.ok) process.exitCode = 1;
  });

program
  .command('schema')
  .description('print the JSON Schema of the configuration (for editors)')
  .option('--out <file>', 'write it to a file instead')
  .action(async (opts: { out?: string }) => {
    const text = `${JSON.stringify(configJsonSchema(), null, 2)}\n`;
    if (opts.out) await writeFile(opts.out, text);
    else process.stdout.write(text);
  });

/** Runs an operator verb with the pool's use-case context; domain refusals become exit code 1. */
async function withOperator(work: (ctx: Context) => Promise<void>): Promise<void> {
  const client = await connect(target());
  try {
    const { context, flush } = await client.operatorContext();
    await work(context);
    await flush();
  } catch (err) {
    if (err instanceof PermanentError) throw new CliError(err.message);
    throw err;
  } finally {
    client.close();
  }
}

function isLive(n: NodeRecord): boolean {
  return n.state !== 'released' && n.state !== 'failed';
}

function nodeSummary(r: RequestRecord): string {
  const ready = r.nodes.filter((n) => n.state === 'ready').length;
  return `${ready}/${r.nodes.length} ready`;
}

function printRequest(r: RequestRecord): void {
  print(`request ${r.id}: ${r.state}${r.reason ? ` (${r.reason})` : ''}`);
  if (r.nodes.length > 0 && r.state !== 'failed') {
    print(
      table(
        ['NODE', 'LABEL', 'STATE', 'HOST:PORT', 'BACKING', 'SLOT'],
        r.nodes.map((n) => [
          n.id,
          n.label,
          n.state,
          n.host ? `${n.host}:${n.port}` : '-',
          n.backingNodeId,
          n.slot,
        ]),
      ),
    );
  }
}

async function waitForRequest(
  store: import('../shared/store/dynamoStore.ts').DynamoStore,
  id: string,
  timeoutSeconds: number,
): Promise<RequestRecord | undefined> {
  const started = Date.now();
  const tty = process.stderr.isTTY;
  let r: RequestRecord | undefined;
  let shown = '';
  while (Date.now() - started < timeoutSeconds * 1000) {
    r = await store.getRequest(id);
    if (r && (r.state === 'fulfilled' || r.state === 'failed')) break;
    const status = r ? `${r.state}, ${nodeSummary(r)}` : 'queued';
    if (tty) {
      // Our own carriage return and erase-line stay; what the status carries is escaped.
      process.stderr.write(
        `\r${terminalText(`waiting for ${id}: ${status} (${((Date.now() - started) / 1000).toFixed(1)}s)`)}\x1b[K`,
      );
    } else if (status !== shown) {
      process.stderr.write(terminalText(`waiting for ${id}: ${status}\n`));
    }
    shown = status;
    await sleep(100);
  }
  if (tty) process.stderr.write('\r\x1b[K');
  return r;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) {
    // --help and --version exit 0; usage errors (already printed by commander) exit 2.
    process.exitCode = err.exitCode === 0 ? 0 : 2;
  } else if (err instanceof CliError) {
    process.stderr.write(terminalText(`metastatic: ${err.message}\n`));
    process.exitCode = err.exitCode;
  } else {
    process.stderr.write(terminalText(`metastatic: ${(err as Error).stack ?? String(err)}\n`));
    process.exitCode = 1;
  }
}
