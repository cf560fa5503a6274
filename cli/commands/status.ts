import { open } from 'node:fs/promises';
import { isSpareRequestId } from '../../shared/core/minReady.ts';
import type { BackingRecord, RequestRecord } from '../../shared/core/records.ts';
import { connect, type PoolClient, type Target } from '../client.ts';
import { ago, table } from '../format.ts';
import { isLive } from '../output.ts';
import { terminalJson, terminalText } from '../terminal.ts';

/** How many of the newest events `status` shows (and reads: the tail of events.jsonl, never the whole file). */
const LAST_EVENTS = 6;
const EVENTS_TAIL_BYTES = 64 * 1024;
/** The widest slot bar; a backing node with more slots gets a scaled one. */
const BAR_CELLS = 16;

/** One label's nodes and capacity. */
export interface LabelStatus {
  readonly label: string;
  readonly nodesReady: number;
  readonly nodesPending: number;
  /** spares nobody took yet (ready or on their way); nodes that took one count as ready. */
  readonly minReady: number;
  readonly requestsWaiting: number;
  readonly backingNodes: number;
  readonly slotsUsed: number;
  readonly slots: number;
  /**
   * min-ready auto: the reaper's last decision: the forecast (arrivals a minute), the ready
   * slots wanted, the ready nodes held for them, and the free slots on backing nodes that run anyway
   * counted first. Absent for a label without one.
   */
  readonly readyAuto?: {
    readonly perMinute: number;
    readonly target: number;
    readonly held: number;
    readonly freeSlots: number;
    readonly decidedAt: string;
  };
}

/** What `status --json` prints (one object; with --watch, one per line). */
export interface PoolStatus {
  readonly at: string;
  readonly labels: LabelStatus[];
  readonly backing: Array<{
    id: string;
    label: string;
    backingLabel: string;
    state: string;
    usedSlots: number;
    slots: number;
    launchedAt: string;
    drained?: true;
  }>;
  readonly waiting: Array<{ id: string; labels: string[]; createdAt: string; nodesReady: number }>;
  /** The newest pool events, oldest first (embedded pool only: on AWS they go to EventBridge). */
  readonly events: Array<{ time: string; type: string; subject: string }> | null;
}

export interface StatusOptions {
  readonly watch?: boolean;
  /** Seconds between refreshes with --watch. */
  readonly interval: number;
  readonly json?: boolean;
}

/**
 * `metastatic status`: the pool on one screen. With --watch it refreshes in place like `top` on a terminal
 * (the screen is cleared and redrawn; Ctrl-C ends it), and prints one snapshot after another when the
 * output is not a terminal; with --json, one JSON object (per line with --watch).
 */
export async function status(target: Target, opts: StatusOptions): Promise<void> {
  const client = await connect(target);
  const tty = process.stdout.isTTY === true && !opts.json;
  let stopped = false;
  let wake = () => {};
  const stop = () => {
    stopped = true;
    wake();
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  // A resized terminal (SIGWINCH) is redrawn at once, to its new size.
  const resized = () => wake();
  if (opts.watch && tty) {
    process.stdout.on('resize', resized);
    process.stdout.write('\x1b[?25l'); // hide the cursor while redrawing
  }
  try {
    for (let first = true; first || (opts.watch && !stopped); first = false) {
      const snapshot = await poolStatus(client, Date.now());
      if (opts.json) {
        const text = JSON.stringify(snapshot, null, opts.watch ? undefined : 2);
        process.stdout.write(`${terminalJson(text)}\n`);
      } else {
        const text = terminalText(render(snapshot, Date.now(), opts.watch ? opts.interval : undefined));
        // On a terminal: home, draw the screen cut to the terminal (a taller one would scroll at every
        // redraw), clear what the previous one left. Elsewhere: one snapshot after another, whole.
        if (opts.watch && tty) {
          const screen = fitToTerminal(text, process.stdout.rows ?? 24, process.stdout.columns ?? 80);
          process.stdout.write(`\x1b[H${screen.replaceAll('\n', '\x1b[K\n')}\x1b[K\x1b[J`);
        } else process.stdout.write(`${first ? '' : '\n'}${text}\n`);
      }
      if (!opts.watch) break;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, opts.interval * 1000);
        wake = () => {
          clearTimeout(timer);
          resolve();
        };
        if (stopped) wake();
      });
    }
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    if (opts.watch && tty) {
      process.stdout.off('resize', resized);
      process.stdout.write('\x1b[?25h\n'); // the cursor back, below the screen
    }
    client.close();
  }
}

