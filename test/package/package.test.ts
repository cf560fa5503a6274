import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { DescribeTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DescribeInstancesCommand, EC2Client } from '@aws-sdk/client-ec2';
import { SendMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { packAndInstall } from '../../testkit/installedPackage.ts';
import {
  describeWithMoto,
  MOTO_CREDENTIALS,
  type Moto,
  motoUnavailable,
  startMoto,
} from '../../testkit/moto.ts';
import { node24, nodeMajor } from '../../testkit/node24.ts';
import { until } from '../../testkit/processes.ts';

/**
 * The package as a user gets it (issue 13): `npm pack`, installed into an empty directory with npm, no
 * build tools. Its CLI validates, runs an embedded pool and serves a request; a CDK app of the user's
 * imports `metastatic/cdk` with its types and synthesizes with the Lambda bundles shipped in the
 * package. The CLI and the bundles run under Node 24 (Lambda's runtime) as well as under this Node. That
 * app, docs/install.md's own example, is rehearsed with the installed `metastatic rehearse` (deployed to
 * moto, a request fulfilled, a release retiring the instance, the stack destroyed on Ctrl-C).
 */
const root = resolve(import.meta.dirname, '..', '..');
const version = (dir: string) =>
  (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }).version;
/** The functions of the user's app below (its configuration has no github section). */
const FUNCTIONS = ['request', 'fulfil', 'reaper'] as const;
/** Every bundle the package ships: the github function's too (deployed with a github section). */
const BUNDLES = [...FUNCTIONS, 'github'] as const;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

let work: string;
let app: string;
let packedFiles: string[];
const node24Bin = node24();

function run(bin: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((done) => {
    execFile(
      bin,
      args,
      { cwd, env: { ...process.env, ...env }, timeout: 300_000, maxBuffer: 16 * 1024 * 1024 },
      (err, stdout, stderr) => {
        done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
      },
    );
  });
}

/** The installed CLI, run with `node` (this Node unless given another). */
const metastatic = (args: string[], node = process.execPath) =>
  run(node, [join(app, 'node_modules', 'metastatic', 'bin', 'metastatic.mjs'), ...args], app);

/** The user's CDK app type-checked and synthesized: started once the package is installed (below). */
let cdkApp: Promise<CdkApp>;

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'metastatic-package-'));
  // The user's CDK app brings aws-cdk-lib, constructs, @types/node and the CDK CLI (the versions here).
  const installed = await packAndInstall(work, ['aws-cdk-lib', 'constructs', '@types/node', 'aws-cdk']);
  app = installed.app;
  packedFiles = [...installed.files];
  // tsc over aws-cdk-lib's declarations and the synth take half a minute of child processes: they run
  // while the CLI tests run theirs, and the CDK app's tests wait for them. A failure is reported there.
  cdkApp = buildCdkApp();
  cdkApp.catch(() => undefined);
  // The rehearsal of that app deploys while the CLI tests run theirs (it waits for the app to compile).
  rehearsal = cdkApp.then(startRehearsal);
  rehearsal.catch(() => undefined);
}, 600_000);

interface CdkApp {
  readonly outdir: string;
  /** What CDK's CloudFormation validation reported at synth. */
  readonly violations: readonly string[];
  readonly template: {
    Resources: Record<string, { Type: string; Properties: Record<string, unknown> }>;
  };
}

/** docs/install.md's example app, as the page shows it ("In your CDK app"). */
function installExample(): string {
  const page = readFileSync(join(root, 'docs', 'install.md'), 'utf8');
  const section = page.slice(page.indexOf('## In your CDK app'));
  const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  if (!code?.includes("new MetastaticPool(stack, 'Pool'")) {
    throw new Error('docs/install.md "In your CDK app" has no MetastaticPool example');
  }
  return code;
}

/** The example configuration, as pool.yaml: an idle instance goes after 1 s rather than 300 (the rehearsal). */
const POOL_YAML = readFileSync(join(root, 'examples', 'aws.yaml'), 'utf8').replace(
  'grace-time: 300 ',
  'grace-time: 1 ',
);

