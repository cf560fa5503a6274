import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { configJsonSchema } from '../../shared/config/jsonSchema.ts';
import {
  type ConfigError,
  ConfigInvalidError,
  type ConfigResult,
  formatConfigErrors,
  loadConfigFile,
  loadConfigOrThrow,
  parseConfig,
} from '../../shared/config/load.ts';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import { MAX_ATTRIBUTES_BYTES, MAX_ATTRIBUTES_DEPTH } from '../../shared/fields/fields.ts';
import { MAX_USER_TAGS, MAX_USERDATA_BYTES } from '../../shared/providers/aws/configSchema.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { ECDSA_KEY, ED25519_KEY, RSA_KEY } from '../../testkit/sshKeys.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));
const examplePath = join(root, 'examples/local.yaml');

/** Strips the common indentation of a template literal (and its first and last empty lines). */
function dedent(text: string): string {
  const lines = text
    .replace(/^\n/, '')
    .replace(/\n[ ]*$/, '\n')
    .split('\n');
  const indent = Math.min(
    ...lines.filter((line) => line.trim() !== '').map((line) => line.length - line.trimStart().length),
  );
  return lines.map((line) => line.slice(indent)).join('\n');
}

function ok(result: ConfigResult): ResolvedConfig {
  if (!result.ok) throw new Error(`expected a valid configuration:\n${formatConfigErrors(result.errors)}`);
  return result.config;
}

function errorsOf(result: ConfigResult): ConfigError[] {
  if (result.ok) throw new Error('expected the configuration to be rejected');
  return result.errors;
}

/** Errors as `path: message`, the shape most tests assert. */
function problems(result: ConfigResult): string[] {
  return errorsOf(result).map((error) => `${error.path}: ${error.message}`);
}

const parseObject = (config: unknown) => parseConfig(stringify(config), 'test.yaml');

const localProvider = (labels: string[] = ['large-node'], name = 'local') => ({
  name,
  driver: 'local',
  pools: [{ name: 'main', labels: labels.map((label) => ({ name: label })) }],
});

type Obj = Record<string, unknown>;

/** A valid two-provider config: `local` (large-node) and `meta` with the given pools. */
function withMeta(pools: Obj[], metaProvider: Obj = {}, backingLabels?: string[]): Obj {
  return {
    providers: [localProvider(backingLabels), { name: 'meta', driver: 'metastatic', ...metaProvider, pools }],
  };
}

const pool = (labels: Obj[], extra: Obj = {}, name = 'main') => ({ name, ...extra, labels });
const label = (name: string, extra: Obj = {}) => ({ name, 'backing-label': 'large-node', ...extra });

describe('the shipped example', () => {
  it('is valid and resolves the defaults', async () => {
    const config = ok(await loadConfigFile(examplePath));
    expect(config.metastaticPools).toHaveLength(1);
    const [meta] = config.metastaticPools;
    expect(meta).toMatchObject({
      key: 'meta/main',
      providerName: 'meta',
      poolName: 'main',
      priority: 100,
      maxServers: 10,
      nodeAttributes: {},
      hostKeyChecking: false,
      launchTimeout: 3600,
      bootTimeout: 120,
      launchRetries: 3,
    });
    expect(meta?.labels.get('small-node')).toEqual({
      name: 'small-node',
      backingLabel: 'large-node',
      maxParallelJobs: 2,
      graceTime: 2,
      minRetentionTime: 0,
      maxAge: undefined,
      hostKeyChecking: false,
      requestTimeout: 10_800,
      slot: { cores: 1, memoryMiB: 2048 },
      slotHourlyCost: 0.1,
    });
    expect([...config.metastaticLabelNames]).toEqual(['small-node']);

    const backing = config.backingPoolByLabel.get('large-node');
    expect(backing).toBe(config.backingPools[0]);
    expect(backing).toMatchObject({
      key: 'local/main',
      providerName: 'local',
      poolName: 'main',
      driver: 'local',
      maxServers: 8,
      providerOptions: { driver: 'local', host: '127.0.0.1' },
      poolOptions: { 'max-servers': 8 },
    });
    expect(backing?.labels.get('large-node')).toEqual({
      name: 'large-node',
      options: {
        'boot-delay': 0.5,
        attributes: {},
        'hourly-cost': 0.2,
        'connection-type': 'ssh',
        'python-path': 'auto',
      },
      // Nodepool's defaults; a local label's username is its driver's (per slot), not a default here.
      contract: { connectionType: 'ssh', pythonPath: 'auto' },
    });
  });

  it('loads through loadConfigOrThrow', async () => {
    const config = await loadConfigOrThrow(examplePath);
    expect(config.metastaticPools[0]?.key).toBe('meta/main');
  });
});

describe('resolution', () => {
  it('inherits host-key-checking from the pool unless the label sets it', () => {
    const config = ok(
      parseObject(
        withMeta([
          pool([label('a'), label('b', { 'host-key-checking': false })], { 'host-key-checking': true }, 'p1'),
          pool([label('c'), label('d', { 'host-key-checking': true })], {}, 'p2'),
        ]),
      ),
    );
    const [p1, p2] = config.metastaticPools;
    expect(p1?.hostKeyChecking).toBe(true);
    expect(p1?.labels.get('a')?.hostKeyChecking).toBe(true);
    expect(p1?.labels.get('b')?.hostKeyChecking).toBe(false);
    expect(p2?.hostKeyChecking).toBe(false);
    expect(p2?.labels.get('c')?.hostKeyChecking).toBe(false);
    expect(p2?.labels.get('d')?.hostKeyChecking).toBe(true);
  });

  it('orders metastatic pools by priority, ties in file order, pools inheriting the provider priority', () => {
    const config = ok(
      parseObject({
        providers: [
          localProvider(),
          {
            name: 'm1',
            driver: 'metastatic',
            pools: [pool([label('a')], {}, 'default'), pool([label('a')], { priority: 5 }, 'urgent')],
          },
          {
            name: 'm2',
            driver: 'metastatic',
            priority: 50,
            pools: [pool([label('a')], {}, 'x'), pool([label('a')], { priority: 100 }, 'y')],
          },
          { name: 'm3', driver: 'metastatic', pools: [pool([label('a')], { priority: 50 }, 'z')] },
        ],
      }),
    );
    expect(config.metastaticPools.map((p) => [p.key, p.priority])).toEqual([
      ['m1/urgent', 5],
      ['m2/x', 50],
      ['m3/z', 50],
      ['m1/default', 100],
      ['m2/y', 100],
    ]);
  });

  it('treats max-age 0 as off', () => {
    const config = ok(
      parseObject(
        withMeta(
          [
            pool([
              label('off', { 'max-age': 0 }),
              label('on', { 'backing-label': 'other-node', 'max-age': 600 }),
            ]),
          ],
          {},
          ['large-node', 'other-node'],
        ),
      ),
    );
    const labels = config.metastaticPools[0]?.labels;
    expect(labels?.get('off')?.maxAge).toBeUndefined();
    expect(labels?.get('on')?.maxAge).toBe(600);
  });

  it('resolves provider options and allows max-servers <= 0 on a metastatic pool', () => {
    const config = ok(
      parseObject(
        withMeta(
          [pool([label('a')], { 'max-servers': 0, 'node-attributes': { zone: 'z1', tags: { a: 1 } } })],
          {
            'launch-timeout': 1.5,
            'boot-timeout': 0.5,
            'launch-retries': 1,
            priority: 7,
          },
        ),
      ),
    );
    expect(config.metastaticPools[0]).toMatchObject({
      maxServers: 0,
      priority: 7,
      launchTimeout: 1.5,
      bootTimeout: 0.5,
      launchRetries: 1,
      nodeAttributes: { zone: 'z1', tags: { a: 1 } },
    });
  });

  it('maps each backing label to the first pool offering it', () => {
    const config = ok(
      parseObject({
        providers: [
          localProvider(['large-node'], 'first'),
          localProvider(['large-node', 'other'], 'second'),
          { name: 'meta', driver: 'metastatic', pools: [pool([label('a')])] },
        ],
      }),
    );
    expect(config.backingPools.map((p) => p.key)).toEqual(['first/main', 'second/main']);
    expect(config.backingPoolByLabel.get('large-node')?.key).toBe('first/main');
    expect(config.backingPoolByLabel.get('other')?.key).toBe('second/main');
  });
});

