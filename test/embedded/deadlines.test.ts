import { createServer, type Server, type Socket } from 'node:net';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { markReady, newBackingRecord } from '../../shared/core/backing.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { TimeoutError } from '../../shared/core/errors.ts';
import { silentLog } from '../../shared/core/log.ts';
import { type EventSink, PoolEventType } from '../../shared/core/observability.ts';
import type { BackingProvider, BackingResource } from '../../shared/core/provider.ts';
import type { BackingRecord } from '../../shared/core/records.ts';
import { stateChangeEvent } from '../../shared/core/stateChanges.ts';
import {
  DELIVERY_DEADLINE_MS,
  INVOCATION_SAFETY_MARGIN_MS,
  type InvocationTime,
  PENDING_GRACE_MS,
  PORT_PROBE_TIMEOUT_MS,
} from '../../shared/core/timing.ts';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { makeReaperHandler } from '../../shared/handlers/reaperHandler.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { probePort } from '../../shared/providers/probe.ts';
import { scanHostKeys } from '../../shared/providers/scanHostKeysLazily.ts';
import { guardDynamoLimits } from '../../shared/runtime/dynamoLimits.ts';
import {
  type Engine,
  ensureTable,
  localEngineClientConfig,
  startDynalite,
} from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * Every deadline derives from the invocation's remaining time (Lambda's context), less
 * INVOCATION_SAFETY_MARGIN_MS: a batch starts no record once that is used up, and a port probe or
 * host-key scan ends before it. The handlers run here against dynalite with a provider that answers at a
 * loopback port, so the scans are real SSH attempts against a server that never speaks.
 */
const yaml = (o: { bootTimeout?: number; hostKeyChecking?: boolean } = {}) =>
  poolConfig({
    meta: {
      provider: { 'boot-timeout': o.bootTimeout ?? 120 },
      pool: { 'host-key-checking': o.hostKeyChecking ?? false },
      labels: [smallNode({ 'max-parallel-jobs': 4, 'grace-time': 0 })],
    },
  });

let engine: Engine;
let dynamodb: DynamoDBClient;
let tables = 0;
let silent: { server: Server; port: number; sockets: Set<Socket> };

beforeAll(async () => {
  engine = await startDynalite();
  dynamodb = guardDynamoLimits(new DynamoDBClient(localEngineClientConfig(engine.endpoint, 'us-east-1')));
  // Accepts TCP connections (the port probe answers) and never says a word (an SSH scan hangs).
  const sockets = new Set<Socket>();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  silent = { server, port: (server.address() as { port: number }).port, sockets };
});
afterAll(async () => {
  for (const s of silent.sockets) s.destroy();
  await new Promise((resolve) => silent.server.close(resolve));
  dynamodb.destroy();
  await engine.close();
});

/** A provider whose every resource runs at the silent loopback server; launches just mint ids. */
class LoopbackProvider implements BackingProvider {
  /** resource id -> backing node id (its tag). */
  readonly tags = new Map<string, string>();
  /** Called in each launch (a test moves the clock there). */
  onLaunch?: () => void;
  async launch(spec: { backingNodeId: string }): Promise<{ resourceId: string }> {
    this.onLaunch?.();
    const resourceId = `i-${String(this.tags.size + 1).padStart(17, '0')}`;
    this.tags.set(resourceId, spec.backingNodeId);
    return { resourceId };
  }
  async describe(resourceId: string): Promise<BackingResource | undefined> {
    const backingNodeId = this.tags.get(resourceId);
    if (!backingNodeId) return undefined;
    return {
      resourceId,
      backingNodeId,
      poolKey: 'local/main',
      state: 'running',
      host: '127.0.0.1',
      port: silent.port,
      attributes: {},
    };
  }
  async terminate(): Promise<void> {}
  async list(): Promise<BackingResource[]> {
    return [];
  }
}

