import { DynamoDBDocumentClient, PutCommand } from '@aws-sdk/lib-dynamodb';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { requestedRecord } from '../../shared/core/request.ts';
import { QUEUE_FORGET_MS } from '../../shared/core/waitingQueue.ts';
import { keys, waitingSortKey } from '../../shared/store/table.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import {
  requestMessageOf,
  requestTimeoutReason,
  waitingRequests,
} from '../../shared/usecases/place/waiting.ts';
import { largeNode, poolConfig, smallNode } from '../../testkit/configs.ts';
import { type Harness, readyNode, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * A request waiting for capacity lives on through its message; when the message is gone (the embedded
 * stack's queue died with its process, issue 10 defect 6), the reaper ends it once its request-timeout
 * has passed: label, else pool, else provider, the most specific wins. On dynalite, through the real
 * request handler and reaper.
 */
let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

/**
 * One backing node may run (local/main max-servers 1) and it has one slot, so once `blocker` holds it
 * every other request waits. small-node sets request-timeout on the label (30 s), mid-node inherits its
 * pool's (120 s), big-node (another pool) its provider's (300 s).
 */
const CONFIG = poolConfig({
  backing: { pool: { 'max-servers': 1 }, labels: [largeNode({ 'boot-delay': 0 })] },
  meta: {
    provider: { 'request-timeout': 300 },
    pool: { 'request-timeout': 120 },
    labels: [
      smallNode({ 'max-parallel-jobs': 1, 'request-timeout': 30 }),
      smallNode({ name: 'mid-node', 'max-parallel-jobs': 1 }),
    ],
    morePools: [{ name: 'other', labels: [smallNode({ name: 'big-node', 'max-parallel-jobs': 1 })] }],
  },
});

const body = (id: string, labels: string[]) => JSON.stringify({ kind: 'request', id, labels });

/** Delivers a request once (first receive): with no room it is recorded waiting and its message fails. */
async function waitOnce(harness: Harness, id: string, labels: string[]): Promise<void> {
  const out = await harness.pool.handlers.request(sqsEvent([body(id, labels)], 1));
  expect(out.batchItemFailures).toHaveLength(1); // comes back later... or, here, never: the message is gone
  expect((await harness.pool.context.store.getRequest(id))?.state).toBe('requested');
}

/** The DynamoDB commands the stack's client sends while `work` runs, with their index and partition. */
async function commandsDuring(harness: Harness, work: () => Promise<unknown>): Promise<string[]> {
  const seen: string[] = [];
  const name = `spy-${Math.random()}`;
  harness.pool.dynamodb.middlewareStack.add(
    (next, context) => async (args) => {
      const input = args.input as { IndexName?: string; ExpressionAttributeValues?: Record<string, unknown> };
      const partition = JSON.stringify(input.ExpressionAttributeValues?.[':p'] ?? '');
      seen.push(`${context.commandName} ${input.IndexName ?? ''} ${partition}`);
      return next(args);
    },
    { step: 'initialize', name },
  );
  try {
    await work();
  } finally {
    harness.pool.dynamodb.middlewareStack.remove(name);
  }
  return seen;
}

describe('request-timeout', () => {
  it('resolves the most specific setting: label, else pool, else provider (default 10800 s)', () => {
    const config = parseConfigOrThrow(CONFIG, 'waiting.yaml');
    const [main, other] = config.metastaticPools;
    expect(main?.labels.get('small-node')?.requestTimeout).toBe(30);
    expect(main?.labels.get('mid-node')?.requestTimeout).toBe(120);
    expect(other?.labels.get('big-node')?.requestTimeout).toBe(300);
    const plain = parseConfigOrThrow(CONFIG.replace(/ *request-timeout: \d+\n/g, ''), 'plain.yaml');
    expect(plain.metastaticPools[0]?.labels.get('small-node')?.requestTimeout).toBe(10_800);
    expect(() =>
      parseConfigOrThrow(CONFIG.replace('request-timeout: 300', 'request-timeout: 604801'), 'x.yaml'),
    ).toThrow(/request-timeout: expected a number of seconds > 0 and <= 604800, got 604801/);
  });

  it('ends waiting requests whose message is gone once their request-timeout passed, never before, without a Scan', async () => {
    h = await startHarness(CONFIG);
    const store = h.pool.context.store;
    await h.send({ kind: 'request', id: 'blocker', labels: ['small-node'] });
    await h.drainRequests(); // holds the only backing node
    await waitOnce(h, 'small', ['small-node']);
    await waitOnce(h, 'mid', ['mid-node']);
    await waitOnce(h, 'big', ['big-node']);
    await waitOnce(h, 'set', ['small-node', 'mid-node']); // waits for the longest of its labels: 120 s
    expect((await waitingRequests(h.pool.context)).map((r) => r.id).sort()).toEqual([
      'big',
      'mid',
      'set',
      'small',
    ]);

    h.clock.advance(29_999);
    expect((await h.pool.reapNow()).expiredRequests).toEqual([]);
    h.clock.advance(1);
    let report = await h.pool.reapNow();
    expect(report.expiredRequests).toEqual(['small']);
    const small = await store.getRequest('small');
    expect(small).toMatchObject({ state: 'failed', reason: requestTimeoutReason(30, 30_000) });
    expect(small?.nodes).toEqual([
      expect.objectContaining({ state: 'failed', reason: requestTimeoutReason(30, 30_000) }),
    ]);

    h.clock.advance(90_000); // 120 s
    const harness = h;
    const commands = await commandsDuring(harness, async () => {
      report = await harness.pool.reapNow();
    });
    expect(report.expiredRequests.sort()).toEqual(['mid', 'set']);
    expect(commands.filter((c) => c.startsWith('ScanCommand'))).toEqual([]);
    expect(commands).toContain('QueryCommand reap "WAITING"');

    h.clock.advance(180_000); // 300 s
    expect((await h.pool.reapNow()).expiredRequests).toEqual(['big']);
    expect((await h.pool.reapNow()).expiredRequests).toEqual([]); // ended once
    expect(await waitingRequests(h.pool.context)).toEqual([]);
    expect((await store.getRequest('blocker'))?.state).not.toBe('failed'); // placed: no request-timeout
  });

  it('moves a request an earlier version recorded waiting to its queue, and forgets a queue left empty (issue 24)', async () => {
    h = await startHarness(CONFIG);
    const ctx = h.pool.context;
    await h.send({ kind: 'request', id: 'blocker', labels: ['small-node'] });
    await h.drainRequests();
    // As an earlier version wrote a waiting request: in the one WAITING partition, by creation time.
    const old = requestedRecord(
      { kind: 'request', id: 'old', labels: ['small-node'] },
      h.clock.now() - 1_000,
    );
    await DynamoDBDocumentClient.from(h.pool.dynamodb).send(
      new PutCommand({
        TableName: h.pool.info.tableName,
        Item: {
          ...keys.request('old'),
          type: 'request',
          ...old,
          rpk: 'WAITING',
          rsk: waitingSortKey(old.createdAt, 'old'),
        },
      }),
    );
    expect((await h.pool.reapNow()).expiredRequests).toEqual([]);
    expect((await ctx.store.legacyWaiting()).items).toEqual([]);
    // In its queue now, where a newer request for the same room finds it ahead.
    await expect(requestNodes(ctx, { kind: 'request', id: 'new', labels: ['small-node'] })).rejects.toThrow(
      'request old (priority 100) waits ahead of this one',
    );
    expect((await waitingRequests(ctx)).map((r) => r.id)).toEqual(['old', 'new']);

    h.clock.advance(30_000);
    expect((await h.pool.reapNow()).expiredRequests.sort()).toEqual(['new', 'old']);
    expect((await ctx.store.waitingQueues()).map((q) => q.labels)).toEqual([['small-node']]); // announced lately
    h.clock.advance(QUEUE_FORGET_MS);
    await h.pool.reapNow();
    expect(await ctx.store.waitingQueues()).toEqual([]);
    // A request that waits again announces its queue again.
    await waitOnce(h, 'again', ['small-node']);
    expect((await ctx.store.waitingQueues()).map((q) => q.labels)).toEqual([['small-node']]);
  });

  it('makes a delivery that comes after the end a duplicate that holds nothing', async () => {
    h = await startHarness(CONFIG);
    await readyNode(h, 'blocker');
    await waitOnce(h, 'late', ['mid-node']);
    h.clock.advance(120_000);
    expect((await h.pool.reapNow()).expiredRequests).toEqual(['late']);
    await h.send({ kind: 'release', nodeId: 'blocker/0' }); // room now
    await h.drainRequests();
    const out = await requestNodes(h.pool.context, { kind: 'request', id: 'late', labels: ['mid-node'] });
    expect(out.kind).toBe('duplicate');
    expect(out.request.state).toBe('failed');
    for (const b of await h.pool.context.store.listBacking()) {
      expect(Object.values(b.slotMap)).not.toContain('late/0');
    }
  });

  it('gives back the message that re-queues a waiting request under its id', async () => {
    h = await startHarness(CONFIG);
    await readyNode(h, 'blocker');
    await h.pool.handlers.request(
      sqsEvent([
        JSON.stringify({
          kind: 'request',
          id: 'again',
          labels: ['small-node'],
          requestor: 'ci',
          priority: 3,
        }),
      ]),
    );
    const [waiting] = await waitingRequests(h.pool.context);
    expect(waiting?.id).toBe('again');
    const message = requestMessageOf(waiting as NonNullable<typeof waiting>);
    expect(message).toEqual({
      kind: 'request',
      id: 'again',
      labels: ['small-node'],
      requestor: 'ci',
      priority: 3,
    });
    await h.send({ kind: 'release', nodeId: 'blocker/0' });
    await h.drainRequests();
    await h.send(message); // the same body: adopted, placed, not refused as a reused id
    await h.drainRequests();
    expect((await h.pool.context.store.getRequest('again'))?.state).toMatch(/^(pending|fulfilled)$/);
  });

  it('ends a waiting request whose labels the configuration no longer offers when its message comes back', async () => {
    h = await startHarness(CONFIG);
    await readyNode(h, 'blocker');
    await waitOnce(h, 'orphan', ['big-node']);
    const without = parseConfigOrThrow(
      CONFIG.replace(/ {6}- name: other\n[\s\S]*$/, '').replace(
        'request-timeout: 300',
        'request-timeout: 300',
      ),
      'without.yaml',
    );
    expect(without.metastaticLabelNames.has('big-node')).toBe(false);
    const out = await requestNodes(
      { ...h.pool.context, config: without },
      { kind: 'request', id: 'orphan', labels: ['big-node'] },
    );
    expect(out.kind).toBe('failed');
    expect(await h.pool.context.store.getRequest('orphan')).toMatchObject({
      state: 'failed',
      reason: 'unknown label "big-node" (configured: mid-node, small-node)',
    });
  });
});

/**
 * The waiting budget is a time since the request was first recorded (issue 25, defect 2): not a number
 * of receives, which a backlog stretches and a restart's re-send starts again. Each delivery here is a
 * hand-built event whose receive count says which receive it is; the clock is the test's.
 */
describe('the waiting budget', () => {
  /** Delivers the request's message as receive `receives`; true when it came back (still waiting). */
  async function deliver(harness: Harness, id: string, labels: string[], receives: number): Promise<boolean> {
    const out = await harness.pool.handlers.request(sqsEvent([body(id, labels)], receives));
    return out.batchItemFailures.length === 1;
  }

  it('ends a waiting request once its budget passed since it was recorded, at a low receive count', async () => {
    h = await startHarness(CONFIG, { waitingBudgetSeconds: 60, maxReceiveCount: 50 });
    await readyNode(h, 'blocker');
    expect(await deliver(h, 'mid', ['mid-node'], 1)).toBe(true);
    h.clock.advance(59_999);
    expect(await deliver(h, 'mid', ['mid-node'], 2)).toBe(true);
    expect((await h.pool.context.store.getRequest('mid'))?.state).toBe('requested');
    h.clock.advance(1);
    expect(await deliver(h, 'mid', ['mid-node'], 3)).toBe(false); // consumed: it ended
    const ended = await h.pool.context.store.getRequest('mid');
    expect(ended?.state).toBe('failed');
    expect(ended?.reason).toMatch(
      /^waiting budget of 60s passed: still no capacity 60s after it was recorded: request mid waits for capacity: /,
    );
  });

  it('is not reset by a re-sent message (a restart): its start is the stored record', async () => {
    h = await startHarness(CONFIG, { waitingBudgetSeconds: 60, maxReceiveCount: 50 });
    await readyNode(h, 'blocker');
    expect(await deliver(h, 'mid', ['mid-node'], 1)).toBe(true);
    h.clock.advance(45_000);
    // `metastatic dev` restarted: the waiting request's message is sent again, its first receive.
    expect(await deliver(h, 'mid', ['mid-node'], 1)).toBe(true);
    h.clock.advance(15_000);
    expect(await deliver(h, 'mid', ['mid-node'], 1)).toBe(false);
    expect(await h.pool.context.store.getRequest('mid')).toMatchObject({
      state: 'failed',
      reason: expect.stringMatching(/^waiting budget of 60s passed: still no capacity 60s after/),
    });
  });

  it('ends it at its request-timeout, when that is shorter, with the reaper`s reason', async () => {
    h = await startHarness(CONFIG, { waitingBudgetSeconds: 60, maxReceiveCount: 50 });
    await readyNode(h, 'blocker');
    expect(await deliver(h, 'small', ['small-node'], 1)).toBe(true);
    h.clock.advance(30_000); // small-node's request-timeout
    expect(await deliver(h, 'small', ['small-node'], 2)).toBe(false);
    expect(await h.pool.context.store.getRequest('small')).toMatchObject({
      state: 'failed',
      reason: requestTimeoutReason(30, 30_000),
    });
  });

  it('backs a waiting message off as it waits, and still serves it as soon as a release frees room', async () => {
    h = await startHarness(CONFIG, {
      waitingBudgetSeconds: 600,
      maxReceiveCount: 50,
      backOff: true,
      skipUnchanged: true,
    });
    await readyNode(h, 'blocker');
    expect(await deliver(h, 'small', ['small-node'], 1)).toBe(true); // recorded waiting
    h.clock.advance(20_000);
    // Waited 20 s: its message now stays away 20 s on fauxqs, as ChangeMessageVisibility says (the
    // queue's own visibility timeout here is 0: without the back-off it would come back at once).
    await h.send({ kind: 'request', id: 'small', labels: ['small-node'] });
    expect(await h.drainRequests()).toBe(1);
    expect((await h.pool.context.store.getRequest('small'))?.state).toBe('requested');
    expect(await h.drainRequests()).toBe(0);
    await h.send({ kind: 'release', nodeId: 'blocker/0' });
    expect(await h.drainRequests()).toBe(1); // the release, which hands the room to the waiting request
    expect((await h.pool.context.store.getRequest('small'))?.state).toMatch(/^(pending|fulfilled)$/);
  });

  it('skips the placement attempt of a waiting request when nothing was freed since its last one', async () => {
    h = await startHarness(CONFIG, { waitingBudgetSeconds: 600, maxReceiveCount: 50, skipUnchanged: true });
    await readyNode(h, 'blocker');
    const harness = h;
    // An attempt looks for a backing node with a free slot of the label (a Query of the free index); the
    // registry of waiting queues it may take from its last read (issue 26), and what else runs after a
    // batch (the backing processes' live slots: the ACTIVE backing nodes) is not the attempt.
    const attempts = async (n: number) =>
      (await commandsDuring(harness, () => deliver(harness, 'mid', ['mid-node'], n))).some((c) =>
        c.startsWith('QueryCommand free '),
      );
    expect(await attempts(1)).toBe(true); // recorded waiting: a full attempt
    expect(await attempts(2)).toBe(false); // nothing freed since: skipped
    expect((await h.pool.context.store.getRequest('mid'))?.state).toBe('requested');
    h.clock.advance(30_000); // at least one full attempt every 30 s, whatever the count says
    expect(await attempts(3)).toBe(true);
    expect(await attempts(4)).toBe(false);
    await h.send({ kind: 'release', nodeId: 'blocker/0' }); // frees room (its node's write is counted)
    await h.drainRequests();
    expect(await attempts(5)).toBe(true);
  });
});