/** The compiler options of the user's app, a Node.js ES module project (shared by its two checks). */
const APP_COMPILER_OPTIONS = {
  target: 'ES2022',
  lib: ['ES2022', 'ESNext.Disposable'],
  module: 'NodeNext',
  moduleResolution: 'NodeNext',
  strict: true,
} as const;

/**
 * A CDK app of the user's, written against the installed package: docs/install.md's example (app.ts,
 * reading pool.yaml, with a cdk.json as `cdk init` writes one), and a check of the construct's members'
 * types; type-checked with this repository's compiler (the app has none installed; the types come from
 * the app's node_modules, aws-cdk-lib's declarations checked too) and synthesized into work/cdk.out.
 */
async function buildCdkApp(): Promise<CdkApp> {
  if (!POOL_YAML.includes('grace-time: 1 ')) throw new Error('examples/aws.yaml has no grace-time: 300');
  writeFileSync(join(app, 'pool.yaml'), POOL_YAML);
  writeFileSync(join(app, 'app.ts'), installExample());
  writeFileSync(join(app, 'cdk.json'), JSON.stringify({ app: 'node out/app.js' }));
  writeFileSync(
    join(app, 'members.ts'),
    [
      "import { App, Stack } from 'aws-cdk-lib';",
      "import { MetastaticPool } from 'metastatic/cdk';",
      '',
      "const pool: MetastaticPool = new MetastaticPool(new Stack(new App(), 'S'), 'Pool', { config: '' });",
      'const names: string[] = [pool.requestFunction, pool.fulfilFunction, pool.reaperFunction].map((f) => f.function.functionName);',
      'const outputs: string[] = Object.keys(pool.outputs);',
      'void names;',
      'void outputs;',
      '',
    ].join('\n'),
  );
  // A client of the user's, type-checked in the same tsc run: metastatic/client's declarations.
  writeFileSync(
    join(app, 'client.ts'),
    [
      "import { PoolClient, PoolNotFoundError, type PoolNode, type RequestSpec } from 'metastatic/client';",
      '',
      "const spec: RequestSpec = { labels: ['small-node'], lease: 60 };",
      "const describe = (n: PoolNode): string => n.id + ' ' + (n.host ?? '-') + ':' + String(n.port);",
      'void describe;',
      'try {',
      '  await PoolClient.connect({ stateDir: process.argv[2] as string });',
      "  console.log('connected?');",
      '} catch (err) {',
      "  console.log([typeof PoolClient, err instanceof PoolNotFoundError, spec.labels?.length].join(' '));",
      '}',
      '',
    ].join('\n'),
  );
  writeFileSync(
    join(app, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        ...APP_COMPILER_OPTIONS,
        // As most apps set it. The package's declarations are checked without it (every declaration they
        // reach, aws-cdk-lib's included) by the test "declares only what an install brings".
        skipLibCheck: true,
        types: ['node'],
        outDir: 'out',
      },
      files: ['app.ts', 'members.ts', 'client.ts'],
    }),
  );
  // The compiler of this repository (the app has none installed); the types come from the app's node_modules.
  const tsc = await run(
    process.execPath,
    [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', app],
    app,
  );
  if (tsc.code !== 0) throw new Error(`the app does not type-check:\n${tsc.stdout}${tsc.stderr}`);
  const outdir = join(work, 'cdk.out');
  // As the CDK CLI runs it: the output directory in CDK_OUTDIR (the app synthesizes itself on exit).
  // With CloudFormation validation, as a user's synth has it (the suite turns it off: vitest.config.ts).
  const synth = await run(process.execPath, [join(app, 'out', 'app.js')], app, {
    CDK_OUTDIR: outdir,
    CDK_VALIDATION: 'true',
  });
  if (synth.code !== 0) throw new Error(`synth failed:\n${synth.stderr}`);
  const template = JSON.parse(readFileSync(join(outdir, 'CiPool.template.json'), 'utf8'));
  const report = JSON.parse(readFileSync(join(outdir, 'validation-report.json'), 'utf8')) as {
    pluginReports: Array<{
      pluginName: string;
      violations: Array<{ ruleName: string; description: string }>;
    }>;
  };
  const violations = report.pluginReports.flatMap((p) =>
    p.violations.map((v) => `${p.pluginName} ${v.ruleName}: ${v.description}`),
  );
  return { outdir, template, violations };
}

