import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { GetParameterCommand, ListCommandsCommand, SSMClient } from '@aws-sdk/client-ssm';
import { sign } from '@octokit/webhooks-methods';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import type { GithubSettings } from '../../shared/core/model.ts';
import { GithubApi, WRITE_INTERVAL_MS } from '../../shared/github/githubApi.ts';
import { jobRequestId } from '../../shared/github/webhook.ts';
import {
  makeGithubRunnerHandler,
  SSM_STATUS_DETAIL_TYPE,
} from '../../shared/handlers/githubRunnerHandler.ts';
import { makeGithubScheduleHandler } from '../../shared/handlers/githubScheduleHandler.ts';
import {
  type FunctionUrlRequest,
  makeGithubWebhookHandler,
} from '../../shared/handlers/githubWebhookHandler.ts';
import { SsmRunnerChannel } from '../../shared/providers/aws/ssmRunners.ts';
import { webhookSecrets } from '../../shared/runtime/githubRuntime.ts';
import { GithubItems } from '../../shared/store/githubItems.ts';
import { parseSeed, Random } from '../../testkit/chaosRandom.ts';
import { poolConfig, smallNode } from '../../testkit/configs.ts';
import { jobPayload } from '../../testkit/githubPool.ts';
import { GithubStandIn } from '../../testkit/githubStandIn.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';
import { describeWithMoto, MOTO_CREDENTIALS, type Moto, startMoto } from '../../testkit/moto.ts';
import { onPath } from '../../testkit/onPath.ts';

/**
 * The github function on AWS (docs/github.md, "On AWS"), its handlers run against real engines: the
 * embedded pool's table (dynalite) and request queue (fauxqs) with local backing nodes, SSM on moto_server
 * (the SecureString parameter and the Run Command request, as AWS's wire protocol takes them), GitHub's
 * API as its documentation shapes it (testkit/githubStandIn.ts), and the runner script an instance's SSM
 * agent would run, run here by sh with the real AWS CLI against moto. What moto cannot do (run the
 * command on an instance, publish its status event), the test does: it runs the script the command
 * carries and hands the handler the event SSM documents.
 */

const execFileP = promisify(execFile);
/** Running the instance's script needs root (a passwd of its own, bound over /etc's) and the AWS CLI. */
const noInstance =
  process.getuid?.() !== 0 ? 'needs root' : onPath('aws') ? undefined : 'the AWS CLI (aws) is not installed';
if (noInstance !== undefined && process.env.METASTATIC_REQUIRE_MOTO === '1') {
  throw new Error(`METASTATIC_REQUIRE_MOTO=1 but the runner script cannot run here: ${noInstance}`);
}
const RUNNER = join(import.meta.dirname, '../../testkit/standInRunner.sh');
const SECRET = 'webhook secret';
const REGION = 'us-east-1';
const PARAMETER_PATH = '/metastatic/test/github/jit';
const JOB_LABELS = ['self-hosted', 'linux', 'small'];
/** Seed 1 in `npm test`; more with METASTATIC_GITHUB_CHAOS_SEEDS=1,2,3 (as the embedded GitHub chaos test). */
const CHAOS_SEEDS = (process.env.METASTATIC_GITHUB_CHAOS_SEEDS ?? '1').split(',').map((s) => parseSeed(s));

