import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DescribeInstancesCommand, RunInstancesCommand } from '@aws-sdk/client-ec2';
import { EventBridgeClient, PutEventsCommand } from '@aws-sdk/client-eventbridge';
import type { SQSBatchResponse } from 'aws-lambda';
import { mockClient } from 'aws-sdk-client-mock';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { DeadlineError } from '../../shared/core/errors.ts';
import { silentLog } from '../../shared/core/log.ts';
import { type StateChangeEvent, stateChangeEvent } from '../../shared/core/stateChanges.ts';
import { invocationFor, RESOURCE_NOT_FOUND_GRACE_MS } from '../../shared/core/timing.ts';
import { makeFulfilHandler } from '../../shared/handlers/fulfilHandler.ts';
import { makeReaperHandler } from '../../shared/handlers/reaperHandler.ts';
import { makeRequestHandler } from '../../shared/handlers/requestHandler.ts';
import { awsContext } from '../../shared/runtime/awsContext.ts';
import { type Engine, ensureTable, localDynamoClient, startDynalite } from '../../shared/runtime/engines.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import type { Context } from '../../shared/usecases/context.ts';
import { requestNodes } from '../../shared/usecases/place/requestNodes.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { poolConfig } from '../../testkit/configs.ts';
import { FakeEc2 } from '../../testkit/fakeEc2.ts';
import { sqsEvent } from '../../testkit/harness.ts';
import { ED25519_KEY } from '../../testkit/sshKeys.ts';

/**
 * The whole flow on the embedded DynamoDB with EC2 played by the stateful fake: the same handlers as
 * in Lambda, EC2 state events fed to the fulfil handler as EventBridge -> SQS would deliver them.
 */
interface PoolOptions {
  retries?: number;
  maxServers?: number;
  publicIpv4?: boolean;
  minReady?: number;
  /** The backing pool's authorized-keys. */
  keys?: string[];
  /** More keys of the backing label (the node contract: username, python-path, ...). */
  large?: Record<string, unknown>;
  /** running -> host keys in the console output (the fake EC2's consoleDelayMs). */
  consoleDelayMs?: number;
  /** False: the instances never print their host keys. */
  consoleHostKeys?: boolean;
  /** host-key-checking on the metastatic label. */
  hostKeyChecking?: boolean;
  /** Replaces parts of the context (a host-key plan, a scanner). */
  context?: Partial<Context>;
  /**
   * The fulfil handler sends an event it must try again later back to its queue, delayed (as the stack's
   * fulfil function does): the copies land in Pool.resent instead of a queue.
   */
  resend?: boolean;
}

const yaml = (o: PoolOptions = {}) =>
  poolConfig({
    labels: o.minReady ? [{ name: 'large' }, { name: 'small', 'min-ready': o.minReady }] : undefined,
    backing: {
      driver: 'aws',
      provider: { region: 'eu-west-1' },
      pool: {
        'max-servers': o.maxServers || undefined,
        'subnet-ids': ['subnet-a', 'subnet-b'],
        'security-group-id': 'sg-1',
        'public-ipv4': o.publicIpv4 || undefined,
        'authorized-keys': o.keys,
      },
      labels: [
        {
          name: 'large',
          'instance-types': ['m7g.2xlarge', 'm6g.2xlarge'],
          'image-id': 'ami-123',
          ...o.large,
        },
      ],
    },
    meta: {
      provider: { 'launch-retries': o.retries ?? 3 },
      labels: [
        {
          name: 'small',
          'backing-label': 'large',
          'max-parallel-jobs': 2,
          'grace-time': 60,
          ...(o.hostKeyChecking ? { 'host-key-checking': true } : {}),
        },
      ],
    },
  });

let engine: Engine;
let dynamodb: DynamoDBClient;
let table = 0;
const eventBridge = mockClient(EventBridgeClient);

beforeAll(async () => {
  engine = await startDynalite();
  // dynalite with the embedded pool's transactions and DynamoDB's limits (engines.ts localDynamoClient).
  dynamodb = localDynamoClient(
    {
      endpoint: engine.endpoint,
      region: 'eu-west-1',
      credentials: { accessKeyId: 'x', secretAccessKey: 'x' },
    },
    engine.endpoint,
  ).client;
  eventBridge.on(PutEventsCommand).resolves({ FailedEntryCount: 0, Entries: [{ EventId: 'e' }] });
});
afterAll(async () => {
  eventBridge.restore();
  dynamodb.destroy();
  await engine.close();
});

interface Pool {
  ctx: Context;
  ec2: FakeEc2;
  clock: ManualClock;
  request: ReturnType<typeof makeRequestHandler>;
  fulfil: ReturnType<typeof makeFulfilHandler>;
  /** Delivers the fake's pending state events to the fulfil handler (undefined: there were none). */
  deliver(): Promise<SQSBatchResponse | undefined>;
  /** With `resend`: the events the fulfil handler sent back to its queue, each with its delay. */
  resent: { body: string; seconds: number; dueAt: number }[];
}

let pools: FakeEc2[] = [];
afterEach(() => {
  for (const p of pools) p.restore();
  pools = [];
});