interface Pool {
  ctx: Context;
  clock: ManualClock;
  provider: LoopbackProvider;
  /** Request ids whose `Request Fulfilled` event was published, in order. */
  fulfilled: string[];
  /** Called after each `Request Fulfilled` event (a test moves the clock there). */
  onFulfilled?: () => void;
}

async function pool(
  o: { bootTimeout?: number; hostKeyChecking?: boolean; probes?: number[] } = {},
): Promise<Pool> {
  const tableName = `deadlines-${++tables}`;
  await ensureTable(dynamodb, tableName);
  const clock = new ManualClock(Date.parse('2026-06-01T00:00:00Z'));
  const provider = new LoopbackProvider();
  const p: Pool = { ctx: undefined as unknown as Context, clock, provider, fulfilled: [] };
  const events: EventSink = {
    async publish(type, detail) {
      if (type !== PoolEventType.requestFulfilled) return;
      p.fulfilled.push(String(detail.requestId));
      p.onFulfilled?.();
    },
  };
  p.ctx = {
    store: new DynamoStore(dynamodb, tableName),
    config: parseConfigOrThrow(yaml(o), 'deadlines.yaml'),
    providers: { forPool: () => provider, forResource: () => provider },
    clock,
    log: process.env.DEBUG_TEST
      ? { ...silentLog, debug: console.log, info: console.log, warn: console.log, error: console.log }
      : silentLog,
    events,
    probePort: async (host, port, timeoutMs) => {
      o.probes?.push(timeoutMs);
      return probePort(host, port, timeoutMs);
    },
    scanHostKeys,
  };
  return p;
}

/** A ready backing node with free slots whose host keys are known (no scan is owed to it). */
async function readyBacking(p: Pool, id = 'bn-ready'): Promise<BackingRecord> {
  const fresh = newBackingRecord({
    id,
    poolKey: 'meta/main',
    owner: 'test',
    label: {
      name: 'small-node',
      backingLabel: 'large-node',
      maxParallelJobs: 4,
      graceTime: 0,
      minRetentionTime: 0,
      maxAge: undefined,
      hostKeyChecking: false,
    },
    backingPoolKey: 'local/main',
    firstNodeId: 'x/0',
    attempt: 1,
    now: p.clock.now(),
  });
  const b: BackingRecord = {
    ...fresh,
    state: 'ready',
    used: 0,
    slotMap: {},
    claims: {},
    host: '10.0.0.7',
    port: 22,
    attributes: {},
  };
  await p.ctx.store.createBacking(b);
  return b;
}

/** A launching backing node with its resource recorded (and its pointer) and one pending node on it. */
async function launchingWithNode(
  p: Pool,
  o: { runningAt?: number } = {},
): Promise<{ backingId: string; resourceId: string }> {
  const resourceId = 'i-0000000000000a001';
  const fresh = newBackingRecord({
    id: 'bn-booting',
    poolKey: 'meta/main',
    owner: 'test',
    label: {
      name: 'small-node',
      backingLabel: 'large-node',
      maxParallelJobs: 4,
      graceTime: 0,
      minRetentionTime: 0,
      maxAge: undefined,
      hostKeyChecking: true,
    },
    backingPoolKey: 'local/main',
    firstNodeId: 'w/0',
    attempt: 1,
    now: p.clock.now(),
  });
  p.provider.tags.set(resourceId, fresh.id);
  await p.ctx.store.pointToBacking(resourceId, fresh.id, p.clock.now());
  await p.ctx.store.createBacking({
    ...fresh,
    resourceId,
    resourceRecordedAt: p.clock.now(),
    claims: {},
    ...(o.runningAt === undefined ? {} : { runningAt: o.runningAt }),
  });
  await p.ctx.store.createRequest({
    id: 'w',
    labels: ['small-node'],
    bodyHash: 'h',
    state: 'pending',
    poolKey: 'meta/main',
    createdAt: p.clock.now(),
    updatedAt: p.clock.now(),
    version: 1,
    nodes: [{ id: 'w/0', label: 'small-node', state: 'pending', backingNodeId: fresh.id, slot: 0 }],
  });
  return { backingId: fresh.id, resourceId };
}