describeWithMoto('the github function', () => {
  let moto: Moto;
  let github: GithubStandIn;
  let harness: Harness;
  let settings: GithubSettings;
  let items: GithubItems;
  let ssm: SSMClient;
  let webhook: (e: FunctionUrlRequest) => Promise<{ statusCode: number; body: string }>;
  let runners: ReturnType<typeof makeGithubRunnerHandler>;
  let api: GithubApi;
  let deliveries = 0;
  const stopped: { commandId: string; instanceId: string }[] = [];

  beforeAll(async () => {
    moto = await startMoto();
    github = await GithubStandIn.start();
    ssm = new SSMClient({ region: REGION, endpoint: moto.endpoint, credentials: MOTO_CREDENTIALS });
  }, 60_000);

  afterAll(async () => {
    await github?.close();
    await moto?.stop();
  });

  beforeEach(async (ctx) => {
    const config = parseConfigOrThrow(
      poolConfig({
        top: {
          github: {
            'api-url': github.url,
            'app-id': github.appId,
            'installation-id': 77,
            'runner-command': `sh ${RUNNER} --jitconfig "$METASTATIC_JITCONFIG"`,
            'idle-timeout': 300,
            routes: [{ 'runs-on': ['self-hosted', 'linux', 'small'], label: 'small-node', lease: 3600 }],
          },
        },
        meta: { labels: [smallNode({ 'max-parallel-jobs': 2 })] },
      }),
      'github.yaml',
    );
    harness = await startHarness(config);
    settings = config.github as GithubSettings;
    items = new GithubItems(harness.pool.dynamodb, harness.pool.info.tableName, () => harness.clock.now());
    webhook = makeGithubWebhookHandler({
      settings,
      secrets: async () => webhookSecrets(`old secret\n${SECRET}\n`),
      items,
      send: async (messages) => {
        for (const m of messages) await harness.send(m);
      },
      log: silentLog,
    });
    api = new GithubApi(settings, github.privateKeyPem);
    const channel = new SsmRunnerChannel(ssm);
    stopped.length = 0;
    runners = makeGithubRunnerHandler(harness.pool.context, {
      settings,
      api: async () => api,
      items,
      channel: {
        start: (input) => channel.start(input),
        forget: (name) => channel.forget(name),
        // moto 5.2.1 does not implement CancelCommand (NotImplementedError): the exact request is recorded.
        stop: async (commandId, instanceId) => {
          stopped.push({ commandId, instanceId });
        },
      },
      region: REGION,
      parameterPath: PARAMETER_PATH,
    });
    ctx.onTestFinished(() => harness.close());
  }, 60_000);

  async function deliver(body: string, opts: { secret?: string; delivery?: string; event?: string } = {}) {
    deliveries += 1;
    const signature = await sign(opts.secret ?? SECRET, body);
    return webhook({
      requestContext: { http: { method: 'POST', path: '/' } },
      headers: {
        'x-github-event': opts.event ?? 'workflow_job',
        'x-github-delivery': opts.delivery ?? `d-${deliveries}`,
        'x-hub-signature-256': signature,
      },
      // As a function URL passes a JSON body: text, not base64.
      body,
      isBase64Encoded: false,
    });
  }

  /** The request queue's messages, drained into the pool; the request's record after. */
  async function requestOf(jobId: number) {
    await harness.drainRequests();
    return harness.pool.context.store.getRequest(jobRequestId(jobId));
  }

  /** The pool's event of a request (events.jsonl holds them in EventBridge's shape). */
  async function poolEvent(type: string, requestId: string): Promise<string> {
    const lines = (await readFile(join(harness.pool.info.stateDir, 'events.jsonl'), 'utf8')).split('\n');
    const line = lines.find((l) => l.includes(`"${type}"`) && l.includes(`"requestId":"${requestId}"`));
    if (!line) throw new Error(`no ${type} event for ${requestId}`);
    return line;
  }

  it('refuses a bad signature, a wrong shape and a replay, ignores an unrouted job, and loses no valid delivery around them', async () => {
    const bad = await deliver(jobPayload('queued', 1, JOB_LABELS), { secret: 'not the secret' });
    expect(bad.statusCode).toBe(401);
    const shape = await deliver(JSON.stringify({ action: 'queued', workflow_job: { id: 'x' } }));
    expect(shape.statusCode).toBe(400);
    expect(shape.body).toMatch(/not a workflow_job payload: workflow_job\.id/);
    const unrouted = await deliver(jobPayload('queued', 2, ['self-hosted', 'gpu']));
    expect(unrouted).toMatchObject({ statusCode: 202, body: expect.stringMatching(/ignored: no route/) });
    const ok = await deliver(jobPayload('queued', 3, JOB_LABELS), { delivery: 'same' });
    expect(ok.statusCode).toBe(202);
    // Signed with the old secret (rotation) and a replay of a delivery id: the replay is dropped.
    expect((await deliver(jobPayload('queued', 4, JOB_LABELS), { secret: 'old secret' })).statusCode).toBe(
      202,
    );
    expect((await deliver(jobPayload('queued', 5, JOB_LABELS), { delivery: 'same' })).body).toMatch(
      /seen already/,
    );
    await harness.drainRequests();
    const store = harness.pool.context.store;
    expect(await store.getRequest(jobRequestId(1))).toBeUndefined();
    expect(await store.getRequest(jobRequestId(2))).toBeUndefined();
    expect(await store.getRequest(jobRequestId(5))).toBeUndefined();
    const three = await store.getRequest(jobRequestId(3));
    expect(three).toMatchObject({
      labels: ['small-node'],
      requestor: 'github:Codertocat/Hello-World',
      lease: 300,
    });
    expect(await store.getRequest(jobRequestId(4))).toBeDefined();
  });

  it.skipIf(noInstance !== undefined)(
    'starts one runner per job on its node through SSM, the JIT configuration only in a SecureString, and releases the node when the command ends',
    async (ctx) => {
      expect((await deliver(jobPayload('queued', 10, JOB_LABELS))).statusCode).toBe(202);
      await requestOf(10);
      const requestId = jobRequestId(10);
      await harness.fulfilUntil(
        async () => (await harness.pool.context.store.getRequest(requestId))?.state === 'fulfilled',
      );
      const event = await poolEvent('Request Fulfilled', requestId);
      // EventBridge and SQS deliver at least once: two copies handled at once start one runner; the one
      // that found the other starting it comes back (a batch item failure), and then finds it started.
      const out = await runners(sqsEvent([event, event]));
      expect(out.batchItemFailures.length).toBeLessThanOrEqual(1);
      expect((await runners(sqsEvent([event]))).batchItemFailures).toEqual([]);
      const commands = (await ssm.send(new ListCommandsCommand({}))).Commands ?? [];
      const ours = commands.filter((c) => c.Comment?.includes('GitHub job 10'));
      expect(ours).toHaveLength(1);
      const command = ours[0];
      const request = await harness.pool.context.store.getRequest(requestId);
      const node = request?.nodes[0];
      const backing = await harness.pool.context.store.getBacking(node?.backingNodeId ?? '');
      expect(command?.InstanceIds).toEqual([backing?.resourceId]);
      expect(command?.DocumentName).toBe('AWS-RunShellScript');
      const script = command?.Parameters?.commands?.[0] ?? '';
      const runnerName = `${requestId}-0`;
      const jit = github.issued.get(runnerName);
      expect(jit).toBeDefined();
      expect(script).not.toContain(jit);
      const parameterName = `${PARAMETER_PATH}/${requestId}`;
      expect(script).toContain(parameterName);
      const stored = await ssm.send(new GetParameterCommand({ Name: parameterName, WithDecryption: true }));
      expect(stored.Parameter).toMatchObject({ Type: 'SecureString', Value: jit });

      // The instance's part: the script, run by sh as root (as SSM's agent runs it), with the real AWS CLI
      // reading and deleting the parameter on moto, starts the runner as the node's user.
      // The node's user (the local backing node's slot0) is made on this machine for the script only: a
      // passwd and group file of its own bound over /etc's in a mount namespace.
      const etc = await mkdtemp(join(tmpdir(), 'metastatic-etc-'));
      ctx.onTestFinished(() => rm(etc, { recursive: true, force: true }));
      const user = node?.username ?? '';
      await writeFile(
        join(etc, 'passwd'),
        `${await readFile('/etc/passwd', 'utf8')}${user}:x:64000:64000::/nonexistent:/bin/sh\n`,
      );
      await writeFile(join(etc, 'group'), `${await readFile('/etc/group', 'utf8')}${user}:x:64000:\n`);
      const bind = `mount --bind ${etc}/passwd /etc/passwd && mount --bind ${etc}/group /etc/group && exec sh -c "$1"`;
      const ran = execFileP(
        'unshare',
        ['--mount', '--propagation', 'private', 'sh', '-c', bind, 'sh', script],
        {
          env: {
            PATH: process.env.PATH,
            AWS_ENDPOINT_URL: moto.endpoint,
            AWS_ACCESS_KEY_ID: MOTO_CREDENTIALS.accessKeyId,
            AWS_SECRET_ACCESS_KEY: MOTO_CREDENTIALS.secretAccessKey,
            AWS_DEFAULT_REGION: REGION,
          },
        },
      );
      const started = await github.runnerStarted(runnerName);
      expect(started.jitconfig).toBe(jit);
      expect(started.user).toBe(node?.username);
      await expect(ssm.send(new GetParameterCommand({ Name: parameterName }))).rejects.toThrow(
        /ParameterNotFound|not found/i,
      );
      github.finishJob(runnerName);
      await ran;

      const status = {
        version: '0',
        id: 'ssm-1',
        source: 'aws.ssm',
        'detail-type': SSM_STATUS_DETAIL_TYPE,
        detail: {
          'command-id': command?.CommandId,
          'instance-id': backing?.resourceId,
          status: 'Success',
          'document-name': 'AWS-RunShellScript',
        },
      };
      expect((await runners(sqsEvent([JSON.stringify(status)]))).batchItemFailures).toEqual([]);
      const after = await harness.pool.context.store.getRequest(requestId);
      expect(after?.nodes.map((n) => n.state)).toEqual(['released']);
    },
  );

  it('gives the start back when it fails (SSM unreachable), so the record, back, starts the runner at once; none on a node released meanwhile', async () => {
    let failures = 1;
    const flaky = makeGithubRunnerHandler(harness.pool.context, {
      settings,
      api: async () => api,
      items,
      channel: {
        start: async (input) => {
          if (failures-- > 0) throw new Error('SSM is unreachable');
          return new SsmRunnerChannel(ssm).start(input);
        },
        forget: async () => {},
        stop: async () => {},
      },
      region: REGION,
      parameterPath: PARAMETER_PATH,
    });
    await deliver(jobPayload('queued', 60, JOB_LABELS));
    await requestOf(60);
    const requestId = jobRequestId(60);
    await harness.fulfilUntil(
      async () => (await harness.pool.context.store.getRequest(requestId))?.state === 'fulfilled',
    );
    const event = await poolEvent('Request Fulfilled', requestId);
    expect((await flaky(sqsEvent([event]))).batchItemFailures).toHaveLength(1);
    // Back at once, not after the 180 s a dead handling's claim is kept.
    expect((await flaky(sqsEvent([event]))).batchItemFailures).toEqual([]);
    const mine = ((await ssm.send(new ListCommandsCommand({}))).Commands ?? []).filter((c) =>
      c.Comment?.endsWith('GitHub job 60'),
    );
    expect(mine).toHaveLength(1);

    // A job whose node was released before its event was handled (a lapsed lease) gets no runner.
    await deliver(jobPayload('queued', 61, JOB_LABELS));
    await requestOf(61);
    const other = jobRequestId(61);
    await harness.fulfilUntil(
      async () => (await harness.pool.context.store.getRequest(other))?.state === 'fulfilled',
    );
    await harness.send({ kind: 'release', id: other });
    await harness.drainRequests();
    expect(
      (await runners(sqsEvent([await poolEvent('Request Fulfilled', other)]))).batchItemFailures,
    ).toEqual([]);
    const none = ((await ssm.send(new ListCommandsCommand({}))).Commands ?? []).filter((c) =>
      c.Comment?.endsWith('GitHub job 61'),
    );
    expect(none).toEqual([]);
  });

  it('a job that completed first gets no request; one that completed before its runner started gets no runner', async () => {
    expect((await deliver(jobPayload('completed', 20, JOB_LABELS))).statusCode).toBe(202);
    expect((await deliver(jobPayload('queued', 20, JOB_LABELS))).body).toMatch(/out of order/);
    expect((await requestOf(20))?.state).toBe('failed'); // recorded as cancelled before it was received

    await deliver(jobPayload('queued', 21, JOB_LABELS));
    await requestOf(21);
    const requestId = jobRequestId(21);
    await harness.fulfilUntil(
      async () => (await harness.pool.context.store.getRequest(requestId))?.state === 'fulfilled',
    );
    await deliver(jobPayload('completed', 21, JOB_LABELS, 'someone-else'));
    await harness.drainRequests();
    const before = (await ssm.send(new ListCommandsCommand({}))).Commands?.length ?? 0;
    await runners(sqsEvent([await poolEvent('Request Fulfilled', requestId)]));
    expect((await ssm.send(new ListCommandsCommand({}))).Commands?.length ?? 0).toBe(before);
    const after = await harness.pool.context.store.getRequest(requestId);
    expect(after?.nodes.map((n) => n.state)).toEqual(['released']);
  });

  it('a runner that took no job within idle-timeout is stopped: the lease lapses, the reaper releases the node, and its release cancels the command', async () => {
    await deliver(jobPayload('queued', 40, JOB_LABELS));
    await requestOf(40);
    const requestId = jobRequestId(40);
    await harness.fulfilUntil(
      async () => (await harness.pool.context.store.getRequest(requestId))?.state === 'fulfilled',
    );
    expect(
      (await runners(sqsEvent([await poolEvent('Request Fulfilled', requestId)]))).batchItemFailures,
    ).toEqual([]);
    const command = ((await ssm.send(new ListCommandsCommand({}))).Commands ?? []).find((c) =>
      c.Comment?.includes('GitHub job 40'),
    );
    expect(command?.CommandId).toBeDefined();
    harness.clock.advance(301_000); // idle-timeout 300 s: no in_progress renewed the lease
    expect((await harness.pool.reapNow()).leasesExpired).toEqual([requestId]);
    expect((await harness.pool.context.store.getRequest(requestId))?.nodes.map((n) => n.state)).toEqual([
      'released',
    ]);
    expect(
      (await runners(sqsEvent([await poolEvent('Node Released', requestId)]))).batchItemFailures,
    ).toEqual([]);
    expect(stopped).toEqual([{ commandId: command?.CommandId, instanceId: command?.InstanceIds?.[0] }]);
    const parameter = `${PARAMETER_PATH}/${requestId}`;
    await expect(ssm.send(new GetParameterCommand({ Name: parameter }))).rejects.toThrow(
      /ParameterNotFound|not found/i,
    );
  });

  it.each(CHAOS_SEEDS)(
    'chaos (seed %i): webhooks twice or out of order, events twice, runners ending anywhere: one runner per job at most, none after its job completed, no node held once every job completed',
    async (seed) => {
      const random = new Random(seed);
      const jobs = Array.from({ length: 6 }, (_, i) => seed * 1000 + i + 1);
      // Each job's deliveries, in GitHub's order, then some completed moved first (out of order), and
      // the whole interleaved; a delivery may come twice (GitHub's redelivery keeps its id).
      const completedFirst = new Set(jobs.filter(() => random.chance(0.25)));
      const perJob = jobs.map((job) => {
        const actions = ['queued', ...(random.chance(0.5) ? ['in_progress'] : []), 'completed'];
        if (completedFirst.has(job)) actions.unshift(actions.pop() as string);
        return actions.map((action, k) => ({ job, action, id: `c${job}-${k}` }));
      });
      const schedule: { job: number; action: string; id: string }[] = [];
      while (perJob.some((l) => l.length > 0)) {
        const list = random.pick(perJob.filter((l) => l.length > 0));
        const next = list.shift() as { job: number; action: string; id: string };
        schedule.push(next);
        if (random.chance(0.3)) schedule.push(next);
      }
      const fed = new Set<string>();
      const ended = new Set<string>();
      /** Every pool event not fed yet goes to the runner handler, some twice; a failed one comes back. */
      async function feedEvents() {
        const lines = (await readFile(join(harness.pool.info.stateDir, 'events.jsonl'), 'utf8'))
          .split('\n')
          .filter((l) => l.includes('github-job-') && !fed.has(l));
        for (const line of lines) {
          fed.add(line);
          const copies = random.chance(0.3) ? [line, line] : [line];
          const out = await runners(sqsEvent(copies));
          if (out.batchItemFailures.length > 0) await runners(sqsEvent([line]));
        }
      }
      /** Runners whose command SSM has, ending (their status event) with some chance, or always. */
      async function endRunners(always: boolean) {
        const commands = (await ssm.send(new ListCommandsCommand({}))).Commands ?? [];
        for (const c of commands) {
          const job = Number(/GitHub job (\d+)$/.exec(c.Comment ?? '')?.[1]);
          if (!jobs.includes(job) || ended.has(c.CommandId ?? '') || !(always || random.chance(0.4)))
            continue;
          ended.add(c.CommandId ?? '');
          const status = {
            source: 'aws.ssm',
            'detail-type': SSM_STATUS_DETAIL_TYPE,
            detail: {
              'command-id': c.CommandId,
              'instance-id': c.InstanceIds?.[0],
              status: random.pick(['Success', 'Failed', 'Cancelled']),
            },
          };
          await runners(
            sqsEvent(
              random.chance(0.3)
                ? [JSON.stringify(status), JSON.stringify(status)]
                : [JSON.stringify(status)],
            ),
          );
        }
      }
      const settled = async () => {
        const requests = await Promise.all(
          jobs.map((j) => harness.pool.context.store.getRequest(jobRequestId(j))),
        );
        return requests.every((r) => !r || r.state === 'fulfilled' || r.state === 'failed');
      };
      for (const d of schedule) {
        const runnerName = d.action === 'queued' ? null : `${jobRequestId(d.job)}-0`;
        const answer = await deliver(jobPayload(d.action, d.job, JOB_LABELS, runnerName), { delivery: d.id });
        expect(answer.statusCode).toBeLessThan(300);
        await harness.drainRequests();
        await harness.fulfilUntil(settled);
        await feedEvents();
        await endRunners(false);
        await harness.drainRequests();
        await feedEvents();
      }
      // Every job completed: its runner exits (the ones still running), and one reaper run later nothing
      // of any job is held.
      await endRunners(true);
      harness.clock.advance(301_000);
      await harness.pool.reapNow();
      await harness.drainRequests();
      await feedEvents();
      const commands = ((await ssm.send(new ListCommandsCommand({}))).Commands ?? []).filter((c) =>
        jobs.includes(Number(/GitHub job (\d+)$/.exec(c.Comment ?? '')?.[1])),
      );
      for (const job of jobs) {
        const mine = commands.filter((c) => c.Comment?.endsWith(`GitHub job ${job}`));
        // Each delivery is handled before the next comes: a job queued before it completed got its node,
        // and its runner, before its completed arrived; one that completed first got neither.
        const want = completedFirst.has(job) ? 0 : 1;
        expect(mine.length, `job ${job}: ${want} runner(s)`).toBe(want);
        const r = await harness.pool.context.store.getRequest(jobRequestId(job));
        const held = r?.nodes.filter((n) => n.state === 'ready' || n.state === 'pending') ?? [];
        expect(held, `job ${job}: no node held`).toEqual([]);
      }
    },
    120_000,
  );

  it('its schedule requests a node for a job GitHub never sent a webhook for, once its webhook had a minute; one scan per queued-scan-interval', async () => {
    const schedule = makeGithubScheduleHandler({
      settings,
      items,
      send: async (messages) => {
        for (const m of messages) await harness.send(m);
      },
      api: async () => api,
      log: silentLog,
    });
    const now = harness.clock.now();
    const job = (id: number, ageMs: number) => ({
      id,
      repository: 'Codertocat/Hello-World',
      runId: 50,
      labels: JOB_LABELS,
      status: 'queued' as const,
      createdAt: new Date(now - ageMs).toISOString(),
    });
    // 50 has waited two minutes with no webhook; 51 only seconds (its webhook may still come); 52 was
    // delivered: the pool knows it.
    github.queuedJobs.push(job(50, 120_000), job(51, 5_000), job(52, 120_000));
    try {
      await deliver(jobPayload('queued', 52, JOB_LABELS));
      expect(await schedule(now)).toEqual({ redelivered: 0, requested: 1 });
      expect((await requestOf(50))?.labels).toEqual(['small-node']);
      expect(await requestOf(51)).toBeUndefined();
      // Another run within queued-scan-interval (600 s) scans nothing, in whatever container.
      expect(await schedule(now + 60_000)).toEqual({ redelivered: 0 });
      // Ten minutes on: 50 is known; 51 (now 10 minutes queued, still no webhook) gets its request.
      expect(await schedule(now + 600_000)).toEqual({ redelivered: 0, requested: 1 });
      expect((await requestOf(51))?.labels).toEqual(['small-node']);
    } finally {
      github.queuedJobs.length = 0;
    }
  });

  it('in_progress renews the lease to the route lease', async () => {
    await deliver(jobPayload('queued', 30, JOB_LABELS));
    await requestOf(30);
    await deliver(jobPayload('in_progress', 30, JOB_LABELS, 'github-job-30-0'));
    const r = await requestOf(30);
    expect(r?.lease).toBe(3600);
  });
});

