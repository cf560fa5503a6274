import { stringify } from 'yaml';

/**
 * The one builder of pool configurations for tests and benchmarks: a backing provider with one pool and
 * its labels, and a metastatic provider with one pool whose labels pack onto them. Every setting is
 * given as the YAML key it is (`max-parallel-jobs`), on the level it belongs to; undefined values are
 * left out, so a fixture names only what its test is about. The text is YAML as a user writes it.
 *
 * Configurations that are themselves the input under test (a validation error's YAML path and line)
 * stay literal text in their tests.
 */

export type Settings = Readonly<Record<string, unknown>>;

export interface ConfigFixture {
  /** Other top-level keys (`shape-cost-margin`). */
  readonly top?: Settings;
  /** The top-level labels list (Nodepool's: `name`, `min-ready`); when given, it lists every label offered. */
  readonly labels?: readonly Settings[];
  /** The backing provider: `local` processes (default) or EC2 (`aws`, which needs `provider.region`). */
  readonly backing?: {
    readonly driver?: 'local' | 'aws';
    readonly name?: string;
    readonly provider?: Settings;
    readonly pool?: Settings;
    /** The backing labels; default one, `large-node`. */
    readonly labels?: readonly Settings[];
  };
  readonly meta?: {
    readonly provider?: Settings;
    readonly pool?: Settings;
    /** The metastatic labels; default one, `small-node` on the first backing label. */
    readonly labels?: readonly Settings[];
    /** More metastatic pools after `main`, each with its own settings and labels. */
    readonly morePools?: readonly Settings[];
  };
}

/** A label `small-node` packed onto `large-node`, with these settings added. */
export const smallNode = (settings: Settings = {}): Settings => ({
  name: 'small-node',
  'backing-label': 'large-node',
  ...settings,
});

/** The backing label `large-node`, with these settings added. */
export const largeNode = (settings: Settings = {}): Settings => ({ name: 'large-node', ...settings });

/** The configuration's YAML text. */
export function poolConfig(f: ConfigFixture = {}): string {
  const driver = f.backing?.driver ?? 'local';
  const name = f.backing?.name ?? (driver === 'aws' ? 'ec2' : 'local');
  const backingLabels = f.backing?.labels ?? [largeNode()];
  const firstBacking = String(backingLabels[0]?.name ?? 'large-node');
  const metaLabels = f.meta?.labels ?? [smallNode({ 'backing-label': firstBacking })];
  const config = {
    ...f.top,
    labels: f.labels,
    providers: [
      {
        name,
        driver,
        ...f.backing?.provider,
        pools: [{ name: 'main', ...f.backing?.pool, labels: backingLabels }],
      },
      {
        name: 'meta',
        driver: 'metastatic',
        ...f.meta?.provider,
        pools: [{ name: 'main', ...f.meta?.pool, labels: metaLabels }, ...(f.meta?.morePools ?? [])],
      },
    ],
  };
  return stringify(withoutUndefined(config), { lineWidth: 0 });
}

function withoutUndefined(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutUndefined);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, withoutUndefined(v)]),
  );
}

/**
 * The embedded pool most tests run: `small-node` (2 slots, grace-time 60) on local `large-node` (no boot
 * delay, attributes zone and cores), with pool node-attributes; max-servers on either pool when given.
 */
export const baseConfig = (
  o: {
    slots?: number;
    grace?: number;
    maxServers?: number;
    backingMax?: number;
    /** min-ready of small-node (top-level labels). */
    minReady?: number;
    /** min-ready: auto on small-node, with these ready-target and max-ready. */
    readyAuto?: { readonly target?: number; readonly max?: number };
    maxAge?: number;
  } = {},
): string =>
  poolConfig({
    labels: o.readyAuto
      ? [
          { name: 'large-node' },
          {
            name: 'small-node',
            'min-ready': 'auto',
            'ready-target': o.readyAuto.target,
            'max-ready': o.readyAuto.max,
          },
        ]
      : o.minReady === undefined
        ? undefined
        : [{ name: 'large-node' }, { name: 'small-node', 'min-ready': o.minReady }],
    backing: {
      pool: { 'max-servers': o.backingMax },
      labels: [largeNode({ 'boot-delay': 0, attributes: { zone: 'local-a', cores: 8 } })],
    },
    meta: {
      pool: { 'max-servers': o.maxServers, 'node-attributes': { cores: 2, team: 'ci' } },
      labels: [
        smallNode({ 'max-parallel-jobs': o.slots ?? 2, 'grace-time': o.grace ?? 60, 'max-age': o.maxAge }),
      ],
    },
  });

/**
 * The smallest embedded pool: label `small` (metastatic) packed onto local backing label `large`, for
 * tests about the stack around the pool rather than about placement.
 */
export const smallOnLarge = (o: { maxParallelJobs?: number; maxServers?: number } = {}): string =>
  poolConfig({
    backing: { pool: { 'max-servers': o.maxServers }, labels: [{ name: 'large' }] },
    meta: {
      labels: [{ name: 'small', 'backing-label': 'large', 'max-parallel-jobs': o.maxParallelJobs ?? 2 }],
    },
  });
