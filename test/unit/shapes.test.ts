import { describe, expect, it } from 'vitest';
import { type ConfigResult, formatConfigErrors, parseConfig } from '../../shared/config/load.ts';
import { contentHash } from '../../shared/core/ids.ts';
import { parseMessage } from '../../shared/core/messages.ts';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import { requestBodyHash } from '../../shared/core/request.ts';
import { describeShape, fits, parseSize, shapeOffers } from '../../shared/core/shapes.ts';
import { instanceTypeFacts } from '../../shared/providers/aws/instanceTypes.ts';
import { largeNode, poolConfig, smallNode } from '../../testkit/configs.ts';

/** Requests by shape (issue 15, part 1): sizes, fitting, ranking, and slot shapes from the configuration. */

function ok(result: ConfigResult): ResolvedConfig {
  if (!result.ok) throw new Error(formatConfigErrors(result.errors));
  return result.config;
}

const awsBacking = (labels: Record<string, unknown>[]) => ({
  driver: 'aws' as const,
  provider: { region: 'us-east-1' },
  pool: { 'subnet-id': 'subnet-1' },
  labels: labels.map((l) => ({ 'image-id': 'ami-12345678', ...l })),
});

describe('sizes', () => {
  it('reads binary and decimal units into MiB and refuses what is not a size', () => {
    expect(parseSize('4GiB')).toBe(4096);
    expect(parseSize('4Gi')).toBe(4096);
    expect(parseSize('512MiB')).toBe(512);
    expect(parseSize('1.5TiB')).toBe(1.5 * 1024 * 1024);
    expect(parseSize('1G')).toBeCloseTo(1e9 / 1024 ** 2, 6);
    expect(parseSize('20GB')).toBeCloseTo(20e9 / 1024 ** 2, 6);
    for (const bad of ['4', '4 gigs', 'GiB', '-1GiB', '4gib', '1e3GiB', ''])
      expect(parseSize(bad)).toBeUndefined();
    expect(describeShape({ cores: 2, memoryMiB: 4096, diskMiB: 1024 * 1024 })).toBe(
      '2 cores, 4GiB memory, 1TiB disk',
    );
  });

  it('fits a node on a slot only when every dimension it asks for is known and enough', () => {
    expect(fits({ cores: 2, memoryMiB: 4096 }, { cores: 2 })).toBe(true);
    expect(fits({ cores: 2, memoryMiB: 4096 }, { cores: 2, memoryMiB: 4097 })).toBe(false);
    expect(fits({ cores: 2 }, { diskMiB: 1 })).toBe(false); // disk unknown: not promised
    expect(fits({ cores: 0.5 }, { cores: 0.5 })).toBe(true);
  });
});

describe('EC2 instance types', () => {
  it('knows the sizes and on-demand prices of the common families, and nothing it does not list', () => {
    expect(instanceTypeFacts('m5.2xlarge')).toEqual({ vcpus: 8, memoryMiB: 32768, hourlyCost: 0.384 });
    expect(instanceTypeFacts('c5.9xlarge')).toEqual({ vcpus: 36, memoryMiB: 73728, hourlyCost: 1.53 });
    expect(instanceTypeFacts('r6i.large')).toEqual({ vcpus: 2, memoryMiB: 16384, hourlyCost: 0.126 });
    expect(instanceTypeFacts('m7g.medium')).toEqual({ vcpus: 1, memoryMiB: 4096, hourlyCost: 0.0408 });
    expect(instanceTypeFacts('t3.micro')).toEqual({ vcpus: 2, memoryMiB: 1024, hourlyCost: 0.0104 });
    for (const unknown of ['c5.8xlarge', 'm5.medium', 'p4d.24xlarge', 'm5', 'x.y.z'])
      expect(instanceTypeFacts(unknown)).toBeUndefined();
  });
});

