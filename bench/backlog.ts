/**
 * Part 7: the pool under a backlog of waiting requests (issue 25, defect 2). One `EmbeddedPool` with its
 * queue pollers running, as `metastatic dev` runs it (visibility timeout 2 s), and two metastatic pools
 * on one local backing node: `main` (label `small-node`, 64 slots, no cap) and `capped` (label
 * `tiny-node`, `max-servers: 1`, held by one request, so every other `tiny-node` request waits).
 *
 * Figures:
 *   - receives per second with BACKLOG requests waiting / with none: a burst of BURST `small-node`
 *     requests (each placed at its first receive, on a free slot) sent at once, timed from the send to the
 *     last one's fulfilled write; the rate is BURST / that time. Measured with nothing waiting, then
 *     again once BACKLOG `tiny-node` requests wait (each recorded `requested`, its message coming back).
 *     The burst is what the backlog slows down: every waiting message's receive competes with it for the
 *     one process (its CPU and the request queue's poller).
 *   - a waiting request's wall time before it ends / the waiting budget: the pool runs with a waiting
 *     budget of BUDGET_S seconds (the bench's own, to stay short; `metastatic dev`'s is 100 s); each of a
 *     sample of the waiting requests is timed from its send to its `failed` write.
 *   - from room freed to a waiting request placed: after the budget sample, one more `tiny-node` request
 *     waits long enough for its message's visibility to back off fully; then the blocker is released
 *     (the hand-off places the first waiting request at once), and, separately, room is freed without a
 *     release (the blocker's node failed by the operator), which only the waiting request's own next
 *     receive notices.
 *
 *   npx tsx bench/backlog.ts      (this part alone; `npm run bench` runs it with the others)
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { SendMessageBatchCommand } from '@aws-sdk/client-sqs';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { EmbeddedPool } from '../shared/runtime/embeddedPool.ts';
import { releaseNode } from '../shared/usecases/release/release.ts';
import { largeNode, poolConfig, smallNode } from '../testkit/configs.ts';
import { log, round, sleep, table, yesNo } from './common.ts';

export const BACKLOG = {
  /** Requests left waiting. */
  waiting: 400,
  /** Placeable requests timed, with and without the backlog. */
  burst: 50,
  /** The bench pool's waiting budget, seconds (short, so that the part is). */
  budgetS: 20,
  /** How long each request of the room-freed figures waits before room is freed, seconds. */
  lateWaitS: 5,
  /** Aims. */
  aimRatio: 0.5,
  aimBudget: 0.1,
} as const;

export interface BacklogFigures {
  readonly waiting: number;
  readonly burst: number;
  readonly budgetS: number;
  /** Burst rate (requests handled per second) with nothing waiting, and with the backlog. */
  readonly burstPerSecondIdle: number;
  readonly burstPerSecondBacklog: number;
  readonly ratio: number;
  /** Every receive of the request queue per second while the backlog waited (its own included). */
  readonly receivesPerSecondBacklog: number;
  /** Every waiting request: wall time from its first record to its end, seconds; and / the budget. */
  readonly endWallS: { readonly min: number; readonly median: number; readonly max: number };
  readonly endRatio: { readonly min: number; readonly max: number };
  /** Waiting requests not ended when the part gave up waiting (3 x the budget + 60 s). */
  readonly notEnded: number;
  /** The same from each request's send (its first receive comes later when the pool is busy). */
  readonly sendToEndS: { readonly min: number; readonly max: number };
  /** Their reasons (one of each). */
  readonly reasons: readonly string[];
  /** A waiting request placed after a release (hand-off) and after room freed without one, ms. */
  readonly freedToPlacedMs: { readonly release: number; readonly noRelease: number };
  readonly ratioMet: boolean;
  readonly budgetMet: boolean;
}

const CONFIG = poolConfig({
  backing: { labels: [largeNode({ 'boot-delay': 0 })] },
  meta: {
    labels: [smallNode({ 'max-parallel-jobs': 64, 'grace-time': 86400 })],
    morePools: [
      {
        name: 'capped',
        'max-servers': 1,
        labels: [smallNode({ name: 'tiny-node', 'max-parallel-jobs': 64, 'grace-time': 86400 })],
      },
    ],
  },
});

/** Watches the pool's table writes: when each request was last written, and in which state. */
class Writes {
  readonly at = new Map<string, { state: string; at: number; reason?: string }>();
  /** When each request was first written (recorded waiting, for a waiting request). */
  readonly first = new Map<string, number>();
  private readonly waiters: Array<{ check: () => boolean; resolve: () => void }> = [];
  receives = 0;