/**
 * What the compiler reports on the package's declarations, checked as an app with `skipLibCheck: false`
 * checks them (NodeNext, strict): the `types` of package.json's exports, the declarations in `also`, and
 * every declaration they reach, each error as "<path in the package>: <message>" (errors in other
 * packages' declarations as their path). skipLibCheck, which most apps set, would turn an import of a
 * package the install does not bring into `any` without a word; without it, the app would not compile.
 * The check is TypeScript's own (its resolver and checker), in a tsconfig of its own in the app
 * (tsconfig.declarations.json).
 */
async function declarationErrors(also: readonly string[] = []): Promise<string[]> {
  const pkg = join(app, 'node_modules', 'metastatic');
  const exported = (
    JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8')) as {
      exports: Record<string, string | { types?: string }>;
    }
  ).exports;
  const entries = Object.values(exported).flatMap((e) =>
    typeof e === 'object' && e.types ? [join(pkg, e.types)] : [],
  );
  if (entries.length < 2)
    return [`only ${entries.length} declaration entry points in package.json's exports`];
  const files = [...entries, ...also];
  const config = join(app, 'tsconfig.declarations.json');
  writeFileSync(
    config,
    JSON.stringify({
      compilerOptions: { ...APP_COMPILER_OPTIONS, skipLibCheck: false, types: ['node'], noEmit: true },
      files,
    }),
  );
  const tsc = await run(
    process.execPath,
    [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', config, '--pretty', 'false'],
    app,
  );
  const errors = `${tsc.stdout}${tsc.stderr}`
    .split('\n')
    .filter((line) => /error TS\d+/.test(line))
    .map((line) => {
      const at = /^(.*?)\(\d+,\d+\): error (TS\d+: .*)$/.exec(line);
      if (!at?.[1] || !at[2]) return line;
      const file = resolve(app, at[1]);
      return `${file.startsWith(pkg) ? relative(pkg, file) : relative(app, file)}: ${at[2]}`;
    });
  if (tsc.code !== 0 && errors.length === 0)
    errors.push(`tsc exited ${tsc.code}: ${tsc.stdout}${tsc.stderr}`);
  return errors;
}

/** `metastatic rehearse --json` of the user's app, from the installed package, and what it printed. */
interface Rehearsing {
  readonly moto: Moto;
  readonly child: ChildProcess;
  /** Its stdout, one JSON object per line. */
  readonly events: Array<Record<string, unknown> & { type: string }>;
  readonly ready: Ready;
  /** Its stderr so far. */
  stderr(): string;
}

interface Ready {
  readonly stackName: string;
  readonly poolId: string;
  readonly region: string;
  readonly endpoint: string;
  readonly requestQueueUrl: string;
  readonly tableName: string;
  readonly labels: string[];
  readonly network: Record<string, string>;
  readonly notCreated: string[];
  readonly env: Record<string, string>;
  readonly commands: string[];
}

let rehearsal: Promise<Rehearsing | undefined>;

/**
 * Starts the installed `metastatic rehearse` in the app's directory (its aws-cdk), against a
 * moto_server of this test's (so that what it leaves behind can be looked at), the reaper every second,
 * every process it starts resolving only localhost; resolves when it printed `ready`.
 */
