import { requestOfNode } from '../client/records.ts';
import type { BackingRecord } from '../shared/core/records.ts';
import { terminalValue } from './terminal.ts';

/** The JSON shapes the CLI prints with --json: the client library's (client/records.ts), one definition. */
export { toPoolNode as nodeJson, toPoolRequest as requestJson } from '../client/records.ts';
export { requestOfNode };

export function backingJson(b: BackingRecord) {
  return {
    id: b.id,
    label: b.label,
    state: b.state,
    slots: b.slots,
    usedSlots: b.used,
    host: b.host ?? null,
    port: b.port ?? null,
    launchedAt: new Date(b.launchedAt).toISOString(),
    lastUsedAt: new Date(b.lastUsedAt).toISOString(),
    pool: b.poolKey,
    backingLabel: b.backingLabel,
    resourceId: b.resourceId ?? null,
    ...(b.drained ? { drained: true } : {}),
    ...(b.reason ? { reason: b.reason } : {}),
  };
}

/** An aligned text table; columns are padded to their widest cell. */
export function table(headers: readonly string[], rows: readonly (readonly unknown[])[]): string {
  const cells = [
    headers,
    // Escaped per cell (a newline or tab in a value too: it would print a forged row), before padding, so
    // a cell's width is what the terminal shows.
    ...rows.map((r) => r.map((c) => (c === undefined || c === null ? '-' : terminalValue(String(c))))),
  ];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells
    .map((r) =>
      r
        .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

export function ago(ms: number, now: number): string {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  return `${Math.round(s / 3600)}h ago`;
}