describe('validation rules', () => {
  it('rejects max-age below min-retention-time', () => {
    const text = poolConfig({ meta: { labels: [smallNode({ 'min-retention-time': 600, 'max-age': 300 })] } });
    expect(errorsOf(parseConfig(text, 'test.yaml'))).toEqual([
      {
        file: 'test.yaml',
        path: 'providers[1].pools[0].labels[0].max-age',
        line: 16,
        column: 22,
        message: 'max-age: must be 0 (off) or >= min-retention-time (600), got 300',
      },
    ]);
  });

  it('accepts max-age equal to min-retention-time', () => {
    ok(parseObject(withMeta([pool([label('a', { 'max-age': 600, 'min-retention-time': 600 })])])));
  });

  it('rejects labels sharing a backing-label that disagree', () => {
    const result = parseObject(
      withMeta([
        pool(
          [label('a', { 'max-parallel-jobs': 2, 'max-age': 0 }), label('b', { 'max-parallel-jobs': 2 })],
          {},
          'p1',
        ),
        pool(
          [label('c', { 'max-parallel-jobs': 4, 'grace-time': 60, 'min-retention-time': 5, 'max-age': 10 })],
          {},
          'p2',
        ),
      ]),
    );
    expect(problems(result)).toEqual([
      'providers[1].pools[1].labels[0].max-parallel-jobs: max-parallel-jobs: labels sharing backing-label "large-node" must agree; this label has 4, providers[1].pools[0].labels[0] has 2',
      'providers[1].pools[1].labels[0].min-retention-time: min-retention-time: labels sharing backing-label "large-node" must agree; this label has 5, providers[1].pools[0].labels[0] has 0',
      'providers[1].pools[1].labels[0].max-age: max-age: labels sharing backing-label "large-node" must agree; this label has 10, providers[1].pools[0].labels[0] has off',
    ]);
  });

  it('allows labels of different providers to share a backing-label with different settings', () => {
    ok(
      parseObject({
        providers: [
          localProvider(),
          { name: 'm1', driver: 'metastatic', pools: [pool([label('a', { 'max-parallel-jobs': 2 })])] },
          { name: 'm2', driver: 'metastatic', pools: [pool([label('b', { 'max-parallel-jobs': 3 })])] },
        ],
      }),
    );
  });

  it('rejects a backing-label that no backing pool offers', () => {
    expect(problems(parseObject(withMeta([pool([label('a', { 'backing-label': 'huge-node' })])])))).toEqual([
      'providers[1].pools[0].labels[0].backing-label: backing-label: no local or aws pool offers label "huge-node"',
    ]);
  });

  it('rejects a backing-label naming a metastatic label', () => {
    expect(
      problems(parseObject(withMeta([pool([label('a'), label('b', { 'backing-label': 'a' })])]))),
    ).toEqual([
      'providers[1].pools[0].labels[1].backing-label: backing-label must name a label of a local or aws pool; "a" is a metastatic label (providers[1].pools[0].labels[0])',
    ]);
  });

  it('rejects duplicate provider names', () => {
    const result = parseObject({
      providers: [localProvider(), { name: 'local', driver: 'metastatic', pools: [pool([label('a')])] }],
    });
    expect(problems(result)).toEqual([
      'providers[1].name: duplicate provider name "local" (first used at providers[0])',
    ]);
  });

  it('rejects duplicate pool names within a provider', () => {
    expect(problems(parseObject(withMeta([pool([label('a')]), pool([label('b')])])))).toEqual([
      'providers[1].pools[1].name: duplicate pool name "main" in provider "meta" (first used at providers[1].pools[0])',
    ]);
  });

  it('rejects duplicate label names within a pool', () => {
    expect(problems(parseObject(withMeta([pool([label('a'), label('a')])])))).toEqual([
      'providers[1].pools[0].labels[1].name: duplicate label name "a" in pool "main" (first used at providers[1].pools[0].labels[0])',
    ]);
  });

  it('rejects a label offered both by a metastatic and a backing pool', () => {
    expect(problems(parseObject(withMeta([pool([label('large-node')])])))).toEqual([
      'providers[1].pools[0].labels[0].name: label "large-node" is also offered by a local or aws pool (providers[0].pools[0].labels[0]); a label name must be either metastatic or backing, not both',
    ]);
  });

  it('accepts the top-level labels list when it lists every label', () => {
    ok(
      parseObject({
        labels: [{ name: 'large-node' }, { name: 'small-node', 'min-ready': 2 }, { name: 'unused' }],
        ...withMeta([pool([label('small-node')])]),
      }),
    );
  });

  it('resolves min-ready per label, and warns by YAML path when no metastatic pool offers the label', () => {
    const result = parseObject({
      labels: [
        { name: 'large-node', 'min-ready': 3 },
        { name: 'small-node', 'min-ready': 2 },
        { name: 'tiny-node', 'min-ready': 0 },
      ],
      ...withMeta([pool([label('small-node'), label('tiny-node')])]),
    });
    if (!result.ok) throw new Error(JSON.stringify(result.errors));
    // large-node is the backing label here: min-ready keeps metastatic nodes only.
    expect([...result.config.minReady]).toEqual([
      ['large-node', 3],
      ['small-node', 2],
    ]);
    expect(result.config.notices).toEqual([
      {
        path: 'labels[0].min-ready',
        message: 'no metastatic pool offers label "large-node": no node of it is kept ready',
      },
    ]);
    const none = ok(parseObject(withMeta([pool([label('small-node')])])));
    expect(none.notices).toEqual([]);
    expect(none.minReady.size).toBe(0);
  });

  it('resolves min-ready auto with its ready-target and max-ready (defaults 0.9 and 10)', () => {
    const config = ok(
      parseObject({
        labels: [
          { name: 'large-node' },
          { name: 'small-node', 'min-ready': 'auto', 'ready-target': 0.95, 'max-ready': 12 },
          { name: 'tiny-node', 'min-ready': 'auto' },
        ],
        ...withMeta([pool([label('small-node'), label('tiny-node')])]),
      }),
    );
    expect([...config.readyAuto]).toEqual([
      ['small-node', { share: 0.95, maxReady: 12 }],
      ['tiny-node', { share: 0.9, maxReady: 10 }],
    ]);
    // Not a static min-ready: no fixed number of seats.
    expect(config.minReady.size).toBe(0);
  });

  it('rejects ready-target and max-ready out of bounds, or without min-ready auto, by YAML path', () => {
    const result = parseObject({
      labels: [
        { name: 'large-node' },
        { name: 'a', 'min-ready': 'auto', 'ready-target': 0.3, 'max-ready': 0 },
        { name: 'b', 'min-ready': 2, 'ready-target': 0.9 },
        { name: 'c', 'min-ready': 'always' },
        { name: 'd', 'min-ready': 'auto', 'ready-target': 1, 'max-ready': 101 },
        { name: 'e', 'max-ready': 3 },
      ],
      ...withMeta([pool([label('a'), label('b'), label('c'), label('d'), label('e')])]),
    });
    expect(problems(result)).toEqual([
      'labels[1].ready-target: ready-target: expected a share >= 0.5 and <= 0.999, got 0.3',
      'labels[1].max-ready: max-ready: expected an integer >= 1 and <= 100, got 0',
      'labels[2].ready-target: ready-target: expected a key of min-ready: auto only (min-ready is 2), got 0.9',
      'labels[3].min-ready: min-ready: expected an integer >= 0 and <= 100, or auto, got "always"',
      'labels[4].ready-target: ready-target: expected a share >= 0.5 and <= 0.999, got 1',
      'labels[4].max-ready: max-ready: expected an integer >= 1 and <= 100, got 101',
      'labels[5].max-ready: max-ready: expected a key of min-ready: auto only (min-ready is 0), got 3',
    ]);
  });

  it('rejects labels missing from the top-level labels list', () => {
    const result = parseObject({
      labels: [{ name: 'small-node' }],
      ...withMeta([pool([label('small-node')])]),
    });
    expect(problems(result)).toEqual([
      'providers[0].pools[0].labels[0].name: label "large-node" is not listed in the top-level labels',
    ]);
  });

  it('rejects duplicate and malformed top-level labels', () => {
    const result = parseObject({
      labels: [{ name: 'large-node' }, { name: 'a' }, { name: 'a', 'min-ready': -1 }],
      ...withMeta([pool([label('a')])]),
    });
    expect(problems(result)).toEqual([
      'labels[2].name: duplicate label name "a" (first used at labels[1])',
      'labels[2].min-ready: min-ready: expected an integer >= 0 and <= 100, or auto, got -1',
    ]);
  });
});

describe('priority-ceiling (issue 25, defect 3)', () => {
  it("resolves the top-level ceiling and the labels' own", () => {
    const config = ok(
      parseObject({
        'priority-ceiling': { default: 100, requestors: { 'release-bot': -1000 } },
        labels: [
          { name: 'large-node' },
          { name: 'small-node', 'priority-ceiling': { requestors: { ci: 0 } } },
        ],
        ...withMeta([pool([label('small-node')])]),
      }),
    );
    expect(config.priorityCeiling).toEqual({
      default: 100,
      requestors: new Map([['release-bot', -1000]]),
    });
    expect([...config.labelPriorityCeilings]).toEqual([['small-node', { requestors: new Map([['ci', 0]]) }]]);
    const none = ok(parseObject(withMeta([pool([label('small-node')])])));
    expect(none.priorityCeiling).toBeUndefined();
    expect(none.labelPriorityCeilings.size).toBe(0);
  });

  it('refuses bad ceilings by YAML path', () => {
    const many = Object.fromEntries(Array.from({ length: 1001 }, (_, i) => [`r${i}`, 0]));
    expect(
      problems(
        parseObject({
          'priority-ceiling': { default: -2_000_000, requestors: { ci: 'high', '': 1 }, other: 1 },
          labels: [
            { name: 'large-node' },
            { name: 'small-node', 'priority-ceiling': { requestors: many } },
            { name: 'x', 'priority-ceiling': [1] },
          ],
          ...withMeta([pool([label('small-node'), label('x')])]),
        }),
      ),
    ).toEqual([
      'priority-ceiling.default: default: expected an integer >= -1000000 and <= 1000000, got -2000000',
      'priority-ceiling.requestors.ci: ci: expected an integer >= -1000000 and <= 1000000, got "high"',
      'priority-ceiling.requestors.: : expected a mapping of requestor (1 to 256 characters) to priority, got ""',
      'priority-ceiling.other: unknown key "other"',
      'labels[1].priority-ceiling.requestors: requestors: expected at most 1000 requestors, got a mapping',
      'labels[2].priority-ceiling: priority-ceiling: expected a mapping with "default" and/or "requestors", got a list',
    ]);
  });
});

