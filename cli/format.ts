import { parseNodeId } from '../shared/core/ids.ts';
import { isSpareRequestId } from '../shared/core/minReady.ts';
import type { BackingRecord, NodeRecord, RequestRecord } from '../shared/core/records.ts';
import { terminalText } from './terminal.ts';

/** The request a node serves: undefined for a min-ready node (the pool's own, core/minReady.ts). */
export function requestOfNode(n: NodeRecord): string | undefined {
  const requestId = parseNodeId(n.id)?.requestId;
  return requestId === undefined || isSpareRequestId(requestId) ? undefined : requestId;
}

/** The JSON shapes the CLI prints with --json: a public API for scripts (documented in docs/cli.md). */
export function nodeJson(n: NodeRecord) {
  return {
    id: n.id,
    label: n.label,
    state: n.state,
    /** null for a min-ready node: it serves no request (yet). */
    request: requestOfNode(n) ?? null,
    backingNodeId: n.backingNodeId ?? null,
    slot: n.slot ?? null,
    host: n.host ?? null,
    port: n.port ?? null,
    username: n.username ?? null,
    attributes: n.attributes ?? {},
    hostKeys: n.hostKeys ?? [],
    ...(n.held ? { held: true } : {}),
    ...(n.reason ? { reason: n.reason } : {}),
    /** A node on a min-ready node's slot: that node; a min-ready node in use: the node using it. */
    ...(n.spare ? { minReadyNode: n.spare } : {}),
    ...(n.takenBy ? { takenBy: n.takenBy.node } : {}),
  };
}

export function requestJson(r: RequestRecord) {
  return {
    id: r.id,
    state: r.state,
    labels: r.labels,
    ...(r.shapes ? { shapes: r.shapes } : {}),
    nodes: r.nodes.map(nodeJson),
    ...(r.reason ? { reason: r.reason } : {}),
  };
}

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
    // Escaped per cell, before padding, so a cell's width is what the terminal shows.
    ...rows.map((r) => r.map((c) => (c === undefined || c === null ? '-' : terminalText(String(c))))),
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