const req = (id: string) => JSON.stringify({ kind: 'request', id, labels: ['small-node'] });
const running = (resourceId: string) =>
  JSON.stringify(stateChangeEvent({ resourceId, state: 'running', source: 'aws.ec2', region: 'x', at: 0 }));

/** Lambda's context as far as deadlines go: `ms` left now, counting down on the wall clock. */
function wallClockInvocation(ms: number): InvocationTime {
  const end = Date.now() + ms;
  return { getRemainingTimeInMillis: () => end - Date.now() };
}

/** `ms` left now, counting down on the pool's (manual) clock. */
function invocationOn(clock: ManualClock, ms: number): InvocationTime {
  const end = clock.now() + ms;
  return { getRemainingTimeInMillis: () => end - clock.now() };
}

afterEach(() => {
  for (const s of silent.sockets) s.destroy();
});

describe('a batch under the invocation deadline', () => {
  it('starts no record when the invocation has less than the safety margin left: all come back untouched', async () => {
    const p = await pool();
    await readyBacking(p);
    const handler = makeRequestHandler(p.ctx, { maxReceiveCount: 5 });
    const out = await handler(sqsEvent([req('a'), req('b'), req('c')]), {
      getRemainingTimeInMillis: () => INVOCATION_SAFETY_MARGIN_MS - 1,
    });
    expect(out.batchItemFailures).toEqual([
      { itemIdentifier: 'm-0' },
      { itemIdentifier: 'm-1' },
      { itemIdentifier: 'm-2' },
    ]);
    for (const id of ['a', 'b', 'c']) expect(await p.ctx.store.getRequest(id)).toBeUndefined();
    expect((await p.ctx.store.getBacking('bn-ready'))?.used).toBe(0);
  });

  it('stops starting records once the time runs short, and reports the rest as item failures', async () => {
    const p = await pool();
    await readyBacking(p);
    const handler = makeRequestHandler(p.ctx, { maxReceiveCount: 5 });
    // The first record takes 26 s of a 30 s invocation: 4 s are left, less than the margin.
    p.onFulfilled = () => p.clock.advance(26_000);
    const out = await handler(sqsEvent([req('a'), req('b'), req('c')]), invocationOn(p.clock, 30_000));
    expect(p.fulfilled).toEqual(['a']);
    expect(out.batchItemFailures).toEqual([{ itemIdentifier: 'm-1' }, { itemIdentifier: 'm-2' }]);
    expect(await p.ctx.store.getRequest('b')).toBeUndefined();
    expect(await p.ctx.store.getRequest('c')).toBeUndefined();
    expect((await p.ctx.store.getBacking('bn-ready'))?.used).toBe(1);
    // They come back in a fresh invocation and are served there.
    p.onFulfilled = undefined;
    const again = await handler(sqsEvent([req('b'), req('c')], 2), invocationOn(p.clock, 30_000));
    expect(again.batchItemFailures).toEqual([]);
    expect(p.fulfilled).toEqual(['a', 'b', 'c']);
  });

  it('gives a batch DELIVERY_DEADLINE_MS when there is no Lambda context (the embedded pool)', async () => {
    const p = await pool();
    await readyBacking(p);
    const handler = makeRequestHandler(p.ctx, { maxReceiveCount: 5 });
    p.onFulfilled = () => p.clock.advance(DELIVERY_DEADLINE_MS - INVOCATION_SAFETY_MARGIN_MS);
    const out = await handler(sqsEvent([req('a'), req('b')]));
    expect(out.batchItemFailures).toEqual([{ itemIdentifier: 'm-1' }]);
    expect(p.fulfilled).toEqual(['a']);
  });
});