describe('field errors', () => {
  it('takes record-retention in seconds: 7 days by default, from 4 days (the request queue keeps a message 4) to 90', () => {
    expect(ok(parseConfig(poolConfig(), 'test.yaml')).recordRetention).toBe(7 * 86400);
    expect(
      ok(parseConfig(poolConfig({ top: { 'record-retention': 345600 } }), 'test.yaml')).recordRetention,
    ).toBe(4 * 86400);
    for (const bad of [3600, 91 * 86400, 1.5, '7d']) {
      expect(problems(parseConfig(poolConfig({ top: { 'record-retention': bad } }), 'test.yaml'))).toEqual([
        `record-retention: record-retention: expected an integer >= 345600 and <= 7776000, got ${JSON.stringify(bad)}`,
      ]);
    }
  });

  it('rejects an unknown key and suggests the kebab-case spelling', () => {
    const text = poolConfig({ meta: { labels: [smallNode({ grace_time: 10 })] } });
    expect(errorsOf(parseConfig(text, 'test.yaml'))).toEqual([
      {
        file: 'test.yaml',
        path: 'providers[1].pools[0].labels[0].grace_time',
        line: 15,
        column: 13,
        message: 'unknown key "grace_time"; did you mean "grace-time"?',
      },
    ]);
  });

  it('suggests a close spelling and stays quiet when nothing is close', () => {
    const result = parseObject(withMeta([pool([label('a', { 'max-paralel-jobs': 2, colour: 'red' })])]));
    expect(problems(result)).toEqual([
      'providers[1].pools[0].labels[0].max-paralel-jobs: unknown key "max-paralel-jobs"; did you mean "max-parallel-jobs"?',
      'providers[1].pools[0].labels[0].colour: unknown key "colour"',
    ]);
  });

  it('rejects a key of another driver', () => {
    const result = parseObject(withMeta([pool([label('a', { 'boot-delay': 1 })])]));
    expect(problems(result)).toEqual([
      'providers[1].pools[0].labels[0].boot-delay: unknown key "boot-delay"',
    ]);
  });

  it('rejects wrong types and out-of-range values', () => {
    const result = parseObject(
      withMeta(
        [
          pool(
            [
              label('a', {
                'max-parallel-jobs': 0,
                'grace-time': '60',
                'min-retention-time': -1,
                'host-key-checking': 'yes',
              }),
            ],
            { priority: 1.5, 'max-servers': 'ten', 'node-attributes': [1] },
          ),
        ],
        { 'launch-timeout': 0, 'launch-retries': 0, 'boot-timeout': null },
      ),
    );
    expect(problems(result)).toEqual([
      'providers[1].launch-timeout: launch-timeout: expected a number of seconds > 0 and <= 86400, got 0',
      'providers[1].launch-retries: launch-retries: expected an integer >= 1 and <= 20, got 0',
      'providers[1].boot-timeout: boot-timeout: expected a number of seconds > 0 and <= 86400, got an empty value',
      'providers[1].pools[0].priority: priority: expected an integer >= -1000000 and <= 1000000, got 1.5',
      'providers[1].pools[0].max-servers: max-servers: expected an integer <= 10000, got "ten"',
      'providers[1].pools[0].node-attributes: node-attributes: expected a mapping of names to values, got a list',
      'providers[1].pools[0].labels[0].max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got 0',
      'providers[1].pools[0].labels[0].grace-time: grace-time: expected a number of seconds >= 0 and <= 604800, got "60"',
      'providers[1].pools[0].labels[0].min-retention-time: min-retention-time: expected a number of seconds >= 0 and <= 604800, got -1',
      'providers[1].pools[0].labels[0].host-key-checking: host-key-checking: expected true or false, got "yes"',
    ]);
  });

  it('rejects missing required keys', () => {
    const result = parseObject(withMeta([pool([{ name: 'a' }]), { name: 'p2' }]));
    expect(problems(result)).toEqual([
      'providers[1].pools[0].labels[0].backing-label: missing required key "backing-label"',
      'providers[1].pools[1].labels: missing required key "labels"',
    ]);
  });

  it('rejects an unknown or missing driver', () => {
    const result = parseObject({
      providers: [localProvider(), { name: 'x', driver: 'gce', pools: [] }, { name: 'y' }],
    });
    expect(problems(result)).toEqual([
      'providers[1].driver: driver must be one of metastatic, local, aws, got "gce"',
      'providers[2].driver: missing required key "driver" (one of metastatic, local, aws)',
    ]);
  });

  it('rejects local pool and label options out of range', () => {
    const result = parseObject({
      providers: [
        {
          name: 'local',
          driver: 'local',
          pools: [{ name: 'main', 'max-servers': 0, labels: [{ name: 'large-node', 'boot-delay': -0.5 }] }],
        },
      ],
    });
    expect(problems(result)).toEqual([
      'providers[0].pools[0].max-servers: max-servers: expected an integer >= 1 and <= 10000, got 0',
      'providers[0].pools[0].labels[0].boot-delay: boot-delay: expected a number of seconds >= 0 and <= 86400, got -0.5',
    ]);
  });

  it('rejects an empty or non-mapping document and empty lists', () => {
    expect(problems(parseConfig('', 'test.yaml'))).toEqual([
      ': configuration: expected a mapping with a "providers" list, got an empty value',
    ]);
    expect(problems(parseConfig('providers: []\n', 'test.yaml'))).toEqual([
      'providers: providers: expected a non-empty list of providers, got an empty list',
    ]);
    expect(problems(parseObject({ providers: ['local'] }))).toEqual([
      'providers[0]: expected a mapping, got "local"',
    ]);
  });

  it('reports YAML syntax errors with their position', () => {
    const text = 'providers:\n  - name: local\n    driver: [local\n';
    const errors = errorsOf(parseConfig(text, 'test.yaml'));
    expect(errors.length).toBeGreaterThan(0);
    expect(errors[0]).toMatchObject({ file: 'test.yaml', path: '', line: 4, column: 1 });
    expect(errors[0]?.message).toMatch(/^YAML syntax error: /);
  });

  it('reports duplicate YAML keys as syntax errors', () => {
    const errors = errorsOf(parseConfig('providers: []\nproviders: []\n', 'test.yaml'));
    expect(errors).toEqual([
      {
        file: 'test.yaml',
        path: '',
        line: 2,
        column: 1,
        message: 'YAML syntax error: Map keys must be unique',
      },
    ]);
  });

  it('reports duplicate keys in nested and flow mappings, where each is, and not keys that only look alike', () => {
    const text =
      'labels:\n  - name: a\n    name: b\n  - {name: c, min-ready: 1, name: d}\nx: {1: a, "1": b, true: c}\n';
    expect(errorsOf(parseConfig(text, 'test.yaml')).filter((e) => e.message.includes('unique'))).toEqual([
      expect.objectContaining({ line: 3, column: 5, message: 'YAML syntax error: Map keys must be unique' }),
      expect.objectContaining({ line: 4, column: 29, message: 'YAML syntax error: Map keys must be unique' }),
    ]);
  });

  it('reads a mapping of 60,000 keys in linear time (it was quadratic: the check for duplicate keys)', () => {
    // Far beyond what a configuration may hold (attributes are bounded): the check for duplicate keys
    // compared each key with every earlier one, half a minute at 40,000 keys; linear, this takes ~2 s.
    const keys = Array.from({ length: 60_000 }, (_, i) => `        k${i}: v${i}\n`).join('');
    const errors = errorsOf(parseConfig(`labels:\n  - name: x\n    attributes:\n${keys}`, 'test.yaml'));
    expect(errors).toContainEqual(
      expect.objectContaining({ path: 'labels[0].attributes', line: 3, message: 'unknown key "attributes"' }),
    );
  }, 60_000); // 2-3 s quiet; 10 s at load 15 on the 2-core machine

  it('reports every error at once, field errors and rule violations together', () => {
    const text = dedent(`
      labels:
        - name: small-node
      providers:
        - name: local
          driver: local
          pools:
            - name: main
              labels:
                - name: large-node
                  boot_delay: 1
        - name: meta
          driver: metastatic
          launch-retries: 0
          pools:
            - name: main
              labels:
                - name: small-node
                  backing-label: missing-node
                  max-parallel-jobs: 0
                  min-retention-time: 10
                  max-age: 5
        - name: meta
          driver: nope
    `);
    const errors = errorsOf(parseConfig(text, 'test.yaml'));
    expect(errors.map((e) => `${e.line}:${e.column} ${e.path}: ${e.message}`)).toEqual([
      '9:19 providers[0].pools[0].labels[0].name: label "large-node" is not listed in the top-level labels',
      '10:13 providers[0].pools[0].labels[0].boot_delay: unknown key "boot_delay"; did you mean "boot-delay"?',
      '13:21 providers[1].launch-retries: launch-retries: expected an integer >= 1 and <= 20, got 0',
      '19:32 providers[1].pools[0].labels[0].max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got 0',
      '21:22 providers[1].pools[0].labels[0].max-age: max-age: must be 0 (off) or >= min-retention-time (10), got 5',
      '22:11 providers[2].name: duplicate provider name "meta" (first used at providers[1])',
      '23:13 providers[2].driver: driver must be one of metastatic, local, aws, got "nope"',
    ]);
  });

  it('formats errors one per line as file:line:col: path: message', () => {
    const result = parseObject(withMeta([pool([label('a', { 'max-parallel-jobs': 0 })])]));
    expect(formatConfigErrors(errorsOf(result))).toBe(
      'test.yaml:15:32: providers[1].pools[0].labels[0].max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got 0',
    );
    expect(
      formatConfigErrors([
        { path: '', message: 'whole file' },
        { file: 'a.yaml', path: 'providers', line: 2, column: 3, message: 'bad' },
      ]),
    ).toBe('<config>: whole file\na.yaml:2:3: providers: bad');
  });
});