async function startRehearsal(): Promise<Rehearsing | undefined> {
  if (motoUnavailable() !== undefined) return undefined;
  const moto = await startMoto();
  const guard = pathToFileURL(join(root, 'testkit', 'loopbackOnly.mjs')).href;
  const child = spawn(
    process.execPath,
    [
      join(app, 'node_modules', 'metastatic', 'bin', 'metastatic.mjs'),
      'rehearse',
      // The assembly buildCdkApp synthesized from the app (`cdk synth` would write the same): the
      // rehearsal's own `cdk synth` of an app is run by test/aws/deploy.moto.test.ts (cdk.json's app).
      '--app',
      join(work, 'cdk.out'),
      '--endpoint',
      moto.endpoint,
      '--reaper-interval',
      '1',
      '--json',
    ],
    {
      cwd: app,
      env: { ...process.env, NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ''} --import ${guard}`.trim() },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const events: Rehearsing['events'] = [];
  let stderr = '';
  let rest = '';
  child.stdout?.on('data', (chunk: Buffer) => {
    const lines = (rest + chunk.toString()).split('\n');
    rest = lines.pop() ?? '';
    for (const line of lines) if (line.trim() !== '') events.push(JSON.parse(line));
  });
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  try {
    const ready = await until(
      'metastatic rehearse to be ready',
      () => {
        if (child.exitCode !== null) throw new Error(`rehearse exited ${child.exitCode}:\n${stderr}`);
        return events.find((e) => e.type === 'ready') as Ready | undefined;
      },
      400_000,
    );
    return { moto, child, events, ready, stderr: () => stderr };
  } catch (err) {
    child.kill('SIGKILL');
    await moto.stop();
    throw err;
  }
}

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the packed tarball', { timeout: 180_000 }, () => {
  it('holds the built code, type declarations and Lambda bundles, and no TypeScript sources', () => {
    expect(packedFiles).toEqual(
      expect.arrayContaining([
        'bin/metastatic.mjs',
        'dist/cli/main.js',
        'dist/lib/index.js',
        'dist/lib/index.d.ts',
        'examples/local.yaml',
        'CHANGELOG.md',
        ...BUNDLES.flatMap((f) => [`dist/lambda/${f}/index.js`, `dist/lambda/${f}/index.js.map`]),
      ]),
    );
    expect(packedFiles.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);
  });

  it('installs without the build tools: no esbuild, tsx or typescript in the app', () => {
    for (const tool of ['esbuild', 'tsx', 'typescript', 'vitest']) {
      expect({ tool, installed: existsSync(join(app, 'node_modules', tool)) }).toEqual({
        tool,
        installed: false,
      });
    }
    expect(existsSync(join(app, 'node_modules', '.bin', 'metastatic'))).toBe(true);
  });
});

describe('the installed CLI', { timeout: 180_000 }, () => {
  const nodes: Array<[string, () => string | undefined]> = [
    [`Node ${process.versions.node.split('.')[0]} (this one)`, () => process.execPath],
    ['Node 24 (Lambda’s runtime)', () => node24Bin],
  ];

  it('has a Node 24 to test with (CI requires one)', () => {
    if (process.env.METASTATIC_REQUIRE_NODE24) expect(node24Bin).toBeDefined();
    if (node24Bin) expect(nodeMajor(node24Bin)).toBe(24);
  });

  for (const [name, bin] of nodes) {
    it(`under ${name}: --version, --help, validate (a good and a bad configuration)`, async ({ skip }) => {
      const node = bin();
      if (!node) return skip('no Node 24 binary here');
      const v = await metastatic(['--version'], node);
      expect(v).toMatchObject({ code: 0, stdout: `${version(root)}\n` });
      const help = await metastatic(['--help'], node);
      expect(help.code).toBe(0);
      for (const command of ['dev', 'request', 'release', 'list', 'validate'])
        expect(help.stdout).toContain(command);
      const good = await metastatic(
        ['validate', join(app, 'node_modules', 'metastatic', 'examples', 'aws.yaml')],
        node,
      );
      expect(good.code, good.stderr).toBe(0);
      writeFileSync(
        join(app, 'bad.yaml'),
        'providers:\n  - name: local\n    driver: local\n    pools:\n      - name: main\n        max-servers: 0\n',
      );
      const bad = await metastatic(['validate', 'bad.yaml'], node);
      expect(bad.code).not.toBe(0);
      expect(bad.stderr).toContain('providers[0].pools[0].max-servers');
    });

    // The embedded pool runs once, under Node 24 where there is one (the runtime the package does not
    // otherwise run under here), else under this Node: under Node 20 the same code runs in every embedded
    // test of the suite, and the installed package loads and answers under it above (11 s of the suite's
    // ~360 on this machine, measured, for a second run of the same path).
    const pool = name.startsWith('Node 24') ? node24Bin !== undefined : node24Bin === undefined;
    it.runIf(pool)(
      `under ${name}: runs an embedded pool that serves a request, lists it and releases it`,
      async ({ skip }) => {
        const node = bin();
        if (!node) return skip('no Node 24 binary here');
        const stateDir = mkdtempSync(join(work, 'state-'));
        let log = '';
        const dev: ChildProcess = spawn(
          node,
          [
            join(app, 'node_modules', '.bin', 'metastatic'),
            '--state-dir',
            stateDir,
            'dev',
            '--reaper-interval',
            '0.5',
          ],
          { cwd: app, stdio: ['ignore', 'pipe', 'pipe'] },
        );
        dev.stdout?.on('data', (d) => {
          log += d;
        });
        dev.stderr?.on('data', (d) => {
          log += d;
        });
        try {
          await until(
            'dev.json',
            async () => (existsSync(join(stateDir, 'dev.json')) ? true : undefined),
            60_000,
          );
          const req = await metastatic(
            [
              '--state-dir',
              stateDir,
              'request',
              'small-node',
              '--id',
              'pkg-1',
              '--wait',
              '--json',
              '--timeout',
              '60',
            ],
            node,
          );
          expect(req.code, req.stderr + log).toBe(0);
          expect(JSON.parse(req.stdout)).toMatchObject({ id: 'pkg-1', state: 'fulfilled' });
          const list = await metastatic(['--state-dir', stateDir, 'list', 'nodes', '--json'], node);
          expect(list.code, list.stderr).toBe(0);
          expect(JSON.parse(list.stdout)).toEqual([
            expect.objectContaining({ id: 'pkg-1/0', state: 'ready' }),
          ]);
          const rel = await metastatic(['--state-dir', stateDir, 'release', 'pkg-1/0'], node);
          expect(rel.code, rel.stderr).toBe(0);
        } finally {
          dev.kill('SIGINT');
          await until('dev stopped', async () => (dev.exitCode !== null ? true : undefined), 30_000).catch(
            () => dev.kill('SIGKILL'),
          );
        }
        expect(dev.exitCode, log).toBe(0);
      },
    );
  }
});

describe('a client of the user’s', { timeout: 300_000 }, () => {
  it('imports metastatic/client from the installed package, its types checked by the app’s tsc', async () => {
    await cdkApp; // compiled (and type-checked) with the CDK app
    const empty = mkdtempSync(join(work, 'no-pool-'));
    const out = await run(process.execPath, [join(app, 'out', 'client.js'), empty], app);
    expect(out, out.stderr).toMatchObject({ code: 0, stdout: 'function true 1\n' });
  });
});

describe('a CDK app of the user’s', { timeout: 300_000 }, () => {
  let outdir: string;
  let template: CdkApp['template'];
  let violations: CdkApp['violations'];

  beforeAll(async () => {
    ({ outdir, template, violations } = await cdkApp);
  }, 300_000);

  /** Each function's code package in the assembly, by function name. */
  const codeDirs = () =>
    Object.fromEntries(
      FUNCTIONS.map((name) => {
        const [, fn] = Object.entries(template.Resources).find(
          ([id, r]) => r.Type === 'AWS::Lambda::Function' && id.toLowerCase().includes(name),
        ) ?? [undefined, undefined];
        const key = (fn?.Properties.Code as { S3Key?: string } | undefined)?.S3Key ?? '';
        return [name, join(outdir, `asset.${key.replace(/\.zip$/, '')}`)];
      }),
    ) as Record<(typeof FUNCTIONS)[number], string>;

  it('type-checks against the package’s declarations and synthesizes three Node.js 24 functions', () => {
    const functions = Object.values(template.Resources).filter((r) => r.Type === 'AWS::Lambda::Function');
    expect(functions).toHaveLength(3);
    for (const fn of functions)
      expect(fn.Properties).toMatchObject({ Runtime: 'nodejs24.x', Handler: 'index.handler' });
    expect(violations).toEqual([]);
  });

  it('declares only what an install brings: its declarations type-check in the app, libraries checked too', async () => {
    // A declaration importing a development dependency of the package (tsx: not installed with it),
    // checked in the same program, must be reported, or the check would prove nothing. One compiler
    // process for both: each loads aws-cdk-lib's declarations (7 CPU-s).
    const probe = join(app, 'node_modules', 'metastatic', 'dist', 'probe.d.ts');
    writeFileSync(probe, "import type { tsImport } from 'tsx/esm/api';\nexport type P = typeof tsImport;\n");
    try {
      const errors = await declarationErrors([probe]);
      const probed = errors.filter((e) => e.startsWith('dist/probe.d.ts: '));
      expect(errors.filter((e) => !probed.includes(e))).toEqual([]);
      expect(probed).toEqual([
        expect.stringMatching(/^dist\/probe\.d\.ts: TS2307: Cannot find module 'tsx\/esm\/api'/),
      ]);
    } finally {
      rmSync(probe);
    }
  });

  it('ships the prebuilt bundles as they are in the package, with the configuration beside them (0644)', () => {
    const dirs = codeDirs();
    for (const name of FUNCTIONS) {
      const shipped = readFileSync(
        join(app, 'node_modules', 'metastatic', 'dist', 'lambda', name, 'index.js'),
      );
      expect(readFileSync(join(dirs[name], 'index.js')).equals(shipped)).toBe(true);
      expect(readFileSync(join(dirs[name], 'metastatic.yaml'), 'utf8')).toBe(POOL_YAML);
      for (const file of readdirSync(dirs[name]))
        expect(statSync(join(dirs[name], file)).mode & 0o444).toBe(0o444);
    }
  });

  it('the bundles load and handle an event under Node 24', async ({ skip }) => {
    if (!node24Bin) return skip('no Node 24 binary here');
    const dirs = codeDirs();
    const env = {
      PATH: process.env.PATH ?? '',
      TABLE_NAME: 'table',
      POOL_ID: 'pool',
      AWS_REGION: 'eu-west-1',
      AWS_ACCESS_KEY_ID: 'x',
      AWS_SECRET_ACCESS_KEY: 'x',
      POWERTOOLS_METRICS_DISABLED: 'true',
    };
    for (const name of FUNCTIONS) {
      const loaded = await run(
        node24Bin,
        [
          '-e',
          "console.log(typeof require(process.argv[1]).handler + ' ' + process.version)",
          join(dirs[name], 'index.js'),
        ],
        tmpdir(),
        { ...env, LAMBDA_TASK_ROOT: dirs[name] },
      );
      expect(loaded, name).toMatchObject({ code: 0, stdout: expect.stringMatching(/^function v24\./) });
    }
    // An SQS batch whose one record is not an EC2 event: the fulfil function drops it without an AWS call.
    const handled = await run(
      node24Bin,
      [
        '-e',
        `require(process.argv[1]).handler({ Records: [{ messageId: 'm1', body: 'not json', attributes: {}, messageAttributes: {}, eventSource: 'aws:sqs', eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:q', awsRegion: 'eu-west-1', receiptHandle: 'r', md5OfBody: '' }] }, { getRemainingTimeInMillis: () => 30000, awsRequestId: 'r1', functionName: 'f' }).then((r) => console.log('RESULT ' + JSON.stringify(r)), (e) => { console.error('FAILED ' + e.message); process.exit(1); });`,
        join(dirs.fulfil, 'index.js'),
      ],
      tmpdir(),
      { ...env, LAMBDA_TASK_ROOT: dirs.fulfil },
    );
    expect(handled.stdout, handled.stderr).toContain('RESULT {"batchItemFailures":[]}');
  });
});

describeWithMoto('the offline rehearsal of that app (metastatic rehearse, installed)', () => {
  let r: Rehearsing;
  const cli = (args: string[]) =>
    run(process.execPath, [join(app, 'node_modules', 'metastatic', 'bin', 'metastatic.mjs'), ...args], app, {
      ...r.ready.env,
      NODE_OPTIONS: `--import ${pathToFileURL(join(root, 'testkit', 'loopbackOnly.mjs')).href}`,
    });
  const clientConfig = () => ({
    endpoint: r.moto.endpoint,
    region: r.ready.region,
    credentials: MOTO_CREDENTIALS,
  });
  const stack = ['--stack', 'CiPool', '--region', 'eu-west-1'];
  let dynamodb: DynamoDBClient | undefined;
  /** The pool's table, read directly. */
  const store = () => {
    dynamodb ??= guardDynamoLimits(new DynamoDBClient(clientConfig()));
    return new DynamoStore(dynamodb, r.ready.tableName);
  };

  beforeAll(async () => {
    r = (await rehearsal) as Rehearsing;
  }, 600_000);

  afterAll(async () => {
    dynamodb?.destroy();
    const steps = r?.events.filter((e) => e.type === 'step').map((e) => `${e.step} ${e.ms} ms`);
    console.info(`rehearsal steps: ${steps?.join(', ')}`);
    if (r && r.child.exitCode === null) r.child.kill('SIGKILL');
    await r?.moto.stop();
  });

  it("deploys docs/install.md's app into moto, making what its configuration names, and says what to type", () => {
    expect(r.events.filter((e) => e.type === 'step').map((e) => e.step)).toEqual([
      'moto',
      'synth', // the app's assembly, copied
      'network',
      'bootstrap',
      'deploy',
    ]);
    expect(r.ready).toMatchObject({
      stackName: 'CiPool',
      poolId: 'ci-pool',
      region: 'eu-west-1',
      endpoint: r.moto.endpoint,
      labels: ['arm-small'],
      env: { AWS_ENDPOINT_URL: r.moto.endpoint, AWS_REGION: 'eu-west-1' },
    });
    // examples/aws.yaml's subnets, security group and image, made in moto with its own ids.
    expect(Object.keys(r.ready.network).sort()).toEqual(
      [
        'ami-0c1bc246476a5572b',
        'sg-0123456789abcdef0',
        'subnet-0a1b2c3d4e5f60718',
        'subnet-0f9e8d7c6b5a40312',
      ].sort(),
    );
    expect(r.ready.notCreated).toContain('AWS::CloudWatch::Alarm');
    expect(r.ready.commands).toEqual([
      expect.stringMatching(/^export AWS_ENDPOINT_URL=http:\/\/localhost:\d+ AWS_REGION=eu-west-1 /),
      `aws --endpoint-url ${r.moto.endpoint} --region eu-west-1 sqs send-message --queue-url ${r.ready.requestQueueUrl} --message-body '{"kind":"request","id":"try-1","labels":["arm-small"],"requestor":"me"}'`,
      'npx --no metastatic --stack CiPool status --watch',
      `aws --endpoint-url ${r.moto.endpoint} --region eu-west-1 sqs send-message --queue-url ${r.ready.requestQueueUrl} --message-body '{"kind":"release","nodeId":"try-1/0"}'`,
    ]);
  });

  it('fulfils a request sent to the deployed queue, which `metastatic --stack` then shows (issue 24, defect 7)', async () => {
    const sqs = new SQSClient({ ...clientConfig(), useQueueUrlAsEndpoint: false });
    try {
      // What the printed `aws sqs send-message` does.
      const body = { kind: 'request', id: 'try-1', labels: ['arm-small'], requestor: 'me' };
      await sqs.send(
        new SendMessageCommand({ QueueUrl: r.ready.requestQueueUrl, MessageBody: JSON.stringify(body) }),
      );
    } finally {
      sqs.destroy();
    }
    // Watched in the table directly (a CLI run per look would cost a second each); then read with --stack.
    await until(
      'try-1 fulfilled',
      async () => ((await store().getRequest('try-1'))?.state === 'fulfilled' ? true : undefined),
      120_000,
    );
    const listed = await cli(['list', 'requests', '--json', ...stack]);
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toEqual([expect.objectContaining({ id: 'try-1', state: 'fulfilled' })]);
    const status = await cli(['status', '--json', ...stack]);
    expect(status.code, status.stderr).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({
      labels: [{ label: 'arm-small', nodesReady: 1, backingNodes: 1 }],
      backing: [expect.objectContaining({ state: 'ready', usedSlots: 1 })],
    });
    // Each function ran, fed as Lambda feeds it (the reaper, every second, may have readied the backing
    // node before the fulfil function had the running event: it is delivered all the same).
    expect(r.events).toContainEqual(
      expect.objectContaining({ type: 'delivery', function: 'request', failed: 0 }),
    );
    expect(r.events).toContainEqual(expect.objectContaining({ type: 'ec2', state: 'running' }));
    await until(
      'the running event delivered to the fulfil function',
      () => r.events.find((e) => e.type === 'delivery' && e.function === 'fulfil' && e.failed === 0),
      60_000,
    );
  }, 300_000);

  it('retires the instance once its node is released and grace-time passed (the reaper on its schedule)', async () => {
    const released = await cli(['release', 'try-1/0', '--json', ...stack]);
    expect(released.code, released.stderr).toBe(0);
    const backingId = JSON.parse(released.stdout).backingNodeId as string;
    expect(backingId).toMatch(/^bn-/);
    await until(
      'the reaper to retire it',
      () => r.events.find((e) => e.type === 'reaper' && String(e.retired) === backingId),
      120_000,
    );
    await until(
      'the backing node stopped',
      async () => ((await store().getBacking(backingId))?.state === 'stopped' ? true : undefined),
      60_000,
    );
    const ec2 = new EC2Client(clientConfig());
    try {
      const out = await ec2.send(
        new DescribeInstancesCommand({ Filters: [{ Name: 'tag:metastatic:pool', Values: ['ci-pool'] }] }),
      );
      expect((out.Reservations ?? []).flatMap((x) => x.Instances ?? []).map((i) => i.State?.Name)).toEqual([
        'terminated',
      ]);
    } finally {
      ec2.destroy();
    }
  }, 300_000);

  it('stops on Ctrl-C, destroying the stack (the table is retained, as on AWS)', async () => {
    r.child.kill('SIGINT');
    await until('rehearse to exit', () => (r.child.exitCode !== null ? true : undefined), 120_000);
    expect(r.child.exitCode, r.stderr()).toBe(0);
    // (A reaper run or delivery under way when the signal came still reports its end.)
    const after = r.events
      .slice(r.events.findIndex((e) => e.type === 'stopping'))
      .filter((e) => ['stopping', 'step', 'stopped'].includes(e.type));
    expect(after.map((e) => (e.type === 'step' ? `step ${e.step}` : e.type))).toEqual([
      'stopping',
      'step destroy',
      'stopped',
    ]);
    const cfn = new CloudFormationClient(clientConfig());
    const dynamodb = guardDynamoLimits(new DynamoDBClient(clientConfig()));
    try {
      await expect(cfn.send(new DescribeStacksCommand({ StackName: 'CiPool' }))).rejects.toThrow(
        /does not exist/,
      );
      const table = await dynamodb.send(new DescribeTableCommand({ TableName: r.ready.tableName }));
      expect(table.Table?.TableStatus).toBe('ACTIVE');
    } finally {
      cfn.destroy();
      dynamodb.destroy();
    }
  }, 300_000);
});
