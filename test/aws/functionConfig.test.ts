import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Template } from 'aws-cdk-lib/assertions';
import { App, AssetStaging, type CfnResource, Stack } from 'aws-cdk-lib/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MetastaticPool } from '../../lib/metastaticPool.ts';
import { environmentSize } from '../../lib/poolFunction.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { FUNCTION_CONFIG_FILE, readFunctionConfig } from '../../shared/runtime/functionConfig.ts';
import { CDK_CONTEXT, TEST_ENV } from '../../testkit/cdkTemplates.ts';

/**
 * The pool configuration reaches the functions as a file in their code, not in their environment
 * (which Lambda caps at 4 KB): a 20 KB configuration synthesizes, a changed configuration changes the
 * code, and the synthesized bundle reads its file at cold start.
 */

const run = promisify(execFile);
const ENV = TEST_ENV;
const FUNCTIONS = ['request', 'fulfil', 'reaper'] as const;

/** A configuration of `count` aws labels, each with user data and tags, and a metastatic label on each. */
function largeConfig(count: number, marker: string): string {
  const userdata = [
    '#!/bin/bash',
    'set -euo pipefail',
    ...Array.from(
      { length: 8 },
      (_, i) => `echo "configuring step ${i} of the build host" >> /var/log/setup.log`,
    ),
  ].join('\n');
  const aws = Array.from({ length: count }, (_, i) =>
    [
      `          - name: big-${i}`,
      '            instance-type: m7g.2xlarge',
      '            image-id: ami-0c1bc246476a5572b',
      '            userdata: |',
      ...userdata.split('\n').map((line) => `              ${line}`),
      '            tags:',
      ...Array.from({ length: 6 }, (_, t) => `              tag-${t}: "value ${t} of label ${i}"`),
    ].join('\n'),
  ).join('\n');
  const meta = Array.from(
    { length: count },
    (_, i) =>
      `          - name: small-${i}\n            backing-label: big-${i}\n            max-parallel-jobs: 4`,
  ).join('\n');
  return `# ${marker}
providers:
  - name: ec2
    driver: aws
    region: eu-west-1
    pools:
      - name: main
        subnet-id: subnet-11111111
        labels:
${aws}
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
${meta}
`;
}