describe('a placement under the invocation deadline', () => {
  it('records no placement once the invocation is about to end: gives its claim back and comes back', async () => {
    const p = await pool();
    const handler = makeRequestHandler(p.ctx, { maxReceiveCount: 5 });
    // The launch takes 26 s of the 30 s: recording the placement now could be cut off half-way.
    p.provider.onLaunch = () => p.clock.advance(26_000);
    const out = await handler(sqsEvent([req('late')]), invocationOn(p.clock, 30_000));
    expect(out.batchItemFailures).toEqual([{ itemIdentifier: 'm-0' }]);
    expect((await p.ctx.store.getRequest('late'))?.state).toBe('requested');
    const [b] = await p.ctx.store.listBacking();
    expect(b).toMatchObject({ state: 'launching', used: 0 });
    // Its redelivery, in a fresh invocation, places the node on the same backing node: no second launch.
    p.provider.onLaunch = undefined;
    expect(
      (await handler(sqsEvent([req('late')], 2), invocationOn(p.clock, 30_000))).batchItemFailures,
    ).toEqual([]);
    expect(await p.ctx.store.getRequest('late')).toMatchObject({
      state: 'pending',
      nodes: [{ backingNodeId: b?.id }],
    });
    expect(p.provider.tags.size).toBe(1);
  });
});

describe('checks end before the invocation does', () => {
  it('ends a host-key scan that would outlast the remaining time, and retries the event (no verdict)', async () => {
    const p = await pool({ bootTimeout: 120, hostKeyChecking: true });
    const { backingId, resourceId } = await launchingWithNode(p);
    const fulfil = makeFulfilHandler(p.ctx);
    const remaining = PORT_PROBE_TIMEOUT_MS + INVOCATION_SAFETY_MARGIN_MS + 1_000;
    const started = Date.now();
    const out = await fulfil(sqsEvent([running(resourceId)]), wallClockInvocation(remaining));
    const took = Date.now() - started;
    // The scan (boot-timeout: up to 120 s) ended with the invocation's time, before the function's end.
    expect(took).toBeLessThan(remaining - INVOCATION_SAFETY_MARGIN_MS / 2);
    expect(took).toBeGreaterThanOrEqual(remaining - INVOCATION_SAFETY_MARGIN_MS - 1_000);
    expect(out.batchItemFailures).toEqual([{ itemIdentifier: 'm-0' }]);
    // Within boot-timeout a scan cut short is no verdict: the backing node is ready, its node waits.
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('ready');
    expect((await p.ctx.store.getRequest('w'))?.nodes[0]?.state).toBe('pending');
  }, 20_000);

  it('fails the backing node when its scan times out once boot-timeout has passed since it ran', async () => {
    const p = await pool({ bootTimeout: 10, hostKeyChecking: true });
    // EC2 reported it running 10 s ago (its port did not answer then): its boot-timeout is over.
    const { backingId, resourceId } = await launchingWithNode(p, { runningAt: p.clock.now() - 10_000 });
    const fulfil = makeFulfilHandler(p.ctx);
    const remaining = PORT_PROBE_TIMEOUT_MS + INVOCATION_SAFETY_MARGIN_MS + 500;
    const out = await fulfil(sqsEvent([running(resourceId)]), wallClockInvocation(remaining));
    expect(out.batchItemFailures).toEqual([]);
    expect(await p.ctx.store.getBacking(backingId)).toMatchObject({
      state: 'failed',
      reason: expect.stringMatching(/^host-key scan failed: .*timed out after/),
    });
  }, 20_000);

  it('rejects a timed-out scan with a TimeoutError, the one failure a deadline may excuse', async () => {
    await expect(scanHostKeys('127.0.0.1', silent.port, 200)).rejects.toBeInstanceOf(TimeoutError);
  });

  it('does not start a port probe that could not finish in time; boot-timeout counts from this report', async () => {
    const probes: number[] = [];
    const p = await pool({ probes });
    const { backingId, resourceId } = await launchingWithNode(p);
    const fulfil = makeFulfilHandler(p.ctx);
    const short = invocationOn(p.clock, INVOCATION_SAFETY_MARGIN_MS + PORT_PROBE_TIMEOUT_MS - 1);
    expect((await fulfil(sqsEvent([running(resourceId)]), short)).batchItemFailures).toHaveLength(1);
    expect(probes).toEqual([]);
    expect(await p.ctx.store.getBacking(backingId)).toMatchObject({
      state: 'launching',
      runningAt: p.clock.now(),
    });
  });
});