/** Reads the pool: backing nodes, requests and the newest events. */
export async function poolStatus(client: PoolClient, now: number): Promise<PoolStatus> {
  const [backing, requests, events] = await Promise.all([
    client.store.listBacking(),
    client.store.listRequests(),
    client.eventsFile ? lastEvents(client.eventsFile) : Promise.resolve(null),
  ]);
  const live = backing.filter((b) => b.state !== 'stopped').sort((a, b) => a.launchedAt - b.launchedAt);
  const waiting = requests
    .filter((r) => r.state === 'requested' && !isSpareRequestId(r.id))
    .sort((a, b) => a.createdAt - b.createdAt);
  const labels = await Promise.all(
    labelStatus(live, requests).map(async (l) => {
      const { hold } = await client.store.minReadyState(l.label);
      if (!hold) return l;
      const readyAuto = {
        perMinute: hold.perMinute,
        target: hold.target,
        held: hold.seats,
        freeSlots: hold.freeSlots,
        decidedAt: new Date(hold.at).toISOString(),
      };
      return { ...l, readyAuto };
    }),
  );
  return {
    at: new Date(now).toISOString(),
    labels,
    backing: live.map((b) => ({
      id: b.id,
      label: b.label,
      backingLabel: b.backingLabel,
      state: b.state,
      usedSlots: b.used,
      slots: b.slots,
      launchedAt: new Date(b.launchedAt).toISOString(),
      ...(b.drained ? { drained: true as const } : {}),
    })),
    waiting: waiting.map((r) => ({
      id: r.id,
      labels: r.labels,
      createdAt: new Date(r.createdAt).toISOString(),
      nodesReady: r.nodes.filter((n) => n.state === 'ready').length,
    })),
    events,
  };
}

function labelStatus(backing: readonly BackingRecord[], requests: readonly RequestRecord[]): LabelStatus[] {
  const labels = new Map<string, { -readonly [K in keyof LabelStatus]: LabelStatus[K] }>();
  const of = (label: string) => {
    let s = labels.get(label);
    if (!s) {
      s = {
        label,
        nodesReady: 0,
        nodesPending: 0,
        minReady: 0,
        requestsWaiting: 0,
        backingNodes: 0,
        slotsUsed: 0,
        slots: 0,
      };
      labels.set(label, s);
    }
    return s;
  };
  for (const b of backing) {
    const s = of(b.label);
    s.backingNodes++;
    s.slotsUsed += b.used;
    if (b.state === 'launching' || b.state === 'ready') s.slots += b.slots;
  }
  for (const r of requests) {
    if (isSpareRequestId(r.id)) {
      // The pool's own: a free one counts as min-ready; one in use is counted as the node that took it.
      const n = r.nodes[0];
      if (r.state === 'requested' || (n && isLive(n) && !n.takenBy)) of(r.labels[0] ?? '').minReady++;
      continue;
    }
    for (const n of r.nodes.filter(isLive)) {
      if (n.state === 'ready') of(n.label).nodesReady++;
      else of(n.label).nodesPending++;
    }
    if (r.state === 'requested') for (const label of new Set(r.labels)) of(label).requestsWaiting++;
  }
  return [...labels.values()].sort((a, b) => a.label.localeCompare(b.label));
}