async function pool(o: PoolOptions = {}): Promise<Pool> {
  const tableName = `aws-flow-${++table}`;
  await ensureTable(dynamodb, tableName);
  const clock = new ManualClock(Date.parse('2026-06-01T00:00:00Z'));
  const queue: StateChangeEvent[] = [];
  const ec2 = new FakeEc2({
    region: 'eu-west-1',
    clock,
    bootDelayMs: 30_000,
    consoleDelayMs: o.consoleDelayMs ?? 0,
    onEvent: (e) => void queue.push(e),
  });
  ec2.consoleHostKeys = o.consoleHostKeys ?? true;
  pools.push(ec2);
  const base = awsContext({
    config: parseConfigOrThrow(yaml(o), 'aws.yaml'),
    store: new DynamoStore(dynamodb, tableName, clock),
    region: 'eu-west-1',
    poolId: 'test-pool',
    clock,
    log: silentLog,
    ec2Client: () => ec2.client,
    eventBridge: new EventBridgeClient({ region: 'eu-west-1' }),
  });
  // The instances' private IPs are not reachable from here: their port "answers" by fiat.
  const ctx: Context = { ...base, probePort: async () => true, ...o.context };
  const request = makeRequestHandler(ctx, { maxReceiveCount: 3 });
  const resent: Pool['resent'] = [];
  const fulfil = makeFulfilHandler(
    ctx,
    o.resend
      ? {
          retryLater: async (record, seconds) =>
            void resent.push({ body: record.body, seconds, dueAt: clock.now() + seconds * 1000 }),
        }
      : {},
  );
  return {
    ctx,
    ec2,
    clock,
    request,
    fulfil,
    resent,
    async deliver() {
      await ec2.settled();
      const events = queue.splice(0);
      return events.length ? fulfil(sqsEvent(events.map((e) => JSON.stringify(e)))) : undefined;
    },
  };
}

const req = (id: string, labels = ['small']) => JSON.stringify({ kind: 'request', id, labels });

describe('which addresses the functions can check', () => {
  const contextFor = (o: { publicIpv4?: boolean; inVpc?: boolean }) =>
    awsContext({
      config: parseConfigOrThrow(yaml({ publicIpv4: o.publicIpv4 }), 'aws.yaml'),
      store: new DynamoStore(dynamodb, 'unused'),
      region: 'eu-west-1',
      poolId: 'test-pool',
      ...(o.inVpc === undefined ? {} : { inVpc: o.inVpc }),
      clock: new ManualClock(0),
      log: silentLog,
    });

  it('checks ports at public addresses, or at private ones from inside the VPC; else trusts EC2', () => {
    expect(contextFor({ publicIpv4: true }).probePort).toBeTypeOf('function');
    expect(contextFor({ inVpc: true }).probePort).toBeTypeOf('function');
    // Private addresses from outside the VPC: a check could never succeed, so `running` means ready.
    expect(contextFor({}).probePort).toBeUndefined();
    expect(contextFor({ inVpc: false }).probePort).toBeUndefined();
  });

  it('learns host keys from the console where the functions cannot reach the instances, by a scan where they can', () => {
    const plan = (o: { publicIpv4?: boolean; inVpc?: boolean }) =>
      contextFor(o).hostKeyPlan?.('ec2/main', 'large');
    expect(plan({})).toEqual({ source: 'console', reachable: false });
    expect(plan({ inVpc: true })).toEqual({ source: 'scan', reachable: true });
    expect(plan({ publicIpv4: true })).toEqual({ source: 'scan', reachable: true });
    // Not an aws pool: its provider reports its keys itself (local) or none do.
    expect(contextFor({}).hostKeyPlan?.('local/main', 'large')).toBeUndefined();
  });

  it('reads METASTATIC_IN_VPC from the function environment', async () => {
    const { LambdaEnv } = await import('../../shared/runtime/lambdaContext.ts');
    const base = { TABLE_NAME: 't', METASTATIC_CONFIG: 'x' };
    expect(LambdaEnv.parse(base).METASTATIC_IN_VPC).toBe(false);
    expect(LambdaEnv.parse({ ...base, METASTATIC_IN_VPC: 'true' }).METASTATIC_IN_VPC).toBe(true);
    expect(LambdaEnv.safeParse({ ...base, METASTATIC_IN_VPC: 'yes' }).success).toBe(false);
  });
});

