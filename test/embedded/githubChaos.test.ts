import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jobRequestId } from '../../shared/github/webhook.ts';
import { parseSeed, Random } from '../../testkit/chaosRandom.ts';
import { GithubPool, JOB_LABELS, jobPayload } from '../../testkit/githubPool.ts';

/**
 * GitHub's webhooks as they really arrive (issue 43's chaos aim), on the embedded pool with the bridge
 * (testkit/githubPool.ts): each job of a seeded run gets one of these fates, all at once, in a random
 * order and with random delays:
 *
 * - normal: queued, in_progress on its runner, completed;
 * - twice: its queued webhook delivered twice more (a redelivery and a replayed delivery id), at once;
 * - late: queued again after the job completed and its node was released;
 * - out of order: completed before queued (cancelled while queued): no runner;
 * - lost: its queued delivery never reached the pool (the App's log says it failed);
 * - killed: its runner's processes killed while it runs.
 *
 * Then one look at the App's delivery log (one reconcile interval). Invariants: no job gets two runners;
 * every job but the out-of-order ones got one, the lost ones at the look; every node is released once its
 * runner has exited; no run is left in the bridge.
 */
const FATES = ['normal', 'twice', 'late', 'out-of-order', 'lost', 'killed'] as const;
type Fate = (typeof FATES)[number];
const JOBS = 12;
/** Seed 1 in `npm test` (the suite's time is near its bound); more with METASTATIC_GITHUB_CHAOS_SEEDS=1,2,3. */
const SEEDS = (process.env.METASTATIC_GITHUB_CHAOS_SEEDS ?? '1').split(',').map((s) => parseSeed(s));

describe('GitHub webhooks twice, late, out of order or lost, and runners killed', {
  timeout: 180_000,
}, () => {
  let pool: GithubPool;

  beforeAll(async () => {
    pool = await GithubPool.start();
  });

  afterAll(async () => {
    await pool?.close();
  });

  const nap = (random: Random) => new Promise((r) => setTimeout(r, random.int(0, 50)));

  /** The job's runner runs its job to the end, as GitHub tells it: in_progress, the job, completed. */
  const runJob = async (jobId: number): Promise<void> => {
    const runner = await pool.runnerOf(jobId);
    await pool.deliver(jobPayload('in_progress', jobId, JOB_LABELS, runner.name));
    pool.github.finishJob(runner.name);
    await pool.released(jobId);
    await pool.deliver(jobPayload('completed', jobId, JOB_LABELS, runner.name));
  };

  const play = async (fate: Fate, jobId: number, random: Random): Promise<void> => {
    const queued = jobPayload('queued', jobId);
    await nap(random);
    switch (fate) {
      case 'normal':
        await pool.deliver(queued);
        return runJob(jobId);
      case 'twice':
        await Promise.all([
          pool.deliver(queued, { delivery: `a-${jobId}` }),
          pool.deliver(queued, { delivery: `b-${jobId}` }),
          pool.deliver(queued, { delivery: `a-${jobId}` }),
        ]);
        return runJob(jobId);
      case 'late':
        await pool.deliver(queued);
        await runJob(jobId);
        await pool.deliver(queued, { delivery: `late-${jobId}` });
        return;
      case 'out-of-order':
        await pool.deliver(jobPayload('completed', jobId));
        await nap(random);
        await pool.deliver(queued);
        return;
      case 'lost':
        pool.github.recordDelivery(`lost-${jobId}`, 'queued', queued, 0);
        return;
      case 'killed': {
        await pool.deliver(queued);
        const runner = await pool.runnerOf(jobId);
        await nap(random);
        const pid = execFileSync('pgrep', ['-f', '-o', runner.jitconfig]).toString().trim();
        const group = Number(execFileSync('ps', ['-o', 'pgid=', '-p', pid]).toString().trim());
        process.kill(-group, 'SIGKILL');
        await pool.released(jobId);
        await pool.deliver(jobPayload('completed', jobId, JOB_LABELS, runner.name));
        return;
      }
    }
  };

  for (const seed of SEEDS) {
    it(`holds every invariant (seed ${seed})`, async () => {
      const random = new Random(seed);
      const first = seed * 10_000;
      const fates = Array.from({ length: JOBS }, (_, i) => FATES[i % FATES.length] as Fate);
      const jobs = fates.map((fate, i) => ({ fate, jobId: first + i, random: random.fork(`job-${i}`) }));
      await Promise.all(jobs.map(({ fate, jobId, random: r }) => play(fate, jobId, r)));
      // One reconcile interval: the lost deliveries are delivered again, and their jobs run.
      const lost = jobs.filter((j) => j.fate === 'lost');
      expect(await pool.bridge.reconcile()).toEqual({ redelivered: lost.length });
      await Promise.all(lost.map(({ jobId }) => runJob(jobId)));
      await pool.settled();

      const runnersOf = (jobId: number) =>
        [...pool.github.issued.keys()].filter((name) => name.startsWith(`${jobRequestId(jobId)}-`));
      for (const { fate, jobId } of jobs) {
        expect({ jobId, fate, runners: runnersOf(jobId).length }).toEqual({
          jobId,
          fate,
          runners: fate === 'out-of-order' ? 0 : 1,
        });
        const request = await pool.client.get(jobRequestId(jobId));
        if (fate === 'out-of-order') expect(request).toBeUndefined();
        else expect(request?.nodes.map((n) => n.state)).toEqual(['released']);
      }
      expect(pool.bridge.active).toBe(0);
    });
  }
});
