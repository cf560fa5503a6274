/**
 * Helpers shared by the benchmark's parts (bench/allocation.bench.ts runs them all): statistics,
 * text tables, a quiet logger, and ready backing records built without any provider.
 */

import type { Log } from '../shared/core/log.ts';
import type { BackingRecord } from '../shared/core/records.ts';

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Linear-interpolated quantile (q in [0, 1]) of unsorted numbers. */
export function quantile(values: readonly number[], q: number): number {
  const s = [...values].sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return (s[lo] as number) + ((s[hi] as number) - (s[lo] as number)) * (pos - lo);
}

export const median = (values: readonly number[]) => quantile(values, 0.5);

export interface Summary {
  readonly median: number;
  readonly p90: number;
  readonly n: number;
}

export const round = (x: number, digits = 3) => Math.round(x * 10 ** digits) / 10 ** digits;

export const summarize = (values: readonly number[]): Summary => ({
  median: round(quantile(values, 0.5)),
  p90: round(quantile(values, 0.9)),
  n: values.length,
});

/** Logs only warnings and errors (to stderr): the stack's info logging would swamp the output. */
export const log: Log = {
  debug() {},
  info() {},
  warn: (message, ...extra) => console.error(`[warn] ${message}`, ...extra),
  error: (message, ...extra) => console.error(`[error] ${message}`, ...extra),
};

/** A text table: first column left-aligned, the others right-aligned. */
export function table(rows: readonly (readonly string[])[], header: readonly string[]): string {
  const all = [header, ...rows];
  const widths = header.map((_, c) => Math.max(...all.map((r) => (r[c] ?? '').length)));
  const line = (r: readonly string[]) =>
    r
      .map((cell, c) => (c === 0 ? cell.padEnd(widths[c] ?? 0) : cell.padStart(widths[c] ?? 0)))
      .join('   ')
      .trimEnd();
  const rule = widths.map((w) => '-'.repeat(w)).join('   ');
  return [line(header), rule, ...rows.map(line)].join('\n');
}

export const fmtMs = (s: Summary) => `${s.median.toFixed(2)} / ${s.p90.toFixed(2)}`;
export const yesNo = (ok: boolean) => (ok ? 'yes' : 'NO');

/** Runs `f` over `items` with at most `limit` calls in flight. */
export async function inParallel<T>(
  items: readonly T[],
  limit: number,
  f: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= items.length) return;
      await f(items[i] as T, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

/**
 * A ready backing node record as the fulfil flow leaves it, with `used` slots held by filler nodes
 * (node ids that belong to no request: nothing ever releases them), so no provider is needed.
 */
export function readyBacking(args: {
  id: string;
  poolKey: string;
  label: string;
  backingPoolKey: string;
  backingLabel: string;
  slots: number;
  used: number;
  launchedAt: number;
}): BackingRecord {
  const slotMap: Record<string, string> = {};
  for (let s = 0; s < args.used; s++) slotMap[String(s)] = `filler-${args.id}/${s}`;
  const n = Number.parseInt(args.id.replace(/\D/g, '') || '0', 10);
  return {
    id: args.id,
    poolKey: args.poolKey,
    label: args.label,
    backingPoolKey: args.backingPoolKey,
    backingLabel: args.backingLabel,
    state: 'ready',
    slots: args.slots,
    used: args.used,
    slotMap,
    version: 0,
    attempt: 1,
    resourceId: `bench-resource-${args.id}`,
    host: `10.0.${Math.floor(n / 250) % 250}.${(n % 250) + 1}`,
    port: 22,
    attributes: { zone: 'bench-a', cores: 16 },
    launchedAt: args.launchedAt,
    readyAt: args.launchedAt + 30_000,
    runningAt: args.launchedAt + 25_000,
    lastUsedAt: args.launchedAt + 30_000,
  };
}