describe('the whole flow against a stateful fake EC2', () => {
  it('launches one tagged instance for two nodes, fulfils them when it runs, terminates it when idle', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('a'), req('b')]));
    expect(p.ec2.live()).toHaveLength(1);
    expect((await p.ctx.store.getRequest('a'))?.state).toBe('pending');
    await p.ec2.advance(30_000);
    await p.deliver();
    const a = await p.ctx.store.getRequest('a');
    expect(a?.state).toBe('fulfilled');
    expect(a?.nodes[0]?.host).toMatch(/^10\./);
    expect(a?.nodes[0]?.port).toBe(22);
    await p.request(
      sqsEvent([
        JSON.stringify({ kind: 'release', nodeId: 'a/0' }),
        JSON.stringify({ kind: 'release', nodeId: 'b/0' }),
      ]),
    );
    p.clock.advance(61_000);
    const report = await reap(p.ctx);
    expect(report.retired).toHaveLength(1);
    await p.ec2.advance(10_000);
    expect(p.ec2.live()).toHaveLength(0);
  });

  it('keeps min-ready nodes on EC2: a request takes one at once, with no launch, and the reaper replaces it', async () => {
    const p = await pool({ minReady: 1 });
    // The reaper's run makes the ready node: one tagged instance, which the fulfil flow makes ready.
    expect((await reap(p.ctx)).minReadyMade).toBe(1);
    expect(p.ec2.live()).toHaveLength(1);
    await p.ec2.advance(30_000);
    await p.deliver();
    const launches = p.ec2.inputs('RunInstances').length;
    expect(launches).toBe(1);
    const out = await p.request(sqsEvent([req('warm')]));
    expect(out.batchItemFailures).toEqual([]);
    const warm = await p.ctx.store.getRequest('warm');
    expect(warm?.state).toBe('fulfilled'); // by the request function alone: no EC2 event awaited
    expect(warm?.nodes[0]?.host).toMatch(/^10\./);
    expect(warm?.nodes[0]?.spare).toBe('min-ready:small:0:0/0');
    // The node it took carries the contract of its backing label (aws defaults) like any other.
    expect(warm?.nodes[0]).toMatchObject({ username: 'ec2-user', connectionType: 'ssh', pythonPath: 'auto' });
    // Its replacement went onto the same instance's free slot: still one instance, no launch.
    expect(p.ec2.inputs('RunInstances')).toHaveLength(launches);
    const next = await p.ctx.store.getRequest('min-ready:small:0:1');
    expect(next?.state).toBe('fulfilled');
    expect(next?.nodes[0]?.backingNodeId).toBe(warm?.nodes[0]?.backingNodeId);
    // Released: the ready node it took ends with it, and its slot is free again.
    await p.request(sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'warm/0' })]));
    expect((await p.ctx.store.getBacking(warm?.nodes[0]?.backingNodeId as string))?.used).toBe(1);
  });

  it('keeps min-ready nodes whose instance the reaper itself found running (a lost event), instead of replacing them', async () => {
    const p = await pool({ minReady: 2 });
    expect((await reap(p.ctx)).minReadyMade).toBe(2);
    await p.ec2.advance(30_000); // running; the event is lost (never delivered)
    const report = await reap(p.ctx);
    // Its reconciliation made the backing node ready, and the spares on it with it: they stay.
    expect(report.minReadyEnded).toBe(0);
    expect(report.minReadyMade).toBe(0);
    const spares = (await p.ctx.store.listRequests()).filter((r) => r.id.startsWith('min-ready:'));
    expect(spares.map((r) => r.state)).toEqual(['fulfilled', 'fulfilled']);
  });

  it('backs off a label whose min-ready launches keep failing, exponentially, until one succeeds (issue 24)', async () => {
    const p = await pool({ minReady: 5, retries: 3 });
    p.ec2.failLaunches({ code: 'InvalidAMIID.NotFound' });
    // Ten reaper runs a minute apart. Each used to remake every seat's spare: 5 x 3 RunInstances a run.
    for (let run = 0; run < 10; run++) {
      const report = await reap(p.ctx);
      expect(report.errors).toEqual([]);
      p.clock.advance(60_000);
    }
    // One spare tried at 0, 1, 3 and 7 minutes (waits of 1, 2, 4, then 8 minutes), 3 attempts each.
    expect(p.ec2.inputs('RunInstances')).toHaveLength(4 * 3);
    const { backoff } = await p.ctx.store.minReadyState('small');
    expect(backoff).toMatchObject({
      failures: 4,
      retryAt: backoff ? backoff.lastFailedAt + 8 * 60_000 : 0,
      reason: expect.stringContaining('InvalidAMIID.NotFound'),
    });
    // EC2 works again: once the wait is over, one run makes every seat's spare, and a spare that became
    // ready resets the backoff.
    p.ec2.clearFailures();
    p.clock.advance(8 * 60_000);
    expect((await reap(p.ctx)).minReadyMade).toBe(5);
    await p.ec2.advance(30_000);
    await p.deliver();
    await reap(p.ctx);
    expect((await p.ctx.store.minReadyState('small')).backoff?.failures ?? 0).toBe(0);
    // A failure after that starts again from the shortest wait.
    p.ec2.failLaunches({ code: 'InvalidAMIID.NotFound' });
    for (const id of ['t1', 't2', 't3', 't4', 't5']) await p.request(sqsEvent([req(id)]));
    expect((await p.ctx.store.minReadyState('small')).backoff).toMatchObject({ failures: 1 });
  });

  it('serves requests by shape from the instance types the label launches: a slot is the instance / max-parallel-jobs', async () => {
    const p = await pool();
    // small: m7g.2xlarge or m6g.2xlarge (8 vCPUs, 32 GiB) in 2 slots = 4 cores, 16 GiB each.
    const shaped = (id: string, shape: object) => JSON.stringify({ kind: 'request', id, shapes: [shape] });
    const out = await p.request(
      sqsEvent([
        shaped('fits', { cores: 4, memory: '16GiB' }),
        shaped('too-big', { cores: 4, memory: '17GiB' }),
      ]),
    );
    expect(out.batchItemFailures).toEqual([]); // the one nothing fits fails alone, recorded
    expect(p.ec2.live()).toHaveLength(1);
    await p.ec2.advance(30_000);
    await p.deliver();
    expect(await p.ctx.store.getRequest('fits')).toMatchObject({ state: 'fulfilled', labels: ['small'] });
    const tooBig = await p.ctx.store.getRequest('too-big');
    expect(tooBig?.state).toBe('failed');
    expect(tooBig?.reason).toContain("no label's slot fits shape 1 (4 cores, 17GiB memory)");
    expect(tooBig?.reason).toContain('"small" (4 cores, 16GiB memory)');
  });

  it("gives every ready node its backing label's contract, with per-slot users the user its instance's user data created for its slot", async () => {
    const p = await pool({
      keys: [ED25519_KEY],
      large: {
        username: 'zuul',
        'per-slot-users': true,
        'python-path': '/usr/bin/python3',
        'shell-type': 'sh',
      },
    });
    await p.request(sqsEvent([req('a'), req('b')]));
    // One instance for both slots, launched with a user per slot and the pool's key.
    const [run] = p.ec2.inputs('RunInstances');
    const userData = Buffer.from(String(run?.UserData), 'base64').toString('utf8');
    expect(userData).toContain('name: "zuul-0"');
    expect(userData).toContain('name: "zuul-1"');
    expect(userData).not.toContain('zuul-2');
    expect(userData).toContain(JSON.stringify(ED25519_KEY));
    await p.ec2.advance(30_000);
    await p.deliver();
    const contract = { connectionType: 'ssh', pythonPath: '/usr/bin/python3', shellType: 'sh' };
    const nodes = [
      (await p.ctx.store.getRequest('a'))?.nodes[0],
      (await p.ctx.store.getRequest('b'))?.nodes[0],
    ];
    expect(nodes.map((n) => n?.slot).sort()).toEqual([0, 1]);
    for (const n of nodes) {
      expect(n).toMatchObject({ state: 'ready', port: 22, username: `zuul-${n?.slot}`, ...contract });
    }
    // A node placed at once on the ready instance (the freed slot) gets that slot's user.
    const freed = nodes.find((n) => n?.id.startsWith('a/'));
    await p.request(sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'a/0' }), req('c')]));
    const c = (await p.ctx.store.getRequest('c'))?.nodes[0];
    expect(c).toMatchObject({
      state: 'ready',
      slot: freed?.slot,
      username: `zuul-${freed?.slot}`,
      ...contract,
    });
    expect(p.ec2.inputs('RunInstances')).toHaveLength(1);
  });

  it('never launches twice for a redelivered message', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('dup')]));
    await p.request(sqsEvent([req('dup')]));
    expect(p.ec2.instances).toHaveLength(1);
  });

  it('falls back to the next instance type on a capacity error', async () => {
    const p = await pool();
    p.ec2.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: 'm7g.2xlarge' });
    await p.request(sqsEvent([req('cap')]));
    const [instance] = p.ec2.instances;
    expect(instance?.instanceType).toBe('m6g.2xlarge');
  });

  it('makes requests wait, not fail, while a quota error pauses the pool', async () => {
    const p = await pool();
    p.ec2.failNextLaunches(1, 'VcpuLimitExceeded');
    const out = await p.request(sqsEvent([req('quota')]));
    expect(out.batchItemFailures).toHaveLength(1); // comes back later
    expect((await p.ctx.store.getRequest('quota'))?.state).toBe('requested');
    // Still paused: no EC2 call, still waiting.
    const calls = p.ec2.inputs('RunInstances').length;
    await p.request(sqsEvent([req('quota')], 2));
    expect(p.ec2.inputs('RunInstances').length).toBe(calls);
    // The pause ends: the same backing node is launched with the same token.
    p.clock.advance(5 * 60_000 + 1);
    await p.request(sqsEvent([req('quota')], 2));
    expect(p.ec2.live()).toHaveLength(1);
    expect((await p.ctx.store.getRequest('quota'))?.state).toBe('pending');
  });

  it('moves waiting nodes when their instance dies, and fails ready ones so their users learn it', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('r1')]));
    await p.ec2.advance(30_000);
    await p.deliver();
    const [first] = p.ec2.live();
    await p.request(sqsEvent([req('r2')])); // joins the ready instance
    expect((await p.ctx.store.getRequest('r2'))?.state).toBe('fulfilled');
    p.ec2.kill(first?.instanceId as string);
    await p.ec2.advance(10_000);
    await p.deliver();
    for (const id of ['r1', 'r2']) {
      expect((await p.ctx.store.getRequest(id))?.nodes[0]).toMatchObject({
        state: 'failed',
        reason: expect.stringContaining(first?.instanceId as string),
      });
    }
  });

  it('fails a request after launch-retries attempts that all fail, with the AWS message', async () => {
    const p = await pool({ retries: 2 });
    p.ec2.failLaunches({ code: 'InvalidAMIID.NotFound' });
    await p.request(sqsEvent([req('bad')]));
    const r = await p.ctx.store.getRequest('bad');
    expect(r?.state).toBe('failed');
    expect(r?.reason).toMatch(
      /failed to launch 2 time\(s\); last: launch of large failed: .*InvalidAMIID\.NotFound/,
    );
  });
});