describe('slot shapes in the configuration', () => {
  it('derives a slot from the instance type / max-parallel-jobs; the label and hourly-cost win', () => {
    const config = ok(
      parseConfig(
        poolConfig({
          backing: awsBacking([
            { name: 'm5', 'instance-type': 'm5.2xlarge' },
            { name: 'mixed', 'instance-types': ['m7g.2xlarge', 'm6g.xlarge'] },
            { name: 'priced', 'instance-type': 'c5.xlarge', 'hourly-cost': 0.05 },
            { name: 'odd', 'instance-type': 'p4d.24xlarge' },
          ]),
          meta: {
            labels: [
              smallNode({ name: 'a', 'backing-label': 'm5', 'max-parallel-jobs': 4 }),
              smallNode({ name: 'b', 'backing-label': 'mixed', 'max-parallel-jobs': 2 }),
              smallNode({
                name: 'c',
                'backing-label': 'priced',
                'max-parallel-jobs': 2,
                memory: '3GiB',
                disk: '10G',
              }),
              smallNode({ name: 'd', 'backing-label': 'odd', 'max-parallel-jobs': 8 }),
              smallNode({ name: 'e', 'backing-label': 'odd', 'max-parallel-jobs': 8, cores: 12 }),
            ],
          },
        }),
        'test.yaml',
      ),
    );
    const labels = config.metastaticPools[0]?.labels;
    expect(labels?.get('a')).toMatchObject({ slot: { cores: 2, memoryMiB: 8192 }, slotHourlyCost: 0.096 });
    // Several types: the smallest of each size, the highest price (any of them may be launched).
    expect(labels?.get('b')).toMatchObject({ slot: { cores: 2, memoryMiB: 8192 }, slotHourlyCost: 0.1632 });
    expect(labels?.get('c')?.slot).toEqual({ cores: 2, memoryMiB: 3072, diskMiB: 10e9 / 1024 ** 2 });
    expect(labels?.get('c')?.slotHourlyCost).toBe(0.025);
    expect(labels?.get('d')?.slot).toBeUndefined(); // nothing known: never chosen for a shape
    expect(labels?.get('e')).toMatchObject({ slot: { cores: 12 } });
    expect(labels?.get('e')?.slotHourlyCost).toBeUndefined();
    expect(config.shapeCostMargin).toBe(20);
  });

  it('warns, by YAML path, of slots that promise more than their instance type gives', () => {
    const config = ok(
      parseConfig(
        poolConfig({
          backing: awsBacking([{ name: 'm5', 'instance-type': 'm5.2xlarge' }]),
          meta: {
            labels: [smallNode({ 'backing-label': 'm5', 'max-parallel-jobs': 4, cores: 4, memory: '8GiB' })],
          },
        }),
        'test.yaml',
      ),
    );
    expect(config.notices).toEqual([
      {
        path: 'providers[1].pools[0].labels[0].cores',
        message: '4 slots of 4 cores need 16; a backing node gives 8',
      },
    ]);
    const memory = ok(
      parseConfig(
        poolConfig({
          backing: awsBacking([{ name: 'm5', 'instance-type': 'm5.2xlarge' }]),
          meta: { labels: [smallNode({ 'backing-label': 'm5', 'max-parallel-jobs': 4, memory: '9GiB' })] },
        }),
        'test.yaml',
      ),
    );
    expect(memory.notices).toEqual([
      {
        path: 'providers[1].pools[0].labels[0].memory',
        message: '4 slots of 9GiB need 36GiB; a backing node gives 32GiB',
      },
    ]);
  });

  it('names the YAML path of a bad size, core count, cost or margin', () => {
    const result = parseConfig(
      poolConfig({
        top: { 'shape-cost-margin': 5000 },
        backing: { labels: [largeNode({ 'hourly-cost': -1 })] },
        meta: { labels: [smallNode({ cores: 0, memory: '4 gigs', disk: '2PiB' })] },
      }),
      'test.yaml',
    );
    if (result.ok) throw new Error('expected errors');
    expect(result.errors.map((e) => e.path).sort()).toEqual([
      'providers[0].pools[0].labels[0].hourly-cost',
      'providers[1].pools[0].labels[0].cores',
      'providers[1].pools[0].labels[0].disk',
      'providers[1].pools[0].labels[0].memory',
      'shape-cost-margin',
    ]);
    expect(formatConfigErrors(result.errors)).toContain('a size with a unit, such as "4GiB"');
  });
});

describe('choosing labels for shapes', () => {
  const config = ok(
    parseConfig(
      poolConfig({
        backing: {
          labels: [
            largeNode({ name: 'cheap', 'hourly-cost': 0.4 }),
            largeNode({ name: 'dear', 'hourly-cost': 1.6 }),
            largeNode({ name: 'nocost' }),
          ],
        },
        meta: {
          labels: [
            smallNode({
              name: 'big',
              'backing-label': 'dear',
              'max-parallel-jobs': 2,
              cores: 8,
              memory: '32GiB',
            }),
            smallNode({
              name: 'small',
              'backing-label': 'cheap',
              'max-parallel-jobs': 4,
              cores: 1,
              memory: '2GiB',
            }),
            smallNode({ name: 'unpriced', 'backing-label': 'nocost', cores: 1 }),
          ],
          morePools: [
            {
              name: 'second',
              labels: [
                smallNode({ name: 'tiny', 'backing-label': 'cheap', 'max-parallel-jobs': 4, cores: 0.5 }),
              ],
            },
          ],
        },
      }),
      'test.yaml',
    ),
  );

  it('ranks the labels that fit cheapest first, unknown costs last', () => {
    const offers = shapeOffers(config, [{ cores: 1 }, { memoryMiB: 4096 }]);
    if (!offers.ok) throw new Error(offers.reason);
    expect(offers.pools.map((p) => p.pool.key)).toEqual(['meta/main']);
    const [first, second] = offers.pools[0]?.perShape ?? [];
    expect(first?.map((o) => o.label.name)).toEqual(['small', 'big', 'unpriced']);
    expect(second?.map((o) => o.label.name)).toEqual(['big']);
    expect(offers.pools[0]?.hourlyCost).toBeCloseTo(0.1 + 0.8, 9);
  });

  it('serves a node set from one pool, and says which shape nothing fits', () => {
    const half = shapeOffers(config, [{ cores: 0.5 }]);
    if (!half.ok) throw new Error(half.reason);
    expect(half.pools.map((p) => p.pool.key)).toEqual(['meta/main', 'meta/second']);
    const none = shapeOffers(config, [{ cores: 1 }, { cores: 9 }]);
    expect(none).toEqual({
      ok: false,
      reason: expect.stringContaining("no label's slot fits shape 2 (9 cores)"),
    });
  });
});

describe('request messages by shape', () => {
  it('hashes the shapes, so every delivery of a request by shape hashes the same and a label request is unchanged', () => {
    const byShape = parseMessage(
      JSON.stringify({ kind: 'request', id: 'r', shapes: [{ cores: 2, memory: '4GiB' }] }),
    );
    if (!byShape.ok || byShape.message.kind !== 'request') throw new Error('expected a request');
    expect(requestBodyHash(byShape.message)).toBe(
      requestBodyHash({ shapes: [{ memory: '4GiB', cores: 2 }] }), // key order does not matter
    );
    expect(requestBodyHash(byShape.message)).not.toBe(
      requestBodyHash({ shapes: [{ cores: 2, memory: '8GiB' }] }),
    );
    // A label request's hash has no `shapes` in it: requests recorded before shapes keep theirs.
    expect(requestBodyHash({ labels: ['a'], priority: 2 })).toBe(contentHash({ labels: ['a'], priority: 2 }));
  });
});
