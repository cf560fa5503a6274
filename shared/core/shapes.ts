import type { MetastaticLabel, MetastaticPool, ResolvedConfig, Shape } from './model.ts';
import { quote } from './text.ts';

/**
 * Requests by shape (Toil's and Arvados' way): a request may ask for what a node must give (cores,
 * memory, disk) instead of naming a label, and the pool picks the label whose slot fits at the lowest
 * cost per slot-hour. This module is the pure part: sizes, what fits, and the ranking of the labels that
 * could serve a node set; shared/usecases/place/shapes.ts adds the one thing that needs the table (preferring a
 * label with a free slot now when its cost is within the configured margin of the cheapest).
 */

/** Defined with the configuration (a label's slot is one), which sits below the core. */
export type { Shape };

/** The largest size a shape may name: 1 PiB, far above any machine's memory or disk. */
export const MAX_SIZE_MIB = 1024 ** 3;
/** The most cores a shape may name: above the largest cloud machines (448 vCPUs on EC2 in 2026). */
export const MAX_CORES = 1024;
/**
 * The fewest cores a shape may name: a thousandth of a core (Kubernetes' millicore). Anything smaller is
 * no shape, and below 1e-130 DynamoDB cannot even store it (a request by shape keeps its shapes).
 */
export const MIN_CORES = 0.001;

export const SIZE_PATTERN = /^(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|Pi|K|M|G|T|P)(B?)$/;
const BINARY: Record<string, number> = { Ki: 1 / 1024, Mi: 1, Gi: 1024, Ti: 1024 ** 2, Pi: 1024 ** 3 };
const DECIMAL: Record<string, number> = { K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15 };

/** The phrase every size check uses in its errors. */
export const SIZE_RULE =
  'a size with a unit, such as "4GiB", "512MiB" or "20G" (Ki/Mi/Gi/Ti binary, K/M/G/T decimal)';

/**
 * A size written with its unit, in MiB (fractions kept): binary units (`Gi`, `GiB`) are powers of 1024,
 * decimal ones (`G`, `GB`) powers of 1000, as Kubernetes reads them. Undefined when it is not a size.
 */
export function parseSize(text: string): number | undefined {
  const m = SIZE_PATTERN.exec(text.trim());
  if (!m) return undefined;
  const value = Number(m[1]);
  const unit = m[2] as string;
  const mib =
    unit in BINARY ? value * (BINARY[unit] as number) : (value * (DECIMAL[unit] as number)) / 1024 ** 2;
  return Number.isFinite(mib) ? mib : undefined;
}

/** A size in MiB as people write it: the largest binary unit that keeps it short. */
export function formatSize(mib: number): string {
  for (const [unit, scale] of [
    ['TiB', 1024 ** 2],
    ['GiB', 1024],
  ] as const) {
    if (mib >= scale) return `${+(mib / scale).toFixed(2)}${unit}`;
  }
  return `${+mib.toFixed(2)}MiB`;
}

/** `2 cores, 4GiB memory, 20GiB disk`: a shape in a reason or a table. */
export function describeShape(s: Shape): string {
  const parts = [
    s.cores === undefined ? undefined : `${s.cores} core${s.cores === 1 ? '' : 's'}`,
    s.memoryMiB === undefined ? undefined : `${formatSize(s.memoryMiB)} memory`,
    s.diskMiB === undefined ? undefined : `${formatSize(s.diskMiB)} disk`,
  ].filter((p) => p !== undefined);
  return parts.length > 0 ? parts.join(', ') : 'nothing known';
}

/** Whether a slot gives what a node needs: every dimension the node asks for is known on the slot and enough. */
export function fits(slot: Shape, need: Shape): boolean {
  const enough = (have: number | undefined, want: number | undefined) =>
    want === undefined || (have !== undefined && have >= want);
  return (
    enough(slot.cores, need.cores) &&
    enough(slot.memoryMiB, need.memoryMiB) &&
    enough(slot.diskMiB, need.diskMiB)
  );
}

/** A label of a pool that can serve a shape, with what one of its slots costs an hour (when known). */
export interface LabelOffer {
  readonly pool: MetastaticPool;
  readonly label: MetastaticLabel;
  readonly slotHourlyCost: number | undefined;
}

/**
 * Cheapest first: a known cost per slot-hour before an unknown one, then the smallest slot that fits
 * (least left idle: cores, then memory, then disk), then the label's name so the order never depends
 * on the file's.
 */