describe("the github function's GitHub writes", () => {
  it("are spaced for every container that may write at once, so that together they keep within GitHub's limit", async () => {
    const github = await GithubStandIn.start();
    try {
      const settings = parseConfigOrThrow(
        poolConfig({
          top: {
            github: {
              'api-url': github.url,
              'app-id': github.appId,
              'installation-id': 77,
              routes: [{ 'runs-on': ['self-hosted'], label: 'small-node' }],
            },
          },
          meta: { labels: [smallNode()] },
        }),
        'github.yaml',
      ).github as GithubSettings;
      // Two containers: each starts a write at most every 2 x WRITE_INTERVAL_MS.
      const api = new GithubApi(settings, github.privateKeyPem, 2);
      await Promise.all(
        [1, 2, 3, 4].map((n) => api.jitConfig({ repository: 'o/r', name: `spaced-${n}`, labels: ['x'] })),
      );
      const t = github.jitConfigTimes;
      const gaps = t.slice(1).map((at, i) => at - (t[i] as number));
      expect(gaps).toHaveLength(3);
      // A lower bound only (a loaded machine widens gaps, never narrows them), less 100 ms of jitter
      // between Bottleneck's start of a request and the stand-in's answer.
      for (const gap of gaps) expect(gap).toBeGreaterThan(2 * WRITE_INTERVAL_MS - 100);
    } finally {
      await github.close();
    }
  });
});

describe('webhookSecrets', () => {
  it('reads one secret, or two lines while one is rotated', () => {
    expect(webhookSecrets('abc')).toEqual(['abc']);
    expect(webhookSecrets('old\nnew\n')).toEqual(['old', 'new']);
    expect(webhookSecrets('\n a \n\n b \n c')).toEqual(['a', 'b']);
  });
});