describe('the reaper under the invocation deadline', () => {
  it('leaves its work to the next run when the invocation is about to end', async () => {
    const p = await pool();
    const b = await readyBacking(p);
    const reaper = makeReaperHandler(p.ctx);
    p.clock.advance(1_000); // past grace-time 0: due for retirement
    const short = await reaper({ getRemainingTimeInMillis: () => INVOCATION_SAFETY_MARGIN_MS - 1 });
    expect(short.retired).toEqual([]);
    expect(short.deferred).toBeGreaterThan(0);
    expect(short.errors).toEqual([]);
    expect((await p.ctx.store.getBacking(b.id))?.state).toBe('ready');
    const full = await reaper({ getRemainingTimeInMillis: () => 60_000 });
    expect(full.retired).toEqual([b.id]);
  });
});

describe('a pending request has a deadline (issue 22, defect 8)', () => {
  /**
   * Launch-timeout and boot-timeout bound each attempt of a node, and launch-retries the attempts: a
   * request still `pending` past launch-retries x (launch-timeout + boot-timeout), plus PENDING_GRACE_MS
   * for the reaper to settle the last attempt, is stuck. Here it is stuck as a readying cut short leaves
   * it: its backing node ready, its node never readied, the reaper's readying window past. Before, only a
   * waiting request had a deadline (request-timeout), and this one stayed pending forever.
   */
  it('is failed by the reaper, with the reason, once launch and boot timeouts of every attempt have passed', async () => {
    const h = await startHarness(
      poolConfig({
        meta: {
          provider: { 'launch-timeout': 600, 'boot-timeout': 60, 'launch-retries': 2 },
          labels: [smallNode({ 'max-parallel-jobs': 2 })],
        },
      }),
    );
    try {
      const store = h.pool.context.store;
      await h.send({ kind: 'request', id: 'stuck', labels: ['small-node'] });
      await h.drainRequests();
      const placed = await store.getRequest('stuck');
      expect(placed?.state).toBe('pending');
      // The backing node becomes ready; the write that would ready its node never happens.
      const b = (await store.getBacking(placed?.nodes[0]?.backingNodeId as string)) as BackingRecord;
      await store.putBacking(markReady(b, { host: '127.0.0.1', port: 1, attributes: {} }, h.clock.now()), {
        version: b.version,
        states: ['launching'],
      });
      const budgetMs = 2 * (600 + 60) * 1000 + PENDING_GRACE_MS;
      h.clock.advance(budgetMs - 1_000);
      expect((await reap(h.pool.context)).expiredRequests).toEqual([]);
      expect((await store.getRequest('stuck'))?.state).toBe('pending');
      h.clock.advance(1_000);
      const report = await reap(h.pool.context);
      expect(report.expiredRequests).toEqual(['stuck']);
      const r = await store.getRequest('stuck');
      expect(r).toMatchObject({
        state: 'failed',
        reason:
          'pending past its deadline: not ready 1620s after it was placed (launch-retries 2 x (launch-timeout 600s + boot-timeout 60s), and 300s to settle the last attempt)',
      });
      expect(r?.nodes[0]?.state).toBe('failed');
      expect((await store.getBacking(b.id))?.used).toBe(0); // its slot is given back
    } finally {
      await h.close();
    }
  });
});