describe('the configuration as a file in each function asset', () => {
  const configs = { A: largeConfig(30, 'first'), B: largeConfig(30, 'second') };
  let app: App;
  let pools: Record<'A' | 'B', MetastaticPool>;
  let templates: Record<'A' | 'B', Template>;

  const functionOf = (pool: MetastaticPool, name: (typeof FUNCTIONS)[number]) =>
    ({ request: pool.requestFunction, fulfil: pool.fulfilFunction, reaper: pool.reaperFunction })[name];
  const assetDir = (pool: MetastaticPool, name: (typeof FUNCTIONS)[number]) =>
    join(
      app.outdir,
      (functionOf(pool, name).function.node.findChild('Code') as unknown as { assetPath: string }).assetPath,
    );
  const lambdaProperties = (key: 'A' | 'B', name: (typeof FUNCTIONS)[number]) => {
    const cfn = functionOf(pools[key], name).function.node.defaultChild as CfnResource;
    return templates[key].toJSON().Resources[Stack.of(cfn).getLogicalId(cfn)].Properties;
  };

  beforeAll(() => {
    // Two pools in one app, so they share the asset cache: they must not share a bundle.
    app = new App({ context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': ['A', 'B'] } });
    const build = (key: 'A' | 'B') => {
      const stack = new Stack(app, key, { env: ENV });
      return new MetastaticPool(stack, 'Pool', { config: configs[key], poolId: `pool-${key}` });
    };
    pools = { A: build('A'), B: build('B') };
    templates = { A: Template.fromStack(Stack.of(pools.A)), B: Template.fromStack(Stack.of(pools.B)) };
    // Six bundles built with esbuild: 10-20 s here, several times that beside a busy neighbour.
  }, 180_000);

  it('synthesizes a 20 KB configuration and keeps the functions environments small', () => {
    expect(Buffer.byteLength(configs.A)).toBeGreaterThan(20_000);
    expect(parseConfigOrThrow(configs.A, 'A').backingPools[0]?.labels.size).toBe(30);
    for (const key of ['A', 'B'] as const) {
      const functions = Object.values(templates[key].findResources('AWS::Lambda::Function'));
      expect(functions).toHaveLength(3);
      for (const fn of functions) {
        const variables = (fn.Properties as { Environment: { Variables: Record<string, unknown> } })
          .Environment.Variables;
        expect(environmentSize(variables)).toBeLessThan(1024);
        expect(JSON.stringify(variables)).not.toContain('providers');
      }
    }
  });

  it('puts the configuration next to each bundle, so two configurations give two code packages', () => {
    for (const name of FUNCTIONS) {
      for (const key of ['A', 'B'] as const) {
        expect(readFileSync(join(assetDir(pools[key], name), FUNCTION_CONFIG_FILE), 'utf8')).toBe(
          configs[key],
        );
      }
      const keyA = (lambdaProperties('A', name).Code as { S3Key: string }).S3Key;
      const keyB = (lambdaProperties('B', name).Code as { S3Key: string }).S3Key;
      expect(keyA).toMatch(/^[0-9a-f]{64}\.zip$/);
      expect(keyB).not.toBe(keyA);
    }
  });

  it('the synthesized bundle reads its configuration file at cold start (and prefers it to METASTATIC_CONFIG)', async () => {
    const dir = assetDir(pools.A, 'fulfil');
    const invoke = (env: Record<string, string>) =>
      run(
        process.execPath,
        [
          '-e',
          // An SQS batch whose one record is not an EC2 event: handled (dropped) without any AWS call.
          `require(process.argv[1]).handler({ Records: [{ messageId: 'm1', body: 'not json', attributes: {}, messageAttributes: {}, eventSource: 'aws:sqs', eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:q', awsRegion: 'eu-west-1', receiptHandle: 'r', md5OfBody: '' }] }, { getRemainingTimeInMillis: () => 30000, awsRequestId: 'r1', functionName: 'f' })
            .then((r) => console.log('RESULT ' + JSON.stringify(r)), (e) => { console.error('FAILED ' + e.message); process.exit(1); });`,
          join(dir, 'index.js'),
        ],
        {
          cwd: tmpdir(),
          env: {
            PATH: process.env.PATH ?? '',
            TABLE_NAME: 'table',
            POOL_ID: 'pool-A',
            AWS_REGION: 'eu-west-1',
            AWS_ACCESS_KEY_ID: 'x',
            AWS_SECRET_ACCESS_KEY: 'x',
            POWERTOOLS_METRICS_DISABLED: 'true',
            AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
            ...env,
          },
        },
      );
    const ok = await invoke({ LAMBDA_TASK_ROOT: dir, METASTATIC_CONFIG: 'not: [a valid configuration' });
    expect(ok.stdout).toContain('RESULT {"batchItemFailures":[]}');
    // Without its file (LAMBDA_TASK_ROOT elsewhere) and without METASTATIC_CONFIG it has no configuration.
    const empty = mkdtempSync(join(tmpdir(), 'metastatic-no-config-'));
    try {
      await expect(invoke({ LAMBDA_TASK_ROOT: empty })).rejects.toMatchObject({
        stderr: expect.stringContaining(
          `no pool configuration: ${join(empty, FUNCTION_CONFIG_FILE)} does not exist`,
        ),
      });
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });
});

describe.each([
  { umask: 0o022, name: '022 (the usual one)' },
  { umask: 0o077, name: '077 (hardened hosts and CI images)' },
])('the code packages synthesized under umask $name', ({ umask }) => {
  let dir: string;
  let outdir: string;
  beforeAll(() => {
    // A bundled asset is cached per process by its cache key: without clearing it, this synthesis would
    // reuse the other umask's output instead of writing its own.
    AssetStaging.clearAssetHashCache();
    outdir = mkdtempSync(join(tmpdir(), 'metastatic-umask-'));
    const before = process.umask(umask);
    try {
      const app = new App({ outdir, context: { ...CDK_CONTEXT, 'aws:cdk:bundling-stacks': ['U'] } });
      const pool = new MetastaticPool(new Stack(app, 'U', { env: ENV }), 'Pool', {
        config: largeConfig(1, `umask ${umask.toString(8)}`),
        poolId: 'pool-umask',
      });
      app.synth();
      dir = join(
        outdir,
        (pool.fulfilFunction.function.node.findChild('Code') as unknown as { assetPath: string }).assetPath,
      );
    } finally {
      process.umask(before);
    }
  }, 120_000);
  afterAll(() => rmSync(outdir, { recursive: true, force: true }));

  it('has every file 0644 and every folder 0755: Lambda runs the code as another user, and the CDK CLI zips each file with its mode', () => {
    const files = readdirSync(dir, { recursive: true, encoding: 'utf8' });
    expect(files).toEqual(expect.arrayContaining(['index.js', 'index.js.map', FUNCTION_CONFIG_FILE]));
    const modes = Object.fromEntries(
      ['.', ...files].map((f) => [f, (statSync(join(dir, f)).mode & 0o777).toString(8)]),
    );
    const expected = Object.fromEntries(
      ['.', ...files].map((f) => [f, statSync(join(dir, f)).isDirectory() ? '755' : '644']),
    );
    expect(modes).toEqual(expected);
  });
});

describe('readFunctionConfig', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'metastatic-task-root-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('reads the file in LAMBDA_TASK_ROOT, which wins over METASTATIC_CONFIG', () => {
    const root = join(dir, 'with-file');
    mkdirSync(root);
    writeFileSync(join(root, FUNCTION_CONFIG_FILE), 'from: file\n');
    expect(readFunctionConfig({ LAMBDA_TASK_ROOT: root, METASTATIC_CONFIG: 'from: env\n' })).toEqual({
      text: 'from: file\n',
      source: join(root, FUNCTION_CONFIG_FILE),
    });
  });

  it('falls back to METASTATIC_CONFIG where there is no file (tests, handlers run outside Lambda)', () => {
    expect(readFunctionConfig({ METASTATIC_CONFIG: 'from: env\n' })).toEqual({
      text: 'from: env\n',
      source: 'METASTATIC_CONFIG',
    });
    expect(
      readFunctionConfig({ LAMBDA_TASK_ROOT: join(dir, 'missing'), METASTATIC_CONFIG: 'x: 1' }).source,
    ).toBe('METASTATIC_CONFIG');
  });

  it('says where it looked when there is no configuration, and why a file could not be read', () => {
    expect(() => readFunctionConfig({})).toThrow(
      'no pool configuration: LAMBDA_TASK_ROOT is not set and METASTATIC_CONFIG is not set',
    );
    const unreadable = join(dir, 'unreadable');
    mkdirSync(join(unreadable, FUNCTION_CONFIG_FILE), { recursive: true }); // a directory: EISDIR
    expect(() => readFunctionConfig({ LAMBDA_TASK_ROOT: unreadable, METASTATIC_CONFIG: 'x: 1' })).toThrow(
      `cannot read the pool configuration ${join(unreadable, FUNCTION_CONFIG_FILE)}`,
    );
  });
});
