import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobRequestId } from '../../shared/github/webhook.ts';
import { GithubPool, JOB_LABELS, jobPayload, OLD_SECRET } from '../../testkit/githubPool.ts';

/**
 * GitHub Actions jobs in packed slots (issue 43), end to end on an embedded pool (testkit/githubPool.ts):
 * signed `workflow_job` webhooks reach the bridge's listener; a queued job's node gets a just-in-time
 * runner from a GitHub API stand-in (testkit/githubStandIn.ts: GitHub's documented shapes, the App's JWT
 * verified), started on the slot by a stand-in runner (testkit/standInRunner.sh), and is released when
 * the runner exits. Tested against GitHub's documentation, not against GitHub.
 */
describe('GitHub Actions jobs in packed slots', { timeout: 120_000 }, () => {
  let pool: GithubPool;

  beforeAll(async () => {
    pool = await GithubPool.start();
  });

  afterAll(async () => {
    await pool?.close();
  });

  it("starts a JIT runner for a queued job on a slot, as the slot's user in its home, and releases the node when it exits", async () => {
    expect(await pool.deliver(jobPayload('queued', 101))).toEqual({
      status: 202,
      text: 'job 101: requesting a small node',
    });
    const runner = await pool.runnerOf(101);
    // The configuration GitHub issued for this runner, and nothing else, reached it.
    expect(runner.jitconfig).toBe(pool.github.issued.get(runner.name));
    expect(runner.user).toMatch(/^slot\d+$/);
    expect(runner.cwd).toBe(runner.home);
    const request = await pool.embedded.context.store.getRequest(jobRequestId(101));
    expect(request?.requestor).toBe('github:Codertocat/Hello-World');
    expect(request?.nodes[0]?.state).toBe('ready');
    expect(await pool.deliver(jobPayload('in_progress', 101, JOB_LABELS, runner.name))).toMatchObject({
      status: 202,
    });
    pool.github.finishJob(runner.name);
    await pool.released(101);
  });

  it('makes one runner per job, however often its queued webhook comes; a replayed delivery is answered, not acted on', async () => {
    const body = jobPayload('queued', 102);
    expect((await pool.deliver(body, { delivery: 'd-102' })).status).toBe(202);
    expect(await pool.deliver(body, { delivery: 'd-102' })).toEqual({
      status: 200,
      text: 'delivery d-102 seen already',
    });
    expect((await pool.deliver(body, { delivery: 'd-102-redelivered' })).status).toBe(202);
    const runner = await pool.runnerOf(102);
    expect((await pool.deliver(body, { delivery: 'd-102-late' })).status).toBe(202);
    expect([...pool.github.issued.keys()].filter((name) => name.startsWith('github-job-102-'))).toEqual([
      runner.name,
    ]);
    pool.github.finishJob(runner.name);
    await pool.released(102);
  });

  it('refuses a bad signature, a malformed payload and an oversized body, ignores an unrouted job; none makes a request', async () => {
    expect(await pool.deliver(jobPayload('queued', 103), { signature: `sha256=${'0'.repeat(64)}` })).toEqual({
      status: 401,
      text: 'no valid X-Hub-Signature-256',
    });
    expect((await pool.deliver(jobPayload('queued', 103), { secret: 'a guess' })).status).toBe(401);
    expect(await pool.deliver(jobPayload('queued', 104, ['self-hosted', 'gpu']))).toEqual({
      status: 202,
      text: 'ignored: no route covers runs-on ["self-hosted","gpu"]',
    });
    const malformed = await pool.deliver(JSON.stringify({ action: 'queued', workflow_job: { id: 105 } }));
    expect(malformed.status).toBe(400);
    expect(malformed.text).toMatch(/^not a workflow_job payload: workflow_job\.run_id: /);
    expect((await pool.deliver('{"action": "queued", ')).text).toBe('the body is not JSON');
    expect((await pool.deliver(`{"pad": "${'x'.repeat(1024 * 1024)}"}`)).status).toBe(413);
    expect(await pool.deliver('{}', { event: 'ping' })).toEqual({ status: 200, text: 'pong' });
    for (const jobId of [103, 104, 105]) expect(await pool.client.get(jobRequestId(jobId))).toBeUndefined();
    // The old secret still passes while both are set (rotation), and the valid delivery is served.
    expect((await pool.deliver(jobPayload('queued', 106), { secret: OLD_SECRET })).status).toBe(202);
    const runner = await pool.runnerOf(106);
    pool.github.finishJob(runner.name);
    await pool.released(106);
  });

  it('stops a runner whose job completed without it, and releases its node', async () => {
    expect((await pool.deliver(jobPayload('queued', 107))).status).toBe(202);
    const runner = await pool.runnerOf(107);
    expect(runner.name).toBe('github-job-107-0');
    // Another runner took job 107 (GitHub gives a job to any runner whose labels fit).
    expect((await pool.deliver(jobPayload('completed', 107, JOB_LABELS, 'someone-else'))).status).toBe(202);
    await pool.released(107);
    await pool.settled();
    expect(pool.bridge.active).toBe(0);
  });

  it('names the runner anew when GitHub has one of its name already (an earlier run that never started it)', async () => {
    pool.github.issued.set('github-job-112-0', 'registered before the pool stopped');
    expect((await pool.deliver(jobPayload('queued', 112))).status).toBe(202);
    const runner = await pool.github.runnerStarted('github-job-112-0-', 30_000, true);
    expect(runner.name).toMatch(/^github-job-112-0-[0-9a-f]{6}$/);
    expect(runner.jitconfig).toBe(pool.github.issued.get(runner.name));
    pool.github.finishJob(runner.name);
    await pool.released(112);
    await pool.settled();
  });

  it("waits out GitHub's rate limits, primary and secondary, as GitHub names them, and then starts the runner", async () => {
    pool.github.rateLimits.push('primary', 'secondary');
    expect((await pool.deliver(jobPayload('queued', 113))).status).toBe(202);
    const runner = await pool.runnerOf(113);
    expect(pool.bridge.api.calls.rateLimited).toBe(2);
    pool.github.finishJob(runner.name);
    await pool.released(113);
    await pool.settled();
  });

  it('starts no runner for a job whose completed webhook came before its queued one', async () => {
    expect((await pool.deliver(jobPayload('completed', 108))).status).toBe(202);
    expect((await pool.deliver(jobPayload('queued', 108))).status).toBe(202);
    expect(await pool.client.get(jobRequestId(108))).toBeUndefined();
    expect(pool.bridge.active).toBe(0);
  });

  it('releases the node of a runner that was killed', async () => {
    expect((await pool.deliver(jobPayload('queued', 109))).status).toBe(202);
    const runner = await pool.runnerOf(109);
    // As an OOM kill or a crash of the slot would: the runner and every process it started.
    const pid = execFileSync('pgrep', ['-f', '-o', runner.jitconfig]).toString().trim();
    const group = execFileSync('ps', ['-o', 'pgid=', '-p', pid]).toString().trim();
    process.kill(-Number(group), 'SIGKILL');
    await pool.released(109);
  });

  it("gives a runner to a job whose webhook was lost, at the next look at the App's deliveries", async () => {
    // GitHub could not reach the pool (it gives up after 10 s and does not try again by itself)...
    pool.github.recordDelivery('lost-110', 'queued', jobPayload('queued', 110), 0);
    // ...while another job's delivery did arrive: it is not delivered again.
    const arrived = jobPayload('queued', 111);
    pool.github.recordDelivery('arrived-111', 'queued', arrived, 202);
    expect((await pool.deliver(arrived, { delivery: 'arrived-111' })).status).toBe(202);
    expect(await pool.bridge.reconcile()).toEqual({ redelivered: 1 });
    const runner = await pool.runnerOf(110);
    // Delivered now: the next look finds nothing lost.
    expect(await pool.bridge.reconcile()).toEqual({ redelivered: 0 });
    for (const jobId of [110, 111]) {
      const r = await pool.runnerOf(jobId);
      pool.github.finishJob(r.name);
      await pool.released(jobId);
    }
    expect(runner.name).toBe('github-job-110-0');
    expect(pool.github.calls.redeliveries).toBe(1);
  });

  it('gives a runner to a job GitHub never sent a webhook for, at the next scan of its queued jobs, once its webhook had a minute', async () => {
    const now = Date.now();
    const job = (id: number, ageMs: number, labels = JOB_LABELS) => ({
      id,
      repository: 'Codertocat/Hello-World',
      runId: 7,
      labels,
      status: 'queued' as const,
      createdAt: new Date(now - ageMs).toISOString(),
    });
    // Queued at GitHub with no delivery at all: 120 for two minutes; 121 only just (its webhook may still
    // come); 122 for labels no route covers; 123 running already (its run is in progress).
    pool.github.queuedJobs.push(
      job(120, 120_000),
      job(121, 5_000),
      job(122, 120_000, ['self-hosted', 'gpu']),
      {
        ...job(123, 120_000),
        status: 'in_progress',
      },
    );
    expect(await pool.bridge.scanQueued(now)).toEqual({ found: 1 });
    const runner = await pool.runnerOf(120);
    expect(runner.name).toBe('github-job-120-0');
    // The job is the bridge's now: a second scan finds nothing new for it.
    expect(await pool.bridge.scanQueued(now)).toEqual({ found: 0 });
    pool.github.finishJob(runner.name);
    await pool.released(120);
    pool.github.queuedJobs.length = 0;
  });

  it('costs one GitHub call per job, and one installation token for all of them', () => {
    // 9 jobs, and the name in use asked again once (the rate-limited tries are the client's own retries).
    expect(pool.github.calls.jitConfigs).toBe(10);
    expect(pool.bridge.api.calls.jitConfigs).toBe(11);
    expect(pool.github.calls.tokens).toBe(1);
    expect(pool.bridge.api.calls.tokens).toBe(1);
  });
});