describe('the node contract (username, connection-type, python-path, shell-type) and authorized-keys', () => {
  /** An aws pool (pool keys `pool`, label keys `large`) with a metastatic label of `jobs` slots on it. */
  const awsWith = (o: { pool?: Obj; large?: Obj; jobs?: number } = {}): Obj => ({
    providers: [
      {
        name: 'ec2',
        driver: 'aws',
        region: 'eu-west-1',
        pools: [
          {
            name: 'main',
            'subnet-id': 'subnet-1',
            ...o.pool,
            labels: [{ name: 'large-node', 'instance-type': 'm7i.4xlarge', 'image-id': 'ami-1', ...o.large }],
          },
        ],
      },
      {
        name: 'meta',
        driver: 'metastatic',
        pools: [pool([label('small-node', { 'max-parallel-jobs': o.jobs ?? 1 })])],
      },
    ],
  });
  const localWith = (large: Obj): Obj => ({
    providers: [
      {
        name: 'local',
        driver: 'local',
        pools: [{ name: 'main', labels: [{ name: 'large-node', ...large }] }],
      },
      { name: 'meta', driver: 'metastatic', pools: [pool([label('small-node')])] },
    ],
  });
  const contractOf = (config: ResolvedConfig) =>
    config.backingPoolByLabel.get('large-node')?.labels.get('large-node')?.contract;
  const at = (key: string) => `providers[0].pools[0].labels[0].${key}`;

  it("defaults to Nodepool's values: ssh, python-path auto, no shell-type; username ec2-user on aws only", () => {
    expect(contractOf(ok(parseObject(awsWith())))).toEqual({
      username: 'ec2-user',
      connectionType: 'ssh',
      pythonPath: 'auto',
    });
    expect(contractOf(ok(parseObject(localWith({}))))).toEqual({ connectionType: 'ssh', pythonPath: 'auto' });
  });

  it('resolves the keys as written, on aws and local labels', () => {
    const aws = {
      username: 'zuul',
      'python-path': '/usr/bin/python3',
      'shell-type': 'csh',
      'connection-type': 'ssh',
    };
    expect(contractOf(ok(parseObject(awsWith({ large: aws }))))).toEqual({
      username: 'zuul',
      connectionType: 'ssh',
      pythonPath: '/usr/bin/python3',
      shellType: 'csh',
    });
    const local = { 'python-path': '/usr/bin/env python3', 'shell-type': 'sh' };
    expect(contractOf(ok(parseObject(localWith(local))))).toEqual({
      connectionType: 'ssh',
      pythonPath: '/usr/bin/env python3',
      shellType: 'sh',
    });
  });

  it('refuses connection types other than ssh, unknown shell types, and bad user names and python paths, by YAML path', () => {
    expect(
      problems(
        parseObject(
          awsWith({
            large: {
              'connection-type': 'winrm',
              'shell-type': 'bash',
              username: '-root',
              'python-path': 'py\nthon',
            },
          }),
        ),
      ),
    ).toEqual([
      `${at('connection-type')}: connection-type: expected ssh (the only connection type metastatic nodes offer; Nodepool's winrm and network_cli are not supported), got "winrm"`,
      `${at('shell-type')}: shell-type: expected one of sh, csh, fish, powershell, cmd, got "bash"`,
      `${at('username')}: username: expected a user name of 1-32 characters of A-Z a-z 0-9 . _ - starting with a letter or _, got "-root"`,
      `${at('python-path')}: python-path: expected "auto" or an interpreter's path, one line of at most 255 printable ASCII characters, got "py\\nthon"`,
    ]);
    expect(problems(parseObject(localWith({ 'connection-type': 'network_cli' })))).toEqual([
      `${at('connection-type')}: connection-type: expected ssh (the only connection type metastatic nodes offer; Nodepool's winrm and network_cli are not supported), got "network_cli"`,
    ]);
  });

  it('takes authorized-keys of the known types on an aws pool, and refuses what authorized_keys would not take', () => {
    ok(parseObject(awsWith({ pool: { 'authorized-keys': [ED25519_KEY, RSA_KEY, ECDSA_KEY] } })));
    const [type, blob] = ED25519_KEY.split(' ') as [string, string];
    const bad = [
      `ssh-dss ${blob}`,
      `ssh-rsa ${blob} claims rsa`,
      `${type} ${blob.slice(0, 20)}`,
      `from="10.0.0.1" ${ED25519_KEY}`,
      `${ED25519_KEY}\nssh-rsa AAAA`,
      `${ED25519_KEY} ${'x'.repeat(4096)}`,
    ];
    const keys = 'providers[0].pools[0].authorized-keys';
    const phrase =
      'expected an OpenSSH public key line (ssh-ed25519, ssh-rsa, ecdsa-sha2-nistp256, ecdsa-sha2-nistp384, ecdsa-sha2-nistp521, sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com; then the base64 key; then an optional comment) of at most 4096 characters, without options';
    expect(problems(parseObject(awsWith({ pool: { 'authorized-keys': bad } })))).toEqual([
      `${keys}[0]: ${phrase}, got key type "ssh-dss"`,
      `${keys}[1]: ${phrase}, got a ssh-rsa line whose key data is a "ssh-ed25519" key`,
      `${keys}[2]: ${phrase}, got a ssh-ed25519 line whose key data is cut short`,
      `${keys}[3]: ${phrase}, got "from=\\"10.0.0.1\\" ssh-ed25519 AAAAC3Nza..."`,
      `${keys}[4]: ${phrase}, got a line with a control character or line break`,
      `${keys}[5]: ${phrase}, got a line of ${ED25519_KEY.length + 4097} characters`,
    ]);
    expect(
      problems(parseObject(awsWith({ pool: { 'authorized-keys': Array(33).fill(ED25519_KEY) } }))),
    ).toEqual([`${keys}: authorized-keys: expected a list of at most 32 public key lines, got a list`]);
    expect(problems(parseObject(awsWith({ pool: { 'authorized-keys': ED25519_KEY } })))).toEqual([
      `${keys}: authorized-keys: expected a list of at most 32 public key lines, got "${ED25519_KEY.slice(0, 37)}..."`,
    ]);
  });

  it('resolves per-slot-users, which needs authorized-keys and a username with room for the slot number', () => {
    const config = ok(
      parseObject(
        awsWith({
          pool: { 'authorized-keys': [ED25519_KEY] },
          large: { 'per-slot-users': true, username: 'zuul' },
        }),
      ),
    );
    expect(contractOf(config)).toEqual({
      username: 'zuul',
      connectionType: 'ssh',
      pythonPath: 'auto',
      perSlotUsers: true,
    });
    expect(problems(parseObject(awsWith({ large: { 'per-slot-users': true } })))).toEqual([
      `${at('per-slot-users')}: per-slot-users needs the pool's authorized-keys (providers[0].pools[0].authorized-keys): the slot users get no other key, so nobody could log in`,
    ]);
    const long = 'a'.repeat(29);
    expect(
      problems(
        parseObject(
          awsWith({
            pool: { 'authorized-keys': [ED25519_KEY] },
            large: { 'per-slot-users': true, username: long },
          }),
        ),
      ),
    ).toEqual([
      `${at('username')}: username: expected a user name of 1-28 characters of a-z 0-9 _ - starting with a letter or _ (with per-slot-users, slot users are <username>-<slot>), got "${long}"`,
    ]);
    // Without per-slot-users, a name useradd takes is enough.
    ok(parseObject(awsWith({ large: { username: long } })));
  });

  it('resolves isolation: contain, which needs per-slot-users; slot-imds only with it', () => {
    const keys = { 'authorized-keys': [ED25519_KEY] };
    const contained = { 'per-slot-users': true, username: 'zuul', isolation: 'contain' };
    ok(parseObject(awsWith({ pool: keys, large: contained })));
    ok(parseObject(awsWith({ pool: keys, large: { ...contained, 'slot-imds': true } })));
    expect(problems(parseObject(awsWith({ pool: keys, large: { isolation: 'contain' } })))).toEqual([
      `${at('isolation')}: isolation: contain needs per-slot-users: true (each slot is contained as a user of its own)`,
    ]);
    expect(problems(parseObject(awsWith({ pool: keys, large: { 'slot-imds': true } })))).toEqual([
      `${at('slot-imds')}: slot-imds applies to contained slots only (isolation: contain); without it every job can reach IMDS`,
    ]);
    expect(
      problems(parseObject(awsWith({ pool: keys, large: { ...contained, isolation: 'cgroup' } }))),
    ).toEqual([`${at('isolation')}: isolation: expected one of none, contain, got "cgroup"`]);
    // Contained, the users are made at boot from one line: 1000 slots cost what 1 does...
    ok(
      parseObject(
        awsWith({ pool: { 'authorized-keys': Array(8).fill(RSA_KEY) }, large: contained, jobs: 1000 }),
      ),
    );
    // ...but the slot program takes about 5 KB of EC2's 16 KB: 32 RSA keys no longer fit beside it.
    expect(
      problems(
        parseObject(awsWith({ pool: { 'authorized-keys': Array(32).fill(RSA_KEY) }, large: contained })),
      ),
    ).toEqual([
      expect.stringMatching(
        /per-slot-users: user data: the pool's 32 authorized-keys with \d+ slot users .* EC2 takes at most 16384$/,
      ),
    ]);
  });

  it("refuses a label whose userdata, the pool's keys and the slot users together exceed EC2's 16 KB, by YAML path", () => {
    const keys = Array(32).fill(RSA_KEY);
    // 32 RSA keys fit alone, and with 1000 slot users (the keys are written once, a YAML anchor)...
    ok(parseObject(awsWith({ pool: { 'authorized-keys': keys } })));
    // ...but a userdata that fits alone does not fit with them.
    const userdata = `#!/bin/sh\n${'#'.repeat(MAX_USERDATA_BYTES - 100)}\n`;
    ok(parseObject(awsWith({ large: { userdata } })));
    const over = problems(parseObject(awsWith({ pool: { 'authorized-keys': keys }, large: { userdata } })));
    expect(over).toHaveLength(1);
    expect(over[0]).toMatch(
      new RegExp(
        `^${at('userdata').replace(/[[\]().]/g, '\\$&')}: user data: its userdata with the pool's 32 authorized-keys make \\d+ bytes of user data; EC2 takes at most 16384$`,
      ),
    );
    // The slot users count by the largest max-parallel-jobs on the backing label.
    const perSlot = { 'per-slot-users': true, username: 'zuul' };
    ok(parseObject(awsWith({ pool: { 'authorized-keys': [ED25519_KEY] }, large: perSlot, jobs: 100 })));
    expect(
      problems(
        parseObject(awsWith({ pool: { 'authorized-keys': [ED25519_KEY] }, large: perSlot, jobs: 1000 })),
      ),
    ).toEqual([
      expect.stringMatching(
        /^providers\[0\]\.pools\[0\]\.labels\[0\]\.per-slot-users: user data: the pool's 1 authorized-keys with 1000 slot users \(per-slot-users, one per slot of max-parallel-jobs\) make \d+ bytes of user data; EC2 takes at most 16384$/,
      ),
    ]);
  });

  it('puts the keys in the JSON Schema with their defaults', () => {
    const schema = JSON.stringify(configJsonSchema());
    for (const key of [
      'authorized-keys',
      'per-slot-users',
      'python-path',
      'shell-type',
      'connection-type',
      'username',
    ]) {
      expect(schema).toContain(`"${key}"`);
    }
    expect(schema).toContain('"default":"ec2-user"');
    expect(schema).toContain('"default":"auto"');
  });
});