  constructor(pool: EmbeddedPool) {
    pool.dynamodb.middlewareStack.add(
      (next, context) => async (args) => {
        const out = await next(args);
        const name = context.commandName ?? '';
        const item = (args.input as { Item?: Record<string, unknown> }).Item;
        if (name === 'PutCommand' || name === 'PutItemCommand') {
          if (item?.sk === 'REQUEST' && typeof item.state === 'string') {
            const reason = typeof item.reason === 'string' ? item.reason : undefined;
            const now = performance.now();
            if (!this.first.has(String(item.id))) this.first.set(String(item.id), now);
            this.at.set(String(item.id), { state: item.state, at: now, reason });
            this.wake();
          }
        }
        return out;
      },
      { step: 'initialize', name: 'benchBacklogWrites' },
    );
    pool.sqs.middlewareStack.add(
      (next, context) => async (args) => {
        const out = await next(args);
        if (context.commandName === 'ReceiveMessageCommand') {
          const input = args.input as { QueueUrl?: string };
          const messages = (out.output as { Messages?: unknown[] }).Messages ?? [];
          if (input.QueueUrl === pool.info.requestQueueUrl) this.receives += messages.length;
        }
        return out;
      },
      { step: 'initialize', name: 'benchBacklogReceives' },
    );
  }

  state(id: string): string | undefined {
    return this.at.get(id)?.state;
  }

  /** Resolves once every id is in one of `states` (or rejects after `ms`). */
  async until(ids: readonly string[], states: readonly string[], ms: number): Promise<void> {
    const check = () => ids.every((id) => states.includes(this.state(id) ?? ''));
    if (check()) return;
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`not ${states.join('/')} within ${ms} ms`)), ms);
      this.waiters.push({
        check,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      });
    });
  }

  private wake(): void {
    for (let i = this.waiters.length - 1; i >= 0; i--) {
      const w = this.waiters[i];
      if (w?.check()) {
        this.waiters.splice(i, 1);
        w.resolve();
      }
    }
  }
}

async function sendAll(pool: EmbeddedPool, bodies: readonly object[]): Promise<void> {
  for (let i = 0; i < bodies.length; i += 10) {
    await pool.sqs.send(
      new SendMessageBatchCommand({
        QueueUrl: pool.info.requestQueueUrl,
        Entries: bodies.slice(i, i + 10).map((b, j) => ({ Id: String(j), MessageBody: JSON.stringify(b) })),
      }),
    );
  }
}

const request = (id: string, label: string) => ({ kind: 'request', id, labels: [label] });
const release = (id: string) => ({ kind: 'release', id });

/** Sends BURST small-node requests at once; requests per second until the last is fulfilled. */
async function burstRate(pool: EmbeddedPool, writes: Writes, tag: string): Promise<number> {
  const ids = Array.from({ length: BACKLOG.burst }, (_, i) => `burst-${tag}-${i}`);
  const t0 = performance.now();
  await sendAll(
    pool,
    ids.map((id) => request(id, 'small-node')),
  );
  await writes.until(ids, ['fulfilled'], 120_000);
  const last = Math.max(...ids.map((id) => writes.at.get(id)?.at ?? t0));
  const rate = BACKLOG.burst / ((last - t0) / 1000);
  await sendAll(pool, ids.map(release));
  // Released through the node items (UpdateItem): read back until every one is.
  for (const limit = performance.now() + 120_000; performance.now() < limit; await sleep(200)) {
    const states = await Promise.all(ids.map((id) => pool.context.store.getRequest(id)));
    if (states.every((r) => r?.nodes.every((n) => n.state === 'released'))) break;
  }
  return rate;
}