describe("the reaper and placements within the invocation's time (issue 24)", () => {
  /** A Lambda invocation of the reaper with `ms` to run, on the pool's clock (what EC2's latency moves). */
  const invocation = (p: Pool, ms = 60_000) => invocationFor(p.clock, ms);
  const release = (id: string) => JSON.stringify({ kind: 'release', nodeId: id });

  /** `n` ready instances, each with both slots used by requests `<prefix>-<i>a` and `-<i>b`, then released. */
  async function idleInstances(p: Pool, n: number, prefix = 'idle'): Promise<void> {
    for (let i = 0; i < n; i++) await p.request(sqsEvent([req(`${prefix}-${i}a`), req(`${prefix}-${i}b`)]));
    await p.ec2.advance(30_000);
    await p.deliver();
    const ids = Array.from({ length: n }, (_, i) => [`${prefix}-${i}a/0`, `${prefix}-${i}b/0`]).flat();
    await p.request(sqsEvent(ids.map(release)));
    expect(p.ec2.live()).toHaveLength(n);
  }

  it('launches nothing once the invocation has no time left: a placement checks before it launches', async () => {
    const p = await pool();
    const late: Context = { ...p.ctx, deadline: { remainingMs: () => 0 } };
    await expect(
      requestNodes(late, { kind: 'request', id: 'late', labels: ['small'] }),
    ).rejects.toBeInstanceOf(DeadlineError);
    expect(p.ec2.inputs('RunInstances')).toEqual([]);
    expect(await p.ctx.store.listBacking()).toEqual([]);
    // The redelivery, with time, places it.
    expect((await p.request(sqsEvent([req('late')], 2))).batchItemFailures).toEqual([]);
    expect(p.ec2.live()).toHaveLength(1);
  });

  it('fills a large min-ready over several runs, each within its time, the rest deferred and no error', async () => {
    const p = await pool({ minReady: 24 });
    p.ec2.slowCalls(5_000, ['RunInstances']);
    const reaper = makeReaperHandler(p.ctx);
    const made: number[] = [];
    for (let run = 0; run < 6 && made.reduce((a, b) => a + b, 0) < 24; run++) {
      const start = p.clock.now();
      const report = await reaper(invocation(p));
      expect(report.errors).toEqual([]);
      // A launch starts only while the deadline (60 s less the safety margin) has time left: it ends in time.
      expect(p.clock.now() - start).toBeLessThanOrEqual(60_000);
      made.push(report.minReadyMade);
      if (made.reduce((a, b) => a + b, 0) < 24) expect(report.deferred).toBeGreaterThan(0);
      p.clock.advance(60_000 - (p.clock.now() - start)); // the schedule's next run
    }
    expect(made.reduce((a, b) => a + b, 0)).toBe(24);
    expect(made.length).toBeGreaterThan(1);
    // Two slots an instance: 12 instances, each launched once.
    expect(p.ec2.inputs('RunInstances')).toHaveLength(12);
  });

  it('retires idle backing nodes in batches: one TerminateInstances, one DescribeInstances to confirm', async () => {
    const p = await pool();
    await idleInstances(p, 3);
    p.clock.advance(61_000);
    p.ec2.resetCalls();
    const report = await reap(p.ctx);
    expect(report.retired).toHaveLength(3);
    expect(report.stopped.sort()).toEqual([...report.retired].sort());
    expect(p.ec2.inputs('TerminateInstances')).toEqual([
      { InstanceIds: expect.arrayContaining(p.ec2.instances.map((i) => i.instanceId)) },
    ]);
    // The reconciliation's list, and one look at the three after their terminate.
    expect(p.ec2.inputs('DescribeInstances')).toHaveLength(2);
    await p.ec2.advance(10_000);
    expect(p.ec2.live()).toEqual([]);
  });

  it('rotates its steps: a run whose time a burst of idle nodes used up leaves the later steps first to the next', async () => {
    const p = await pool();
    await idleInstances(p, 3);
    // A request that has waited past its request-timeout (3 h): the reaper's step 8 ends it.
    const old = p.clock.now() - 3 * 3600_000 - 1_000;
    await p.ctx.store.createRequest({
      id: 'stale',
      labels: ['small'],
      bodyHash: 'x',
      state: 'requested',
      createdAt: old,
      updatedAt: old,
      version: 0,
      nodes: [{ id: 'stale/0', label: 'small', state: 'requested' }],
    });
    p.clock.advance(61_000);
    // Terminating takes EC2 most of a run's time, every run.
    p.ec2.slowCalls(58_000, ['TerminateInstances']);
    const reaper = makeReaperHandler(p.ctx);
    const first = await reaper(invocation(p));
    expect(first.retired).toHaveLength(3);
    expect(first.deferred).toBeGreaterThan(0);
    expect(first.expiredRequests).toEqual([]);
    expect((await p.ctx.store.getRequest('stale'))?.state).toBe('requested');
    const second = await reaper(invocation(p));
    expect(second.expiredRequests).toEqual(['stale']);
    expect((await p.ctx.store.getRequest('stale'))?.state).toBe('failed');
    expect(second.errors).toEqual([]);
    // The retiring ones are finished as the runs come round to them again.
    p.ec2.slowCalls(0);
    await reaper(invocation(p));
    await reaper(invocation(p));
    expect((await p.ctx.store.listBacking()).map((b) => b.state)).toEqual(['stopped', 'stopped', 'stopped']);
  });
});