/** The newest events of an embedded pool, from the tail of its events.jsonl. */
async function lastEvents(path: string): Promise<PoolStatus['events']> {
  let text: string;
  try {
    const file = await open(path, 'r');
    try {
      const { size } = await file.stat();
      const start = Math.max(0, size - EVENTS_TAIL_BYTES);
      const buf = Buffer.alloc(size - start);
      await file.read(buf, 0, buf.length, start);
      text = buf.toString('utf8');
      if (start > 0) text = text.slice(text.indexOf('\n') + 1); // drop the partial first line
    } finally {
      await file.close();
    }
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: NonNullable<PoolStatus['events']> = [];
  for (const line of text.split('\n').filter(Boolean).slice(-LAST_EVENTS)) {
    try {
      const e = JSON.parse(line) as {
        time?: string;
        'detail-type'?: string;
        detail?: Record<string, unknown>;
      };
      const d = e.detail ?? {};
      out.push({
        time: String(e.time ?? ''),
        type: String(e['detail-type'] ?? ''),
        subject: String(d.requestId ?? d.nodeId ?? d.backingNodeId ?? d.label ?? ''), // label: Ready Room Changed
      });
    } catch {
      // a line being written as we read: skipped
    }
  }
  return out;
}

/** A slot bar: `[██··]` for 2 of 4 slots used, scaled down past BAR_CELLS slots. */
export function slotBar(used: number, slots: number): string {
  const cells = Math.min(slots, BAR_CELLS);
  const full = slots === 0 ? 0 : Math.min(cells, Math.round((used / slots) * cells));
  return `[${'█'.repeat(full)}${'·'.repeat(cells - full)}]`;
}

/**
 * A screen cut to a terminal of `rows` x `columns`, as `top` does: at most `rows` lines, the last saying
 * how many more there are, and no line wider than the terminal (a wrapped line takes two rows). Drawn
 * from the top-left corner without a final newline, it never scrolls the terminal.
 */
export function fitToTerminal(text: string, rows: number, columns: number): string {
  let lines = text.split('\n');
  if (lines.length > rows) {
    const kept = Math.max(0, rows - 1);
    const more = lines.length - kept;
    lines = [
      ...lines.slice(0, kept),
      `… ${more} more line${more === 1 ? '' : 's'} (a taller terminal or --json shows them)`,
    ];
  }
  const width = Math.max(1, columns);
  return lines
    .map((line) => ([...line].length > width ? `${[...line].slice(0, width - 1).join('')}…` : line))
    .join('\n');
}

/** The one-screen text of a snapshot. */
export function render(s: PoolStatus, now: number, everySeconds?: number): string {
  const lines: string[] = [];
  const refresh = everySeconds === undefined ? '' : ` — every ${everySeconds}s, Ctrl-C to stop`;
  lines.push(`metastatic status at ${s.at.replace('T', ' ').replace(/\.\d+Z$/, 'Z')}${refresh}`, '');
  // The forecast column only when a label has min-ready: auto (a pool without one reads as before).
  const auto = s.labels.some((l) => l.readyAuto);
  lines.push(
    s.labels.length === 0
      ? 'no nodes, backing nodes or waiting requests'
      : table(
          [
            'LABEL',
            'READY',
            'PENDING',
            'MIN-READY',
            'WAITING',
            'BACKING',
            'SLOTS',
            ...(auto ? ['FORECAST (auto)'] : []),
          ],
          s.labels.map((l) => [
            l.label,
            l.nodesReady,
            l.nodesPending,
            l.minReady,
            l.requestsWaiting,
            l.backingNodes,
            `${l.slotsUsed}/${l.slots}`,
            ...(!auto
              ? []
              : l.readyAuto
                ? [
                    `${l.readyAuto.perMinute.toFixed(2)}/min: target ${l.readyAuto.target}, held ${l.readyAuto.held} + ${l.readyAuto.freeSlots} free`,
                  ]
                : ['-']),
          ]),
        ),
  );
  if (s.backing.length > 0) {
    lines.push('', 'BACKING NODES');
    lines.push(
      table(
        ['ID', 'LABEL', 'STATE', 'SLOTS', 'LAUNCHED'],
        s.backing.map((b) => [
          b.id,
          b.label,
          b.drained ? `${b.state} (drained)` : b.state,
          `${slotBar(b.usedSlots, b.slots)} ${b.usedSlots}/${b.slots}`,
          ago(Date.parse(b.launchedAt), now),
        ]),
      ),
    );
  }
  if (s.waiting.length > 0) {
    lines.push('', 'WAITING REQUESTS');
    lines.push(
      table(
        ['ID', 'LABELS', 'READY', 'SINCE'],
        s.waiting.map((r) => [
          r.id,
          r.labels.join(','),
          `${r.nodesReady}/${r.labels.length}`,
          ago(Date.parse(r.createdAt), now),
        ]),
      ),
    );
  }
  if (s.events && s.events.length > 0) {
    lines.push('', 'LAST EVENTS');
    lines.push(
      table(
        ['TIME', 'EVENT', 'ID'],
        s.events.map((e) => [e.time.slice(11, 19), e.type, e.subject]),
      ),
    );
  }
  return lines.join('\n');
}