export function compareOffers(a: LabelOffer, b: LabelOffer): number {
  const ca = a.slotHourlyCost ?? Number.POSITIVE_INFINITY;
  const cb = b.slotHourlyCost ?? Number.POSITIVE_INFINITY;
  if (ca !== cb) return ca < cb ? -1 : 1;
  const sa = a.label.slot ?? {};
  const sb = b.label.slot ?? {};
  for (const key of ['cores', 'memoryMiB', 'diskMiB'] as const) {
    const d = (sa[key] ?? Number.POSITIVE_INFINITY) - (sb[key] ?? Number.POSITIVE_INFINITY);
    if (d !== 0 && !Number.isNaN(d)) return d;
  }
  return a.label.name < b.label.name ? -1 : a.label.name > b.label.name ? 1 : 0;
}

/** One pool's way to serve a node set of shapes: for each shape, its labels that fit, cheapest first. */
export interface PoolOffer {
  readonly pool: MetastaticPool;
  readonly perShape: readonly (readonly LabelOffer[])[];
  /** The node set's cost per hour on the cheapest labels; undefined when a cheapest one has no cost. */
  readonly hourlyCost: number | undefined;
}

export type ShapeOffers =
  | { readonly ok: true; readonly pools: readonly PoolOffer[] }
  | { readonly ok: false; readonly reason: string };

/**
 * The pools that can serve every shape of a node set (one pool serves a node set, as with labels), the
 * cheapest node set first, ties by the pools' priority. The reason, when none can, names the first shape
 * no label fits and what the labels offer, so the user can fix the request or the configuration.
 */
export function shapeOffers(config: ResolvedConfig, shapes: readonly Shape[]): ShapeOffers {
  const enabled = config.metastaticPools.filter(
    (p) =>
      (p.maxServers === undefined || p.maxServers > 0) && (p.maxServers ?? shapes.length) >= shapes.length,
  );
  const offersIn = (pool: MetastaticPool, need: Shape): LabelOffer[] =>
    [...pool.labels.values()]
      .filter((l) => l.slot !== undefined && fits(l.slot, need))
      .map((label) => ({ pool, label, slotHourlyCost: label.slotHourlyCost }))
      .sort(compareOffers);
  const pools: PoolOffer[] = [];
  for (const pool of enabled) {
    const perShape = shapes.map((s) => offersIn(pool, s));
    if (perShape.some((o) => o.length === 0)) continue;
    const costs = perShape.map((o) => o[0]?.slotHourlyCost);
    const hourlyCost = costs.every((c) => c !== undefined)
      ? costs.reduce<number>((sum, c) => sum + (c as number), 0)
      : undefined;
    pools.push({ pool, perShape, hourlyCost });
  }
  if (pools.length > 0) {
    // Stable sort: equal costs keep the pools' priority order.
    pools.sort(
      (a, b) => (a.hourlyCost ?? Number.POSITIVE_INFINITY) - (b.hourlyCost ?? Number.POSITIVE_INFINITY) || 0,
    );
    return { ok: true, pools };
  }
  return { ok: false, reason: noFitReason(config, enabled, shapes) };
}

function noFitReason(
  config: ResolvedConfig,
  enabled: readonly MetastaticPool[],
  shapes: readonly Shape[],
): string {
  const offered = config.metastaticPools.flatMap((p) =>
    [...p.labels.values()]
      .filter((l) => l.slot !== undefined)
      .map((l) => `${quote(l.name)} (${describeShape(l.slot as Shape)})`),
  );
  const what =
    offered.length > 0
      ? `labels with a slot shape: ${[...new Set(offered)].slice(0, 5).join('; ')}`
      : 'no label declares a slot shape (cores, memory, disk)';
  if (enabled.length === 0) return `no enabled pool can serve a node set of ${shapes.length}; ${what}`;
  const alone = shapes.findIndex(
    (s) => !enabled.some((p) => [...p.labels.values()].some((l) => l.slot && fits(l.slot, s))),
  );
  if (alone >= 0) {
    return `no label's slot fits shape ${alone + 1} (${describeShape(shapes[alone] as Shape)}); ${what}`;
  }
  return `no pool has labels that fit all ${shapes.length} shapes together; ${what}`;
}

/** A cost per hour, in the configuration's currency unit, to 4 decimals at most. */
export function formatCost(cost: number): string {
  return `${+cost.toFixed(4)}`;
}