describe('the aws driver', () => {
  const metaFor = (backingLabel = 'large-node') => ({
    name: 'meta',
    driver: 'metastatic',
    pools: [pool([label('small-node', { 'backing-label': backingLabel })])],
  });
  const awsConfig = (
    poolExtra: Obj = {},
    labelExtra: Obj = {},
    providerExtra: Obj = { region: 'eu-west-1' },
  ) => ({
    providers: [
      {
        name: 'ec2',
        driver: 'aws',
        ...providerExtra,
        pools: [
          {
            name: 'spot',
            'subnet-id': 'subnet-1',
            ...poolExtra,
            labels: [
              { name: 'large-node', 'instance-type': 'm7i.4xlarge', 'image-id': 'ami-1', ...labelExtra },
            ],
          },
        ],
      },
      metaFor(),
    ],
  });

  it('accepts a full pool and passes its options on with defaults applied', () => {
    const config = ok(
      parseObject({
        providers: [
          {
            name: 'ec2',
            driver: 'aws',
            region: 'eu-west-1',
            pools: [
              {
                name: 'spot',
                'max-servers': 4,
                'subnet-ids': ['subnet-1', 'subnet-2'],
                'security-group-id': 'sg-1',
                'public-ipv4': true,
                labels: [
                  {
                    name: 'large-node',
                    'instance-types': ['m7i.4xlarge', 'm6i.4xlarge'],
                    'image-id': 'ami-0123',
                    'key-name': 'ops',
                    userdata: '#!/bin/sh\necho hi\n',
                    'iam-instance-profile': { name: 'builder' },
                    'volume-size': 200,
                    tags: { team: 'ci' },
                    'use-spot': true,
                  },
                  {
                    name: 'templated',
                    'instance-type': 'c7i.large',
                    'launch-template': { name: 'builders', version: 3 },
                    'connection-port': 2222,
                  },
                ],
              },
            ],
          },
          metaFor(),
        ],
      }),
    );
    expect(config.backingPoolByLabel.get('large-node')).toMatchObject({
      key: 'ec2/spot',
      driver: 'aws',
      maxServers: 4,
      providerOptions: { driver: 'aws', region: 'eu-west-1' },
      poolOptions: {
        'max-servers': 4,
        'subnet-ids': ['subnet-1', 'subnet-2'],
        'security-group-id': 'sg-1',
        'public-ipv4': true,
      },
    });
    const labels = config.backingPools[0]?.labels;
    expect(labels?.get('large-node')?.options).toEqual({
      'instance-types': ['m7i.4xlarge', 'm6i.4xlarge'],
      'image-id': 'ami-0123',
      'key-name': 'ops',
      isolation: 'none',
      'slot-imds': false,
      userdata: '#!/bin/sh\necho hi\n',
      'iam-instance-profile': { name: 'builder' },
      'volume-size': 200,
      tags: { team: 'ci' },
      'use-spot': true,
      'connection-port': 22,
      username: 'ec2-user',
      'per-slot-users': false,
      'connection-type': 'ssh',
      'python-path': 'auto',
    });
    expect(labels?.get('templated')?.options).toEqual({
      'instance-type': 'c7i.large',
      'launch-template': { name: 'builders', version: 3 },
      'connection-port': 2222,
      tags: {},
      'use-spot': false,
      username: 'ec2-user',
      'per-slot-users': false,
      isolation: 'none',
      'slot-imds': false,
      'connection-type': 'ssh',
      'python-path': 'auto',
    });
  });

  it('defaults public-ipv4 to false', () => {
    const config = ok(parseObject(awsConfig()));
    expect(config.backingPools[0]?.poolOptions).toEqual({ 'subnet-id': 'subnet-1', 'public-ipv4': false });
  });

  it('rejects both instance-type and instance-types, and a label without any', () => {
    const result = parseObject({
      providers: [
        {
          name: 'ec2',
          driver: 'aws',
          region: 'eu-west-1',
          pools: [
            {
              name: 'p',
              'subnet-id': 'subnet-1',
              labels: [
                {
                  name: 'large-node',
                  'image-id': 'ami-1',
                  'instance-type': 'm7i.large',
                  'instance-types': ['m6i.large'],
                },
                { name: 'other', 'image-id': 'ami-1' },
              ],
            },
          ],
        },
        metaFor(),
      ],
    });
    expect(problems(result)).toEqual([
      'providers[0].pools[0].labels[0].instance-types: give either instance-type or instance-types, not both',
      'providers[0].pools[0].labels[1].instance-type: missing required key "instance-type" (or "instance-types", a list tried in order)',
    ]);
  });

  it('requires an image: image-id or launch-template (by id or name), not both', () => {
    expect(problems(parseObject(awsConfig({}, { 'image-id': undefined })))).toEqual([
      'providers[0].pools[0].labels[0].image-id: missing required key "image-id" (or "launch-template")',
    ]);
    expect(problems(parseObject(awsConfig({}, { 'launch-template': { id: 'lt-1' } })))).toEqual([
      'providers[0].pools[0].labels[0].launch-template: give either image-id or launch-template, not both',
    ]);
    expect(
      problems(
        parseObject(awsConfig({}, { 'image-id': undefined, 'launch-template': { version: '$Latest' } })),
      ),
    ).toEqual(['providers[0].pools[0].labels[0].launch-template.id: missing required key "id" (or "name")']);
  });

  it('rejects a bad volume-size, volume-type and connection-port, and root volume keys with a template', () => {
    expect(
      problems(
        parseObject(awsConfig({}, { 'volume-size': 0, 'volume-type': 'gp9', 'connection-port': 70000 })),
      ),
    ).toEqual([
      'providers[0].pools[0].labels[0].volume-size: volume-size: expected an integer >= 1 and <= 65536, got 0',
      'providers[0].pools[0].labels[0].volume-type: volume-type: expected one of gp3, gp2, io2, io1, st1, sc1, standard, got "gp9"',
      'providers[0].pools[0].labels[0].connection-port: connection-port: expected a port number from 1 to 65535, got 70000',
    ]);
    expect(problems(parseObject(awsConfig({}, { 'volume-size': '100G' })))).toEqual([
      'providers[0].pools[0].labels[0].volume-size: volume-size: expected an integer >= 1 and <= 65536, got "100G"',
    ]);
    expect(
      problems(
        parseObject(
          awsConfig(
            {},
            {
              'image-id': undefined,
              'launch-template': { id: 'lt-1' },
              'volume-size': 50,
              'volume-type': 'io2',
            },
          ),
        ),
      ),
    ).toEqual([
      'providers[0].pools[0].labels[0].volume-size: volume-size cannot be combined with launch-template (the template defines the root volume)',
      'providers[0].pools[0].labels[0].volume-type: volume-type cannot be combined with launch-template (the template defines the root volume)',
    ]);
  });

  it('requires a region and a subnet, and rejects unknown keys, reserved tags and max-servers < 1', () => {
    const result = parseObject(
      awsConfig(
        {
          'subnet-id': undefined,
          subnet: 'subnet-1',
          'max-servers': 0,
          'security-group-ids': ['sg-1'],
          'security-group-id': 'sg-2',
        },
        { instance_type: 'x', tags: { 'metastatic:pool': 'x', 'aws:cost': 'y', team: 'ci' } },
        {},
      ),
    );
    expect(problems(result)).toEqual([
      'providers[0].region: missing required key "region"',
      'providers[0].pools[0].subnet-ids: missing required key "subnet-ids" (or "subnet-id")',
      'providers[0].pools[0].subnet: unknown key "subnet"',
      'providers[0].pools[0].max-servers: max-servers: expected an integer >= 1 and <= 10000, got 0',
      'providers[0].pools[0].security-group-id: give either security-group-ids or security-group-id, not both',
      'providers[0].pools[0].labels[0].instance_type: unknown key "instance_type"; did you mean "instance-type"?',
      'providers[0].pools[0].labels[0].tags.metastatic:pool: tag key "metastatic:pool" is reserved (keys starting with "metastatic:" are set by metastatic)',
      'providers[0].pools[0].labels[0].tags.aws:cost: tag key "aws:cost" is reserved (keys starting with "aws:" are set by AWS)',
    ]);
  });

  it('still requires names', () => {
    const result = parseObject({
      providers: [
        {
          driver: 'aws',
          region: 'eu-west-1',
          pools: [{ 'subnet-id': 's', labels: [{ 'instance-type': 'x', 'image-id': 'ami-1' }] }],
        },
      ],
    });
    expect(problems(result)).toEqual([
      'providers[0].name: missing required key "name"',
      'providers[0].pools[0].name: missing required key "name"',
      'providers[0].pools[0].labels[0].name: missing required key "name"',
    ]);
  });
});