export async function measureBacklog(progress: (line: string) => void = () => {}): Promise<BacklogFigures> {
  const stateDir = await mkdtemp(join(tmpdir(), 'metastatic-bench-backlog-'));
  const pool = await EmbeddedPool.start({
    config: parseConfigOrThrow(CONFIG, 'bench-backlog.yaml'),
    stateDir,
    reaperInterval: 3600,
    log,
    inMemory: true,
    waitingBudgetSeconds: BACKLOG.budgetS,
  });
  try {
    const writes = new Writes(pool);
    progress(`backlog: priming the backing node, holding the capped pool's one place...`);
    await sendAll(pool, [request('prime', 'small-node')]);
    await writes.until(['prime'], ['fulfilled'], 60_000);
    await sendAll(pool, [request('blocker', 'tiny-node')]);
    await writes.until(['blocker'], ['fulfilled'], 60_000);
    // Warm-up (JIT, the first writes of each kind), then the burst with nothing waiting.
    await burstRate(pool, writes, 'warm');
    const idle = await burstRate(pool, writes, 'idle');
    progress(`backlog: ${BACKLOG.burst} requests at ${idle.toFixed(1)}/s with nothing waiting`);

    const waiting = Array.from({ length: BACKLOG.waiting }, (_, i) => `wait-${i}`);
    const sentAt = new Map<string, number>();
    const t0 = performance.now();
    for (let i = 0; i < waiting.length; i += 10) {
      const ids = waiting.slice(i, i + 10);
      await sendAll(
        pool,
        ids.map((id) => request(id, 'tiny-node')),
      );
      const at = performance.now();
      for (const id of ids) sentAt.set(id, at);
    }
    await writes.until(waiting, ['requested', 'failed'], 120_000);
    progress(
      `backlog: ${BACKLOG.waiting} requests waiting (${((performance.now() - t0) / 1000).toFixed(1)} s to record)`,
    );
    const receives0 = writes.receives;
    const r0 = performance.now();
    const busy = await burstRate(pool, writes, 'backlog');
    const receivesPerSecond = (writes.receives - receives0) / ((performance.now() - r0) / 1000);
    progress(`backlog: ${BACKLOG.burst} requests at ${busy.toFixed(1)}/s with ${BACKLOG.waiting} waiting`);

    // Every waiting request ends at its budget, counted from its first record (its `requested` write).
    await writes.until(waiting, ['failed'], (BACKLOG.budgetS * 3 + 60) * 1000).catch(() => undefined);
    const ended = waiting.filter((id) => writes.state(id) === 'failed');
    const sorted = (xs: number[]) => xs.sort((a, b) => a - b);
    const walls = sorted(
      ended.map((id) => ((writes.at.get(id)?.at ?? 0) - (writes.first.get(id) ?? 0)) / 1000),
    );
    const fromSend = sorted(ended.map((id) => ((writes.at.get(id)?.at ?? 0) - (sentAt.get(id) ?? 0)) / 1000));
    const reasons = [...new Set(ended.map((id) => (writes.at.get(id)?.reason ?? '').replace(/\d+/g, 'N')))];
    progress(`backlog: ${ended.length}/${waiting.length} ended`);

    const freed = await freedToPlaced(pool, writes, progress);
    const endRatio = {
      min: round((walls[0] ?? Number.NaN) / BACKLOG.budgetS, 3),
      max: round((walls[walls.length - 1] ?? Number.NaN) / BACKLOG.budgetS, 3),
    };
    const ratio = busy / idle;
    return {
      waiting: BACKLOG.waiting,
      burst: BACKLOG.burst,
      budgetS: BACKLOG.budgetS,
      burstPerSecondIdle: round(idle, 2),
      burstPerSecondBacklog: round(busy, 2),
      ratio: round(ratio, 3),
      receivesPerSecondBacklog: round(receivesPerSecond, 2),
      endWallS: {
        min: round(walls[0] ?? Number.NaN, 2),
        median: round(walls[Math.floor(walls.length / 2)] ?? Number.NaN, 2),
        max: round(walls[walls.length - 1] ?? Number.NaN, 2),
      },
      endRatio,
      notEnded: waiting.length - ended.length,
      sendToEndS: {
        min: round(fromSend[0] ?? Number.NaN, 2),
        max: round(fromSend[fromSend.length - 1] ?? Number.NaN, 2),
      },
      reasons,
      freedToPlacedMs: freed,
      ratioMet: ratio >= BACKLOG.aimRatio,
      budgetMet:
        ended.length === waiting.length &&
        endRatio.min >= 1 - BACKLOG.aimBudget &&
        endRatio.max <= 1 + BACKLOG.aimBudget,
    };
  } finally {
    await pool.stop();
    await rm(stateDir, { recursive: true, force: true });
  }
}

/**
 * One request waits until its message backed off fully (most of the budget); the blocker is released:
 * the time until it is placed (the hand-off). Then another waits as long, and room is freed with no
 * release (its holder's request failed by hand, as the reaper ends a lapsed one): the time until its own
 * receive places it.
 */
