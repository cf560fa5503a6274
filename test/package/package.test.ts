import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packAndInstall } from '../../testkit/installedPackage.ts';
import { node24, nodeMajor } from '../../testkit/node24.ts';
import { until } from '../../testkit/processes.ts';

/**
 * The package as a user gets it (issue 13): `npm pack`, installed into an empty directory with npm, no
 * build tools. Its CLI validates, runs an embedded pool and serves a request; a CDK app of the user's
 * imports `metastatic/cdk` with its types and synthesizes with the Lambda bundles shipped in the
 * package. The CLI and the bundles run under Node 24 (Lambda's runtime) as well as under this Node.
 */
const root = resolve(import.meta.dirname, '..', '..');
const version = (dir: string) =>
  (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { version: string }).version;
const FUNCTIONS = ['request', 'fulfil', 'reaper'] as const;

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
  // The user's CDK app brings aws-cdk-lib, constructs and @types/node (the versions here).
  const installed = await packAndInstall(work, ['aws-cdk-lib', 'constructs', '@types/node']);
  app = installed.app;
  packedFiles = [...installed.files];
  // tsc over aws-cdk-lib's declarations and the synth take half a minute of child processes: they run
  // while the CLI tests run theirs, and the CDK app's tests wait for them. A failure is reported there.
  cdkApp = buildCdkApp();
  cdkApp.catch(() => undefined);
}, 600_000);

interface CdkApp {
  readonly outdir: string;
  readonly template: {
    Resources: Record<string, { Type: string; Properties: Record<string, unknown> }>;
  };
}

/**
 * A CDK app of the user's, written against the installed package: type-checked with this repository's
 * compiler (the app has none installed; the types come from the app's node_modules, aws-cdk-lib's
 * declarations checked too) and synthesized into work/cdk.out.
 */
async function buildCdkApp(): Promise<CdkApp> {
  const config = readFileSync(join(root, 'examples', 'aws.yaml'), 'utf8');
  writeFileSync(
    join(app, 'app.ts'),
    [
      "import { App, Stack } from 'aws-cdk-lib';",
      "import { MetastaticPool } from 'metastatic/cdk';",
      '',
      `const config: string = ${JSON.stringify(config)};`,
      'const app = new App(); // the output directory comes in CDK_OUTDIR, as the CDK CLI passes it',
      "const stack = new Stack(app, 'MyPool', { env: { account: '123456789012', region: 'eu-west-1' } });",
      "const pool: MetastaticPool = new MetastaticPool(stack, 'Pool', { config });",
      'const names: string[] = [pool.requestFunction, pool.fulfilFunction, pool.reaperFunction].map((f) => f.function.functionName);',
      'void names;',
      'app.synth();',
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
        target: 'ES2022',
        lib: ['ES2022', 'ESNext.Disposable'],
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        strict: true,
        skipLibCheck: false,
        types: ['node'],
        outDir: 'out',
      },
      files: ['app.ts', 'client.ts'],
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
  const synth = await run(process.execPath, [join(app, 'out', 'app.js')], app, { CDK_OUTDIR: outdir });
  if (synth.code !== 0) throw new Error(`synth failed:\n${synth.stderr}`);
  const template = JSON.parse(readFileSync(join(outdir, 'MyPool.template.json'), 'utf8'));
  return { outdir, template };
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
        ...FUNCTIONS.flatMap((f) => [`dist/lambda/${f}/index.js`, `dist/lambda/${f}/index.js.map`]),
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

    it(`under ${name}: runs an embedded pool that serves a request, lists it and releases it`, async ({
      skip,
    }) => {
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
        expect(JSON.parse(list.stdout)).toEqual([expect.objectContaining({ id: 'pkg-1/0', state: 'ready' })]);
        const rel = await metastatic(['--state-dir', stateDir, 'release', 'pkg-1/0'], node);
        expect(rel.code, rel.stderr).toBe(0);
      } finally {
        dev.kill('SIGINT');
        await until('dev stopped', async () => (dev.exitCode !== null ? true : undefined), 30_000).catch(() =>
          dev.kill('SIGKILL'),
        );
      }
      expect(dev.exitCode, log).toBe(0);
    });
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
  const config = readFileSync(join(root, 'examples', 'aws.yaml'), 'utf8');

  beforeAll(async () => {
    ({ outdir, template } = await cdkApp);
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
  });

  it('ships the prebuilt bundles as they are in the package, with the configuration beside them (0644)', () => {
    const dirs = codeDirs();
    for (const name of FUNCTIONS) {
      const shipped = readFileSync(
        join(app, 'node_modules', 'metastatic', 'dist', 'lambda', name, 'index.js'),
      );
      expect(readFileSync(join(dirs[name], 'index.js')).equals(shipped)).toBe(true);
      expect(readFileSync(join(dirs[name], 'metastatic.yaml'), 'utf8')).toBe(config);
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