describe('a network path from the functions to the instances (issue 22, defect 7)', () => {
  /** An aws pool (public-ipv4 as given) and a metastatic pool on it; `meta` adds keys to the pool, `small` to the label. */
  const text = (
    o: { publicIpv4?: boolean; meta?: string; small?: string; awsPool?: string; awsLabel?: string } = {},
  ) =>
    dedent(`
      providers:
        - name: ec2
          driver: aws
          region: eu-west-1
          pools:
            - name: main
              subnet-id: subnet-1
              public-ipv4: ${o.publicIpv4 ?? false}
              ${o.awsPool ?? 'max-servers: 10'}
              labels:
                - { name: big, instance-type: c7g.4xlarge, image-id: ami-1${o.awsLabel ? `, ${o.awsLabel}` : ''} }
        - name: local
          driver: local
          pools:
            - name: main
              labels:
                - { name: proc }
        - name: meta
          driver: metastatic
          pools:
            - name: main
              ${o.meta ?? 'priority: 1'}
              labels:
                - name: small
                  backing-label: big
                  ${o.small ?? 'max-parallel-jobs: 2'}
                - name: tiny
                  backing-label: proc
    `);
  const outside = { functionsInVpc: false };
  // host-key-checking over a scan only: the console's keys cannot stand in.
  const noConsole = 'host-keys: none';

  it('refuses host-key-checking on a label whose instances the functions cannot reach, naming the path and the fix', () => {
    const errors = errorsOf(
      parseConfig(text({ small: 'host-key-checking: true', awsPool: noConsole }), 'pool.yaml', outside),
    );
    expect(errors).toEqual([
      {
        file: 'pool.yaml',
        path: 'providers[2].pools[0].labels[0].host-key-checking',
        line: 26,
        column: 32,
        message: expect.stringMatching(
          /^host-key-checking: the functions scan the host keys of ec2\/main's instances \(backing-label "big"\), but they run outside a VPC and the pool gives its instances no public address: put the functions in the instances' VPC .*or set host-key-checking: false$/,
        ),
      },
    ]);
    expect(errors[0]?.message).toContain('-c vpcId=');
    expect(errors[0]?.message).toContain('public-ipv4: true');
  });

  it("refuses the pool's host-key-checking at the pool's key when a label takes it", () => {
    const errors = errorsOf(
      parseConfig(text({ meta: 'host-key-checking: true', awsLabel: noConsole }), 'pool.yaml', outside),
    );
    expect(errors.map((e) => e.path)).toEqual(['providers[2].pools[0].host-key-checking']);
    expect(errors[0]?.message).toMatch(/label "small"/);
    // A label that turns it off needs no path; the local label never does.
    ok(
      parseConfig(
        text({ meta: 'host-key-checking: true', small: 'host-key-checking: false', awsPool: noConsole }),
        'pool.yaml',
        outside,
      ),
    );
  });

  it('accepts host-key-checking when the functions run in the VPC, or the instances have public addresses', () => {
    const scanOnly = { small: 'host-key-checking: true', awsPool: noConsole };
    ok(parseConfig(text(scanOnly), 'pool.yaml', { functionsInVpc: true }));
    ok(parseConfig(text({ ...scanOnly, publicIpv4: true }), 'pool.yaml', outside));
    // Without a deployment to check against (metastatic dev, the functions' own load), nothing is said.
    ok(parseConfig(text(scanOnly), 'pool.yaml'));
  });

  it('accepts host-key-checking outside the VPC when the keys come from the console output (the default there)', () => {
    ok(parseConfig(text({ small: 'host-key-checking: true' }), 'pool.yaml', outside));
    ok(
      parseConfig(
        text({ small: 'host-key-checking: true', awsPool: 'host-keys: console' }),
        'pool.yaml',
        outside,
      ),
    );
    // The label's own value wins over the pool's.
    ok(
      parseConfig(
        text({ small: 'host-key-checking: true', awsPool: noConsole, awsLabel: 'host-keys: console' }),
        'pool.yaml',
        outside,
      ),
    );
  });

  it('refuses host-keys: scan on an aws pool or label the functions cannot reach, at its key', () => {
    const errors = errorsOf(
      parseConfig(text({ awsPool: 'host-keys: scan', awsLabel: 'host-keys: scan' }), 'pool.yaml', outside),
    );
    expect(errors.map((e) => e.path)).toEqual([
      'providers[0].pools[0].host-keys',
      'providers[0].pools[0].labels[0].host-keys',
    ]);
    expect(errors[0]?.message).toMatch(
      /^host-keys: scan: the functions scan the host keys of ec2\/main's instances, but they run outside a VPC .*or use host-keys: console/,
    );
    ok(parseConfig(text({ awsPool: 'host-keys: scan', publicIpv4: true }), 'pool.yaml', outside));
    ok(parseConfig(text({ awsPool: 'host-keys: scan' }), 'pool.yaml', { functionsInVpc: true }));
  });

  it('refuses a host-keys value it does not know, naming the choices', () => {
    const errors = errorsOf(parseConfig(text({ awsLabel: 'host-keys: ssh' }), 'pool.yaml'));
    expect(errors.map((e) => [e.path, e.message])).toEqual([
      [
        'providers[0].pools[0].labels[0].host-keys',
        'host-keys: expected one of console, scan, none, got "ssh"',
      ],
    ]);
  });
});

describe('host-keys: console needs an instance type with the latest console output (issue 40, defect 4)', () => {
  /** An aws pool with one label of the given type(s), and a metastatic label on it. */
  const text = (o: { types: string; awsPool?: string; awsLabel?: string; publicIpv4?: boolean }) =>
    dedent(`
      providers:
        - name: ec2
          driver: aws
          region: eu-west-1
          pools:
            - name: main
              subnet-id: subnet-1
              public-ipv4: ${o.publicIpv4 ?? false}
              ${o.awsPool ?? 'max-servers: 10'}
              labels:
                - { name: big, ${o.types}, image-id: ami-1${o.awsLabel ? `, ${o.awsLabel}` : ''} }
        - name: meta
          driver: metastatic
          pools:
            - name: main
              labels:
                - { name: small, backing-label: big }
    `);
  const outside = { functionsInVpc: false };

  it('refuses a type certainly not built on Nitro (Xen) with host-keys: console, at the type, naming the fixes', () => {
    const errors = errorsOf(
      parseConfig(text({ types: 'instance-type: t2.large', awsLabel: 'host-keys: console' }), 'pool.yaml'),
    );
    expect(errors.map((e) => [e.path, e.line])).toEqual([
      ['providers[0].pools[0].labels[0].instance-type', 11],
    ]);
    expect(errors[0]?.message).toMatch(
      /^t2\.large is not built on the Nitro system, and host-keys: console reads the keys from the console output with GetConsoleOutput's Latest, which only Nitro instances support: EC2 gives its console output only as buffered at a state change, which may not show the host keys within boot-timeout, failing every backing node; use an instance type built on the Nitro system .*host-keys: scan with a network path .*or host-keys: none/,
    );
    // Each type of a list is checked, at its index; the pool's host-keys counts too.
    const listed = errorsOf(
      parseConfig(
        text({ types: 'instance-types: [m7i.large, c4.xlarge, m4.large]', awsPool: 'host-keys: console' }),
        'pool.yaml',
      ),
    );
    expect(listed.map((e) => e.path)).toEqual([
      'providers[0].pools[0].labels[0].instance-types[1]',
      'providers[0].pools[0].labels[0].instance-types[2]',
    ]);
  });

  it('refuses it where console is the default (the functions cannot reach the instances), once that is known', () => {
    const errors = errorsOf(parseConfig(text({ types: 'instance-type: m4.large' }), 'pool.yaml', outside));
    expect(errors.map((e) => e.path)).toEqual(['providers[0].pools[0].labels[0].instance-type']);
    expect(errors[0]?.message).toContain(
      'host-keys: console (the default: the functions cannot reach the instances)',
    );
    // The default is scan with a network path, and unknown without a deployment to check against.
    ok(parseConfig(text({ types: 'instance-type: m4.large' }), 'pool.yaml', { functionsInVpc: true }));
    ok(parseConfig(text({ types: 'instance-type: m4.large', publicIpv4: true }), 'pool.yaml', outside));
    ok(parseConfig(text({ types: 'instance-type: m4.large' }), 'pool.yaml'));
    // Other host-keys sources need no console.
    ok(
      parseConfig(
        text({ types: 'instance-type: m4.large', awsLabel: 'host-keys: none' }),
        'pool.yaml',
        outside,
      ),
    );
    ok(
      parseConfig(
        text({
          types: 'instance-type: m4.large',
          awsPool: 'host-keys: console',
          awsLabel: 'host-keys: none',
        }),
        'pool.yaml',
        outside,
      ),
    );
  });

  it('accepts Nitro types without a word, and warns of a type it does not know to be Nitro', () => {
    for (const type of [
      'm7i.large',
      'c5.xlarge',
      't3.micro',
      't4g.small',
      'p3dn.24xlarge',
      'x2iedn.xlarge',
      'c8g.large',
    ]) {
      expect(
        ok(parseConfig(text({ types: `instance-type: ${type}` }), 'pool.yaml', outside)).notices,
        type,
      ).toEqual([]);
    }
    const config = ok(
      parseConfig(text({ types: 'instance-types: [m7i.large, i3.metal, zz9.large]' }), 'pool.yaml', outside),
    );
    expect(config.notices.map((n) => n.path)).toEqual([
      'providers[0].pools[0].labels[0].instance-types[1]',
      'providers[0].pools[0].labels[0].instance-types[2]',
    ]);
    expect(config.notices[1]?.message).toMatch(
      /^zz9\.large is not known here to be built on the Nitro hypervisor, .*describe-instance-types --instance-types <type> --query 'InstanceTypes\[\]\.Hypervisor'/,
    );
  });
});