async function freedToPlaced(
  pool: EmbeddedPool,
  writes: Writes,
  progress: (line: string) => void,
): Promise<{ release: number; noRelease: number }> {
  const waitMs = BACKLOG.lateWaitS * 1000;
  progress(
    `backlog: timing a waiting request placed after room is freed (${(waitMs / 1000).toFixed(0)} s waits)...`,
  );
  await sendAll(pool, [request('late-1', 'tiny-node')]);
  await writes.until(['late-1'], ['requested'], 30_000);
  await sleep(waitMs);
  const t1 = performance.now();
  await sendAll(pool, [release('blocker')]);
  await writes.until(['late-1'], ['fulfilled', 'failed'], 60_000).catch(() => undefined);
  const release1 = (writes.at.get('late-1')?.at ?? Number.NaN) - t1;

  await sendAll(pool, [request('late-2', 'tiny-node')]);
  await writes.until(['late-2'], ['requested'], 30_000);
  await sleep(waitMs);
  // Room freed without a release message: late-1's node ends as a lapsed lease or a failed backing node
  // would end it (one write), so only late-2's own next receive can see it.
  const t2 = performance.now();
  await freeWithoutRelease(pool, 'late-1');
  await writes.until(['late-2'], ['fulfilled', 'failed'], 60_000).catch(() => undefined);
  const noRelease = (writes.at.get('late-2')?.at ?? Number.NaN) - t2;
  return { release: round(release1, 0), noRelease: round(noRelease, 0) };
}

/** Frees the place of request `id`'s node without a release message: its node is released directly. */
async function freeWithoutRelease(pool: EmbeddedPool, id: string): Promise<void> {
  const r = await pool.context.store.getRequest(id);
  const node = r?.nodes[0];
  if (node) await releaseNode(pool.context, node.id, true);
}

export function backlogReport(f: BacklogFigures): string {
  return [
    `Backlog: ${f.waiting} requests waiting, bursts of ${f.burst} placeable requests, waiting budget ${f.budgetS} s (bench)`,
    table(
      [
        ['burst, nothing waiting (requests/s)', f.burstPerSecondIdle.toFixed(1)],
        [`burst, ${f.waiting} waiting (requests/s)`, f.burstPerSecondBacklog.toFixed(1)],
        ['  ratio (aim >= 0.5)', f.ratio.toFixed(2)],
        ['request queue receives/s while they wait', f.receivesPerSecondBacklog.toFixed(1)],
        [
          'waiting request, recorded to end (s): min / median / max',
          `${f.endWallS.min} / ${f.endWallS.median} / ${f.endWallS.max}`,
        ],
        ['  / budget: min / max (aim 0.9-1.1)', `${f.endRatio.min} / ${f.endRatio.max}`],
        ['  from its send (s): min / max', `${f.sendToEndS.min} / ${f.sendToEndS.max}`],
        ['  not ended', String(f.notEnded)],
        ['  reasons', f.reasons.join(' | ')],
        ['room freed by a release -> waiting request placed (ms)', String(f.freedToPlacedMs.release)],
        [
          `room freed without a release -> placed (ms; waited ${BACKLOG.lateWaitS} s)`,
          String(f.freedToPlacedMs.noRelease),
        ],
      ],
      ['', 'measured'],
    ),
  ].join('\n');
}

export function backlogSummary(f: BacklogFigures) {
  return [
    {
      figure: `receives per second with ${f.waiting} requests waiting / with none`,
      measured: `${f.ratio.toFixed(2)} (${f.burstPerSecondBacklog.toFixed(1)} / ${f.burstPerSecondIdle.toFixed(1)} per s)`,
      aim: `>= ${BACKLOG.aimRatio}`,
      met: yesNo(f.ratioMet),
    },
    {
      figure: `waiting request's wall time before it ends / documented budget (bench budget ${f.budgetS} s)`,
      measured: `${f.endRatio.min.toFixed(2)}-${f.endRatio.max.toFixed(2)}${f.notEnded > 0 ? ` (${f.notEnded} not ended)` : ''}`,
      aim: `${1 - BACKLOG.aimBudget}-${1 + BACKLOG.aimBudget}`,
      met: yesNo(f.budgetMet),
    },
  ];
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const f = await measureBacklog((line) => console.log(line));
  console.log(backlogReport(f));
  console.log(JSON.stringify(f, null, 2));
  process.exit(0);
}