describe("EC2's eventual consistency: a new instance can be unknown to DescribeInstances for a while", () => {
  it('never fails an instance EC2 does not show yet, nor launches a second one, and uses it once shown', async () => {
    const p = await pool();
    p.ec2.notFoundAfterLaunchMs = 3 * 60_000;
    await p.request(sqsEvent([req('young')]));
    const [instance] = p.ec2.instances;
    const backingId = (await p.ctx.store.getRequest('young'))?.nodes[0]?.backingNodeId as string;
    // It boots; its `running` event comes while DescribeInstances still answers NotFound: retried.
    await p.ec2.advance(60_000);
    expect((await p.deliver())?.batchItemFailures).toEqual([{ itemIdentifier: 'm-1' }]);
    for (const _ of [1, 2]) {
      const report = await reap(p.ctx);
      expect(report.failed).toEqual([]);
      expect(report.errors).toEqual([]);
      p.clock.advance(60_000);
    }
    expect(p.ec2.inputs('RunInstances')).toHaveLength(1);
    expect(p.ec2.inputs('TerminateInstances')).toHaveLength(0);
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('launching');
    // EC2 shows it now: the reaper's reconciliation finds it running (the event was not taken).
    p.clock.advance(60_000);
    expect((await reap(p.ctx)).failed).toEqual([]);
    expect(await p.ctx.store.getRequest('young')).toMatchObject({
      state: 'fulfilled',
      nodes: [{ backingNodeId: backingId, host: instance?.privateIp }],
    });
    expect(p.ec2.instances).toHaveLength(1);
  });

  it('takes a recorded instance for gone once EC2 has not found it past the grace, asked twice', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('lost')]));
    const [instance] = p.ec2.instances;
    const id = instance?.instanceId as string;
    const backingId = (await p.ctx.store.getRequest('lost'))?.nodes[0]?.backingNodeId as string;
    p.ec2.hide(id); // EC2 has lost it for good
    p.clock.advance(RESOURCE_NOT_FOUND_GRACE_MS - 1_000);
    expect((await reap(p.ctx)).failed).toEqual([]);
    p.clock.advance(1_000);
    p.ec2.resetCalls();
    const report = await reap(p.ctx);
    expect(report.failed).toEqual([backingId]);
    // Asked twice before it was judged gone (and its node moved to a new instance).
    const calls = p.ec2.mock.calls().map((c) => c.args[0]);
    const relaunch = calls.findIndex((c) => c instanceof RunInstancesCommand);
    const asked = calls
      .slice(0, relaunch)
      .filter((c) => c instanceof DescribeInstancesCommand && c.input.InstanceIds?.includes(id));
    expect(asked).toHaveLength(2);
    // As for any vanished resource: the waiting node moves to a new instance.
    expect(report.moved).toBe(1);
    expect(p.ec2.inputs('RunInstances')).toHaveLength(1);
  });

  it('does not take a NotFound terminate of a young instance for done: terminates it once EC2 shows it', async () => {
    const p = await pool();
    p.ec2.notFoundAfterLaunchMs = 3 * 60_000;
    await p.request(sqsEvent([req('early')]));
    const [instance] = p.ec2.instances;
    const backingId = (await p.ctx.store.getRequest('early'))?.nodes[0]?.backingNodeId as string;
    await p.request(sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'early/0' })]));
    p.clock.advance(61_000); // grace-time 60 s
    const report = await reap(p.ctx);
    expect(report.retired).toEqual([backingId]);
    expect(report.stopped).toEqual([]);
    expect(report.errors).toEqual([]);
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('retiring');
    expect(p.ec2.instance(instance?.instanceId as string)?.state).toBe('running');
    p.clock.advance(2 * 60_000);
    expect((await reap(p.ctx)).stopped).toEqual([backingId]);
    expect(p.ec2.live()).toHaveLength(0);
  });
});