describe('what a configuration puts in a record or a launch is bounded (issue 22, defect 8)', () => {
  /** A local label with `attributes`, a metastatic pool with `node-attributes`, an aws label with `aws`. */
  const config = (o: { attributes?: unknown; nodeAttributes?: unknown; aws?: Obj } = {}): Obj => ({
    providers: [
      {
        name: 'local',
        driver: 'local',
        pools: [{ name: 'main', labels: [{ name: 'large-node', attributes: o.attributes ?? {} }] }],
      },
      {
        name: 'ec2',
        driver: 'aws',
        region: 'eu-west-1',
        pools: [
          {
            name: 'main',
            'subnet-id': 'subnet-1',
            labels: [{ name: 'ec2-node', 'instance-type': 'm7i.large', 'image-id': 'ami-1', ...o.aws }],
          },
        ],
      },
      {
        name: 'meta',
        driver: 'metastatic',
        pools: [{ name: 'main', 'node-attributes': o.nodeAttributes ?? {}, labels: [label('small-node')] }],
      },
    ],
  });
  const LA = 'providers[0].pools[0].labels[0].attributes';
  const NA = 'providers[2].pools[0].node-attributes';
  const AWS = 'providers[1].pools[0].labels[0]';
  /** A mapping whose JSON takes exactly `bytes` bytes. */
  const ofBytes = (bytes: number) => ({ k: 'v'.repeat(bytes - '{"k":""}'.length) });
  /** `depth` mappings inside each other. */
  const nested = (depth: number): unknown => (depth === 1 ? { leaf: 1 } : { deeper: nested(depth - 1) });

  it("refuses a label's attributes of 150,000 characters, naming the YAML path and the size", () => {
    expect(problems(parseObject(config({ attributes: { big: 'x'.repeat(150_000) } })))).toEqual([
      `${LA}: attributes: expected a mapping of at most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, got 150010 bytes`,
    ]);
  });

  it('takes attributes and node-attributes up to the bound, counting bytes of UTF-8', () => {
    ok(
      parseObject(
        config({ attributes: ofBytes(MAX_ATTRIBUTES_BYTES), nodeAttributes: ofBytes(MAX_ATTRIBUTES_BYTES) }),
      ),
    );
    expect(problems(parseObject(config({ nodeAttributes: ofBytes(MAX_ATTRIBUTES_BYTES + 1) })))).toEqual([
      `${NA}: node-attributes: expected a mapping of at most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, got ${MAX_ATTRIBUTES_BYTES + 1} bytes`,
    ]);
    // 200 characters (under the bound) of 3 bytes each: 600 bytes.
    expect(problems(parseObject(config({ attributes: { k: '\u4e00'.repeat(200) } })))).toEqual([
      `${LA}: attributes: expected a mapping of at most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, got 608 bytes`,
    ]);
  });

  it('refuses values nested deeper than DynamoDB would store them, and numbers it cannot store', () => {
    ok(parseObject(config({ attributes: nested(MAX_ATTRIBUTES_DEPTH) })));
    expect(problems(parseObject(config({ attributes: nested(MAX_ATTRIBUTES_DEPTH + 1) })))).toEqual([
      `${LA}: attributes: expected values nested at most ${MAX_ATTRIBUTES_DEPTH} levels deep, got ${MAX_ATTRIBUTES_DEPTH + 1} levels`,
    ]);
    expect(
      problems(
        parseObject(
          config({
            nodeAttributes: { a: { b: [1, 1e-300] }, c: 1e200, d: 0, e: -2.5e125, f: 1e126, g: 1e-130 },
          }),
        ),
      ),
    ).toEqual([
      `${NA}.a.b[1]: expected a number DynamoDB can store (0, or 1e-130 to 9.99e125 either way), got 1e-300`,
      `${NA}.c: c: expected a number DynamoDB can store (0, or 1e-130 to 9.99e125 either way), got 1e+200`,
      `${NA}.f: f: expected a number DynamoDB can store (0, or 1e-130 to 9.99e125 either way), got 1e+126`,
    ]);
  });

  it('holds tags and userdata to what EC2 accepts', () => {
    const tags = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`t${i}`, 'v']));
    ok(parseObject(config({ aws: { tags: tags(MAX_USER_TAGS), userdata: 'u'.repeat(MAX_USERDATA_BYTES) } })));
    // Name replaces metastatic's own Name tag: it does not count.
    ok(parseObject(config({ aws: { tags: { ...tags(MAX_USER_TAGS), Name: 'builder' } } })));
    expect(
      problems(
        parseObject(config({ aws: { tags: tags(MAX_USER_TAGS + 1), userdata: '\u00e9'.repeat(8193) } })),
      ),
    ).toEqual([
      `${AWS}.tags: tags: expected at most ${MAX_USER_TAGS} tags besides Name (EC2 allows 50 and metastatic sets 5), got 46`,
      `${AWS}.userdata: userdata: expected at most ${MAX_USERDATA_BYTES} bytes of UTF-8 (EC2's limit before base64), got 16386 bytes`,
    ]);
  });
});