describe('the fulfil function and other instances in the region', () => {
  const foreign = 'i-0f0f0f0f0f0f0f0f0';
  const spotWarning = (instanceId: string) =>
    JSON.stringify({
      version: '0',
      'detail-type': 'EC2 Spot Instance Interruption Warning',
      source: 'aws.ec2',
      detail: { 'instance-id': instanceId, 'instance-action': 'terminate' },
    });

  it('ignores events for instances no backing node records without any EC2 call; ours still work', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('ours')]));
    const [instance] = p.ec2.instances;
    p.ec2.resetCalls();
    const events = (['pending', 'running', 'shutting-down', 'terminated'] as const).map((state) =>
      JSON.stringify(
        stateChangeEvent({ resourceId: foreign, state, source: 'aws.ec2', region: 'eu-west-1', at: 0 }),
      ),
    );
    const out = await p.fulfil(sqsEvent([...events, spotWarning(foreign)]));
    expect(out.batchItemFailures).toEqual([]);
    expect(p.ec2.mock.calls()).toHaveLength(0);
    // Our instance's events: `pending` needs no call, `running` one DescribeInstances (its address) and,
    // the functions being outside the VPC, one GetConsoleOutput (its host keys).
    await p.ec2.advance(30_000);
    await p.deliver();
    expect(p.ec2.mock.calls()).toHaveLength(2);
    expect(p.ec2.inputs('DescribeInstances')[0]?.InstanceIds).toEqual([instance?.instanceId]);
    expect(p.ec2.inputs('GetConsoleOutput')).toEqual([{ InstanceId: instance?.instanceId, Latest: true }]);
    expect((await p.ctx.store.getRequest('ours'))?.state).toBe('fulfilled');
  });

  it('confirms with EC2 that an instance is gone, or is spot, before failing its backing node on an event (issue 24, defect 6)', async () => {
    const p = await pool({ large: { 'use-spot': true } });
    await p.request(sqsEvent([req('ours')]));
    await p.ec2.advance(30_000);
    await p.deliver();
    const [instance] = p.ec2.instances;
    const id = instance?.instanceId as string;
    expect(instance?.spot).toBe(true);
    const backingId = (await p.ctx.store.getRequest('ours'))?.nodes[0]?.backingNodeId as string;
    // Events EC2 contradicts (the instance runs): stale, or not EC2's. One DescribeInstances each, no change.
    p.ec2.resetCalls();
    const gone = (['shutting-down', 'terminated', 'stopping', 'stopped'] as const).map((state) =>
      JSON.stringify(
        stateChangeEvent({ resourceId: id, state, source: 'aws.ec2', region: 'eu-west-1', at: 0 }),
      ),
    );
    expect((await p.fulfil(sqsEvent(gone))).batchItemFailures).toEqual([]);
    expect(p.ec2.inputs('DescribeInstances')).toEqual(Array(4).fill({ InstanceIds: [id] }));
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('ready');
    expect((await p.ctx.store.getRequest('ours'))?.nodes[0]?.state).toBe('ready');
    // A spot warning for it is taken once EC2 says it is a spot instance: its backing node fails.
    p.ec2.resetCalls();
    expect((await p.fulfil(sqsEvent([spotWarning(id)]))).batchItemFailures).toEqual([]);
    expect(p.ec2.inputs('DescribeInstances')).toEqual([{ InstanceIds: [id] }]);
    expect((await p.ctx.store.getRequest('ours'))?.nodes[0]).toMatchObject({
      state: 'failed',
      reason: expect.stringContaining('spot interruption warning'),
    });
    // EC2 ends it: the termination is confirmed and acted on (the backing node is failed already).
    p.ec2.kill(id);
    await p.ec2.advance(10_000);
    expect((await p.deliver())?.batchItemFailures).toEqual([]);
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('failed');
  });

  it('takes no spot warning for an on-demand instance, and acts on a termination EC2 confirms', async () => {
    const p = await pool();
    await p.request(sqsEvent([req('plain')]));
    await p.ec2.advance(30_000);
    await p.deliver();
    const id = p.ec2.instances[0]?.instanceId as string;
    expect((await p.fulfil(sqsEvent([spotWarning(id)]))).batchItemFailures).toEqual([]);
    expect((await p.ctx.store.getRequest('plain'))?.nodes[0]?.state).toBe('ready');
    // The termination EC2 reports: confirmed by DescribeInstances (terminated), the node fails.
    p.ec2.kill(id);
    await p.ec2.advance(10_000);
    p.ec2.resetCalls();
    expect((await p.deliver())?.batchItemFailures).toEqual([]);
    expect(p.ec2.inputs('DescribeInstances').length).toBeGreaterThan(0);
    expect((await p.ctx.store.getRequest('plain'))?.nodes[0]).toMatchObject({
      state: 'failed',
      reason: `backing resource ${id} is shutting-down`, // its first event, confirmed
    });
  });

  it("forgets an instance's pointer once its backing node is stopped", async () => {
    const p = await pool();
    await p.request(sqsEvent([req('gone')]));
    const id = p.ec2.instances[0]?.instanceId as string;
    await p.ec2.advance(30_000);
    await p.deliver();
    expect(await p.ctx.store.backingIdOfResource(id)).toBeDefined();
    await p.request(sqsEvent([JSON.stringify({ kind: 'release', nodeId: 'gone/0' })]));
    await p.ec2.advance(61_000);
    await p.deliver();
    expect((await reap(p.ctx)).stopped).toHaveLength(1);
    expect(await p.ctx.store.backingIdOfResource(id)).toBeUndefined();
  });
});

describe('host keys from the console output: the functions outside the VPC cannot scan an instance', () => {
  /** The `running` event of the pool's one instance, delivered again (as SQS does after a failure). */
  const redeliverRunning = (p: Pool) => {
    const running = p.ec2.events.filter((e) => e.detail.state === 'running');
    return p.fulfil(sqsEvent(running.map((e) => JSON.stringify(e))));
  };

  it('hands no node out until the console shows the host keys, then nodes carry exactly those keys', async () => {
    const p = await pool({ consoleDelayMs: 90_000 });
    await p.request(sqsEvent([req('keys')]));
    const [instance] = p.ec2.instances;
    const id = instance?.instanceId as string;
    await p.ec2.advance(30_000); // running; cloud-init prints the keys 90 s later
    expect((await p.deliver())?.batchItemFailures).toHaveLength(1); // comes back: no keys yet
    const waiting = await p.ctx.store.getRequest('keys');
    expect(waiting).toMatchObject({ state: 'pending', nodes: [{ state: 'pending' }] });
    expect(waiting?.nodes[0]?.hostKeys).toBeUndefined();
    // The event comes back a minute later: still none.
    p.clock.advance(60_000);
    expect((await redeliverRunning(p)).batchItemFailures).toHaveLength(1);
    expect((await p.ctx.store.getRequest('keys'))?.state).toBe('pending');
    // Once printed, the reaper's readying step (or the next delivery) makes it ready.
    p.clock.advance(30_000);
    expect((await reap(p.ctx)).failed).toEqual([]);
    const ready = await p.ctx.store.getRequest('keys');
    expect(ready?.state).toBe('fulfilled');
    expect(ready?.nodes[0]?.hostKeys).toEqual(p.ec2.hostKeysOf(id));
    expect(ready?.nodes[0]?.hostKeys).toHaveLength(1);
    expect(p.ec2.inputs('GetConsoleOutput').every((i) => i.InstanceId === id && i.Latest === true)).toBe(
      true,
    );
  });

  it('with a network path: scans once at ready (host-keys: scan), or checks the scan against the console', async () => {
    const scanned = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFGhuIUcOMbB0uu48laquLMTmgVmLN+ez3bxc/QZZfdV';
    const scans: string[] = [];
    const scanHostKeys = async (host: string) => {
      scans.push(host);
      return [scanned];
    };
    const scan = await pool({
      context: { hostKeyPlan: () => ({ source: 'scan', reachable: true }), scanHostKeys },
    });
    await scan.request(sqsEvent([req('scanned')]));
    await scan.ec2.advance(30_000);
    await scan.deliver();
    expect(await scan.ctx.store.getRequest('scanned')).toMatchObject({
      state: 'fulfilled',
      nodes: [{ hostKeys: [scanned] }],
    });
    expect(scans).toEqual([scan.ec2.instances[0]?.privateIp]);
    expect(scan.ec2.inputs('GetConsoleOutput')).toEqual([]);
    // host-key-checking with console keys and a path: a scan answering another key fails the backing node.
    const both = await pool({
      retries: 1,
      hostKeyChecking: true,
      context: { hostKeyPlan: () => ({ source: 'console', reachable: true }), scanHostKeys },
    });
    await both.request(sqsEvent([req('mismatch')]));
    const backingId = (await both.ctx.store.getRequest('mismatch'))?.nodes[0]?.backingNodeId as string;
    await both.ec2.advance(30_000);
    await both.deliver();
    const ip = both.ec2.instances[0]?.privateIp;
    const reason = `host-key scan failed: ${ip}:22 answered with a host key its console output does not list`;
    expect(await both.ctx.store.getBacking(backingId)).toMatchObject({ state: 'failed', reason });
    expect((await both.ctx.store.getRequest('mismatch'))?.state).toBe('failed');
  });

  it('fails the backing node with the reason when no host keys show by boot-timeout', async () => {
    const p = await pool({ consoleHostKeys: false, retries: 1 });
    await p.request(sqsEvent([req('silent')]));
    const id = p.ec2.instances[0]?.instanceId as string;
    const backingId = (await p.ctx.store.getRequest('silent'))?.nodes[0]?.backingNodeId as string;
    await p.ec2.advance(30_000);
    expect((await p.deliver())?.batchItemFailures).toHaveLength(1);
    p.clock.advance(119_000);
    expect((await redeliverRunning(p)).batchItemFailures).toHaveLength(1); // within boot-timeout (120 s)
    p.clock.advance(1_000);
    expect((await redeliverRunning(p)).batchItemFailures).toEqual([]);
    const reason = `boot-timeout of 120s exceeded: no SSH host keys in the console output of ${id} (cloud-init prints them at boot; see host-keys in docs/aws.md)`;
    expect(await p.ctx.store.getBacking(backingId)).toMatchObject({ state: 'failed', reason });
    expect(await p.ctx.store.getRequest('silent')).toMatchObject({
      state: 'failed',
      nodes: [{ state: 'failed', reason: expect.stringContaining(reason) }],
    });
  });

  /** Plays the fulfil queue: each copy the handler sent back is delivered when its delay is up. */
  const playResent = async (p: Pool): Promise<number[]> => {
    const delays: number[] = [];
    for (let copy = p.resent.shift(); copy; copy = p.resent.shift()) {
      delays.push(copy.seconds);
      p.clock.set(copy.dueAt);
      expect((await p.fulfil(sqsEvent([copy.body]))).batchItemFailures).toEqual([]);
    }
    return delays;
  };

  it('tries a running backing node again within seconds while its console shows no keys, not after the queue timeout (issue 40, defect 2)', async () => {
    const p = await pool({ consoleDelayMs: 75_000, resend: true });
    await p.request(sqsEvent([req('quick')]));
    const backingId = (await p.ctx.store.getRequest('quick'))?.nodes[0]?.backingNodeId as string;
    await p.ec2.advance(30_000); // running; cloud-init prints the keys 75 s later
    const runningAt = p.clock.now();
    // Not ready yet: the event is consumed, and a copy of it comes back 2 s later (not after 180 s).
    expect((await p.deliver())?.batchItemFailures).toEqual([]);
    expect(p.resent.map((c) => c.seconds)).toEqual([2]);
    // Each try waits twice as long as the node has waited so far (2, 4, 8 s...), at most 10 s: the
    // node is ready within 10 s of its keys showing, with no reaper run.
    const delays = await playResent(p);
    expect(delays).toEqual([2, 2, 4, 8, 10, 10, 10, 10, 10, 10]);
    const ready = await p.ctx.store.getBacking(backingId);
    expect(ready?.state).toBe('ready');
    const afterKeys = (ready?.readyAt as number) - (runningAt + 75_000);
    expect(afterKeys).toBeGreaterThanOrEqual(0);
    expect(afterKeys).toBeLessThanOrEqual(10_000);
    expect(await p.ctx.store.getRequest('quick')).toMatchObject({
      state: 'fulfilled',
      nodes: [{ hostKeys: p.ec2.hostKeysOf(p.ec2.instances[0]?.instanceId as string) }],
    });
  });

  it('stops trying again once boot-timeout has passed: the last try comes when it passes, and fails the backing node', async () => {
    const p = await pool({ consoleHostKeys: false, retries: 1, resend: true });
    await p.request(sqsEvent([req('never')]));
    const backingId = (await p.ctx.store.getRequest('never'))?.nodes[0]?.backingNodeId as string;
    await p.ec2.advance(30_000);
    const runningAt = p.clock.now();
    expect((await p.deliver())?.batchItemFailures).toEqual([]);
    const delays = await playResent(p);
    // 2, 2, 4, 8, then every 10 s up to 116 s; the last waits the 4 s left of the 120 s boot-timeout.
    expect(delays).toEqual([2, 2, 4, 8, ...Array(10).fill(10), 4]);
    expect(p.clock.now() - runningAt).toBe(120_000);
    expect(await p.ctx.store.getBacking(backingId)).toMatchObject({
      state: 'failed',
      reason: expect.stringContaining(
        'boot-timeout of 120s exceeded: no SSH host keys in the console output',
      ),
    });
    expect(p.resent).toEqual([]);
  });

  it('keeps a backing node the reaper readied in the same run past its boot-timeout: its keys showed in time', async () => {
    const p = await pool({ consoleDelayMs: 100_000 });
    await p.request(sqsEvent([req('late-seen')]));
    const backingId = (await p.ctx.store.getRequest('late-seen'))?.nodes[0]?.backingNodeId as string;
    await p.ec2.advance(30_000);
    expect((await p.deliver())?.batchItemFailures).toHaveLength(1); // no keys yet; its event comes back later
    // The keys show 100 s after running; the next look is a reaper run at 125 s, past the 120 s boot-timeout.
    p.clock.advance(125_000);
    const report = await reap(p.ctx);
    expect(report.failed).toEqual([]);
    expect((await p.ctx.store.getBacking(backingId))?.state).toBe('ready');
    expect((await p.ctx.store.getRequest('late-seen'))?.state).toBe('fulfilled');
  });

  it('leaves the event to the queue (a failed record) when it cannot be sent back', async () => {
    const p = await pool({ consoleDelayMs: 75_000 });
    const fulfil = makeFulfilHandler(p.ctx, {
      retryLater: async () => {
        throw new Error('no route to SQS');
      },
    });
    await p.request(sqsEvent([req('stuck')]));
    await p.ec2.advance(30_000);
    await p.ec2.settled();
    const running = p.ec2.events.filter((e) => e.detail.state === 'running');
    expect((await fulfil(sqsEvent(running.map((e) => JSON.stringify(e))))).batchItemFailures).toHaveLength(1);
  });
});