describe('limits (issue 10): every number has a maximum, names and hosts a shape', () => {
  /**
   * Every numeric key of every driver at its largest allowed value (max-age and min-retention-time both
   * at the week, so max-age >= min-retention-time holds).
   */
  const biggest = (): Obj => ({
    labels: [{ name: 'small-node', 'min-ready': 100 }, { name: 'large-node' }, { name: 'ec2-node' }],
    providers: [
      {
        name: 'local',
        driver: 'local',
        host: '127.0.0.1',
        pools: [
          { name: 'main', 'max-servers': 10_000, labels: [{ name: 'large-node', 'boot-delay': 86400 }] },
        ],
      },
      {
        name: 'ec2',
        driver: 'aws',
        region: 'eu-west-1',
        pools: [
          {
            name: 'spot',
            'subnet-id': 'subnet-1',
            'max-servers': 10_000,
            labels: [
              {
                name: 'ec2-node',
                'instance-type': 'm7i.large',
                'launch-template': { id: 'lt-1', version: 1_000_000 },
                'connection-port': 65535,
              },
            ],
          },
        ],
      },
      {
        name: 'meta',
        driver: 'metastatic',
        'boot-timeout': 86400,
        'launch-timeout': 86400,
        'launch-retries': 20,
        priority: 1_000_000,
        'request-timeout': 604800,
        pools: [
          {
            name: 'main',
            priority: -1_000_000,
            'max-servers': 10_000,
            'request-timeout': 604800,
            labels: [
              label('small-node', {
                'max-parallel-jobs': 1000,
                'grace-time': 604800,
                'min-retention-time': 604800,
                'max-age': 604800,
                'request-timeout': 604800,
              }),
            ],
          },
        ],
      },
    ],
  });

  /** Sets the value at a path like `providers[2].pools[0].priority`. */
  function setAt(config: Obj, path: string, value: unknown): Obj {
    const segments = path.split(/\.|\[(\d+)\]/).filter((s) => s !== undefined && s !== '');
    let at = config as Record<string, unknown>;
    segments.slice(0, -1).forEach((s) => {
      at = at[s] as Record<string, unknown>;
    });
    at[segments[segments.length - 1] as string] = value;
    return config;
  }

  it('accepts every number at its largest allowed value', () => {
    const config = ok(parseObject(biggest()));
    const meta = config.metastaticPools[0];
    expect(meta?.labels.get('small-node')?.maxParallelJobs).toBe(1000);
    expect(meta?.launchRetries).toBe(20);
    expect(config.backingPoolByLabel.get('large-node')?.labels.get('large-node')?.options['boot-delay']).toBe(
      86400,
    );
  });

  const L = 'providers[0].pools[0].labels[0]';
  const A = 'providers[1].pools[0].labels[0]';
  const M = 'providers[2]';
  const ML = 'providers[2].pools[0].labels[0]';
  // [path, a value just too large (or the one that broke the pool), what the error says it expected]
  const tooLarge: [string, number, string][] = [
    ['labels[0].min-ready', 101, 'an integer >= 0 and <= 100, or auto'],
    ['providers[0].pools[0].max-servers', 10_001, 'an integer >= 1 and <= 10000'],
    [`${L}.boot-delay`, 1e12, 'a number of seconds >= 0 and <= 86400'],
    [`${L}.boot-delay`, 86400.5, 'a number of seconds >= 0 and <= 86400'],
    ['providers[1].pools[0].max-servers', 10_001, 'an integer >= 1 and <= 10000'],
    [`${A}.connection-port`, 65536, 'a port number from 1 to 65535'],
    [`${A}.launch-template.version`, 1_000_001, 'an integer >= 1 and <= 1000000'],
    [`${M}.boot-timeout`, 86401, 'a number of seconds > 0 and <= 86400'],
    [`${M}.launch-timeout`, 86401, 'a number of seconds > 0 and <= 86400'],
    [`${M}.launch-retries`, 21, 'an integer >= 1 and <= 20'],
    [`${M}.priority`, 1_000_001, 'an integer >= -1000000 and <= 1000000'],
    [`${M}.request-timeout`, 604801, 'a number of seconds > 0 and <= 604800'],
    [`${M}.pools[0].priority`, -1_000_001, 'an integer >= -1000000 and <= 1000000'],
    [`${M}.pools[0].max-servers`, 10_001, 'an integer <= 10000'],
    [`${M}.pools[0].request-timeout`, 604801, 'a number of seconds > 0 and <= 604800'],
    [`${ML}.max-parallel-jobs`, 1_000_000_000, 'an integer >= 1 and <= 1000'],
    [`${ML}.max-parallel-jobs`, 1001, 'an integer >= 1 and <= 1000'],
    [`${ML}.grace-time`, 604801, 'a number of seconds >= 0 and <= 604800'],
    [`${ML}.min-retention-time`, 604801, 'a number of seconds >= 0 and <= 604800'],
    [`${ML}.max-age`, 604801, 'a number of seconds >= 0 and <= 604800'],
    [`${ML}.request-timeout`, 604801, 'a number of seconds > 0 and <= 604800'],
  ];

  it.each(tooLarge)('refuses %s: %s, naming the YAML path', (path, value, expected) => {
    const key = path.split('.').pop();
    expect(problems(parseObject(setAt(biggest(), path, value)))).toEqual([
      `${path}: ${key}: expected ${expected}, got ${value}`,
    ]);
  });

  it('keeps a volume-size within the EBS limits of its volume-type (gp3 when unset)', () => {
    const aws = (extra: Obj) => ({
      providers: [
        {
          name: 'ec2',
          driver: 'aws',
          region: 'eu-west-1',
          pools: [
            {
              name: 'spot',
              'subnet-id': 'subnet-1',
              labels: [{ name: 'large-node', 'instance-type': 'm7i.large', 'image-id': 'ami-1', ...extra }],
            },
          ],
        },
        { name: 'meta', driver: 'metastatic', pools: [pool([label('small-node')])] },
      ],
    });
    const at = 'providers[0].pools[0].labels[0].volume-size';
    for (const fits of [
      { 'volume-size': 16384 },
      { 'volume-size': 16384, 'volume-type': 'gp2' },
      { 'volume-size': 65536, 'volume-type': 'io2' },
      { 'volume-size': 125, 'volume-type': 'st1' },
      { 'volume-size': 1024, 'volume-type': 'standard' },
    ]) {
      ok(parseObject(aws(fits)));
    }
    expect(problems(parseObject(aws({ 'volume-size': 16385 })))).toEqual([
      `${at}: volume-size: a gp3 volume is 1 to 16384 GiB, got 16385`,
    ]);
    expect(problems(parseObject(aws({ 'volume-size': 65536, 'volume-type': 'io1' })))).toEqual([
      `${at}: volume-size: a io1 volume is 4 to 16384 GiB, got 65536`,
    ]);
    expect(problems(parseObject(aws({ 'volume-size': 1025, 'volume-type': 'standard' })))).toEqual([
      `${at}: volume-size: a standard volume is 1 to 1024 GiB, got 1025`,
    ]);
    expect(problems(parseObject(aws({ 'volume-size': 100, 'volume-type': 'sc1' })))).toEqual([
      `${at}: volume-size: a sc1 volume is 125 to 16384 GiB, got 100`,
    ]);
    expect(problems(parseObject(aws({ 'volume-size': 65537, 'volume-type': 'io2' })))).toEqual([
      `${at}: volume-size: expected an integer >= 1 and <= 65536, got 65537`,
    ]);
  });

  const NAME = 'expected a name of 1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit';

  it('refuses the pool and label names that built one index key: main + "x#y" and "main#x" + y', () => {
    const result = parseObject(
      withMeta([pool([label('x#y')], {}, 'main'), pool([label('y')], {}, 'main#x')]),
    );
    expect(problems(result)).toEqual([
      `providers[1].pools[0].labels[0].name: name: ${NAME}, got "x#y"`,
      `providers[1].pools[1].name: name: ${NAME}, got "main#x"`,
    ]);
  });

  it('restricts the characters of provider, pool, label and backing-label names', () => {
    const bad = ['a/b', 'a b', '-a', '.a', '', 'ä', 'a:b', 'x'.repeat(65)];
    for (const name of bad) {
      const shown = JSON.stringify(name.length > 40 ? `${name.slice(0, 37)}...` : name);
      expect(problems(parseObject(withMeta([pool([label(name)])], { name })))).toEqual([
        `providers[1].name: name: ${NAME}, got ${shown}`,
        `providers[1].pools[0].labels[0].name: name: ${NAME}, got ${shown}`,
      ]);
      expect(
        problems(parseObject(withMeta([pool([label('small-node', { 'backing-label': name })])]))),
      ).toEqual([`providers[1].pools[0].labels[0].backing-label: backing-label: ${NAME}, got ${shown}`]);
    }
    const result = parseObject({
      labels: [{ name: 'large#node' }],
      providers: [
        {
          ...localProvider(['large#node'], 'loc#al'),
          pools: [{ name: 'ma#in', labels: [{ name: 'large#node' }] }],
        },
      ],
    });
    expect(errorsOf(result).map((e) => e.path)).toEqual([
      'labels[0].name',
      'providers[0].name',
      'providers[0].pools[0].name',
      'providers[0].pools[0].labels[0].name',
    ]);
    // What examples/ and the tests use stays valid, up to 64 characters.
    const longest = `A${'x'.repeat(62)}9`;
    ok(parseObject(withMeta([pool([label('small_node.v2-x')], {}, longest)], { name: 'Meta.1' })));
  });

  it('accepts a local host that is an IPv4 or IPv6 address or a DNS name, and nothing else', () => {
    const withHost = (host: unknown) => ({
      providers: [
        { ...localProvider(), host },
        { name: 'meta', driver: 'metastatic', pools: [pool([label('small-node')])] },
      ],
    });
    for (const host of [
      '127.0.0.1',
      '0.0.0.0',
      '::1',
      'fd00::1:2',
      'localhost',
      'build-1.example.com',
      'example.com.',
    ]) {
      expect(ok(parseObject(withHost(host))).backingPools[0]?.providerOptions.host).toBe(host);
    }
    for (const host of [
      '127.0.0.1 --evil',
      '--evil',
      '-h',
      '999.1.1.1',
      '1234',
      'a b',
      'a_b.example',
      '[::1]',
      'host:22',
      '',
      'x'.repeat(64),
    ]) {
      const shown = JSON.stringify(host.length > 40 ? `${host.slice(0, 37)}...` : host);
      expect(problems(parseObject(withHost(host)))).toEqual([
        `providers[0].host: host: expected an IPv4 or IPv6 address or a DNS name, got ${shown}`,
      ]);
    }
  });
});

describe('loading files', () => {
  it('reports an unreadable file', async () => {
    const result = await loadConfigFile(join(root, 'does-not-exist.yaml'));
    expect(errorsOf(result)[0]?.message).toMatch(/^cannot read the configuration: ENOENT/);
  });

  it('throws ConfigInvalidError carrying the errors', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-config-'));
    try {
      const path = join(dir, 'bad.yaml');
      await writeFile(path, 'providers: []\n');
      const error = await loadConfigOrThrow(path).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ConfigInvalidError);
      expect((error as ConfigInvalidError).errors).toEqual([
        {
          file: path,
          path: 'providers',
          line: 1,
          column: 12,
          message: 'providers: expected a non-empty list of providers, got an empty list',
        },
      ]);
      expect((error as Error).message).toContain(`${path}:1:12: providers: providers: expected`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('the JSON schema', () => {
  it('describes the providers list', () => {
    const schema = configJsonSchema() as {
      properties?: { providers?: unknown };
      additionalProperties?: unknown;
    };
    expect(schema.properties?.providers).toBeTypeOf('object');
    expect(schema.additionalProperties).toBe(false);
  });

  it('does not require keys that have defaults', () => {
    const text = JSON.stringify(configJsonSchema());
    expect(text).toContain('"default":60');
    expect(text).toContain('"required":["name","backing-label"]');
  });

  it('matches the committed docs/config.schema.json', async () => {
    const committed = await readFile(join(root, 'docs/config.schema.json'), 'utf8');
    expect(committed).toBe(`${JSON.stringify(configJsonSchema(), null, 2)}\n`);
  });
});

describe('authorized-keys of a local backing pool', () => {
  const ED25519 = `ssh-ed25519 ${Buffer.concat([Buffer.from([0, 0, 0, 11]), Buffer.from('ssh-ed25519'), Buffer.from([0, 0, 0, 32]), Buffer.alloc(32, 7)]).toString('base64')}`;
  const withKeys = (keys: unknown) => {
    const config = withMeta([pool([label('a')])]);
    const [local] = config.providers as Obj[];
    (local as { pools: Obj[] }).pools[0] = {
      ...(local as { pools: Obj[] }).pools[0],
      'authorized-keys': keys,
    };
    return parseObject(config);
  };

  it('accepts OpenSSH public key lines, with or without a comment, and keeps them on the pool', () => {
    const config = ok(withKeys([ED25519, `${ED25519} ci@example`]));
    expect(config.backingPools[0]?.poolOptions['authorized-keys']).toEqual([
      ED25519,
      `${ED25519} ci@example`,
    ]);
    expect(
      ok(parseObject(withMeta([pool([label('a')])]))).backingPools[0]?.poolOptions['authorized-keys'],
    ).toEqual([]);
  });

  it('rejects unknown types, a blob of another type, options, bad base64, too long and too many, by YAML path', () => {
    const path = 'providers[0].pools[0].authorized-keys';
    const bad = [
      `ssh-dss ${ED25519.split(' ')[1]}`,
      `ssh-rsa ${ED25519.split(' ')[1]}`,
      `from="10.0.0.1" ${ED25519}`,
      'ssh-ed25519 not*base64',
      `${ED25519} ${'x'.repeat(5000)}`,
    ];
    const messages = problems(withKeys(bad));
    expect(messages).toHaveLength(bad.length);
    bad.forEach((_, i) => {
      expect(messages[i]).toMatch(
        new RegExp(`^${path.replace(/[[\]]/g, '\\$&')}\\[${i}\\]: expected an OpenSSH public key line`),
      );
    });
    expect(problems(withKeys(Array.from({ length: 33 }, () => ED25519)))).toEqual([
      `${path}: authorized-keys: expected a list of at most 32 public keys, got a list`,
    ]);
  });
});
