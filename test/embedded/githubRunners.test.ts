import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sign } from '@octokit/webhooks-methods';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GithubBridge } from '../../client/githubBridge.ts';
import { PoolClient } from '../../client/poolClient.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import { jobRequestId } from '../../shared/github/webhook.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { GithubStandIn } from '../../testkit/githubStandIn.ts';

/**
 * GitHub Actions jobs in packed slots (issue 43), end to end on an embedded pool: signed `workflow_job`
 * webhooks (signed by @octokit/webhooks-methods, payloads from @octokit/webhooks-examples) reach the
 * bridge's listener; a queued job's node gets a just-in-time runner from a GitHub API stand-in
 * (testkit/githubStandIn.ts: GitHub's documented shapes, the App's JWT verified), started on the slot by
 * a stand-in runner program (testkit/standInRunner.sh), released when the runner exits. Tested against
 * GitHub's documentation, not against GitHub.
 */
const examples = (
  await import('@octokit/webhooks-examples/api.github.com/index.json', { with: { type: 'json' } })
).default as unknown as { name: string; examples: Record<string, unknown>[] }[];
const QUEUED = examples.find((e) => e.name === 'workflow_job')?.examples.find((e) => e.action === 'queued');

const RUNNER = join(import.meta.dirname, '..', '..', 'testkit', 'standInRunner.sh');
const LABELS = ['self-hosted', 'linux', 'small'];

function config(api: string, dir: string, appId: number): string {
  return `providers:
  - name: local
    driver: local
    pools:
      - name: main
        max-servers: 2
        isolation: none
        labels:
          - name: large
            boot-delay: 0.1
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: large
            max-parallel-jobs: 4
github:
  api-url: ${api}
  app-id: ${appId}
  installation-id: 77
  private-key-file: ${join(dir, 'app.pem')}
  webhook-secret-files: [${join(dir, 'old-secret')}, ${join(dir, 'new-secret')}]
  runner-command: sh ${RUNNER} --jitconfig "$METASTATIC_JITCONFIG"
  idle-timeout: 30
  routes:
    - runs-on: [Self-Hosted, Linux, small, x64]
      label: small
      lease: 60
`;
}

/** A workflow_job payload as GitHub sends it (the documented example), for `jobId` with `labels`. */
function payload(action: string, jobId: number, labels = LABELS, runnerName: string | null = null): string {
  if (!QUEUED) throw new Error('no queued workflow_job example in @octokit/webhooks-examples');
  const job = QUEUED.workflow_job as Record<string, unknown>;
  return JSON.stringify({
    ...QUEUED,
    action,
    workflow_job: { ...job, id: jobId, labels, runner_name: runnerName, status: action },
  });
}

describe('GitHub Actions jobs in packed slots', { timeout: 120_000 }, () => {
  let dir: string;
  let github: GithubStandIn;
  let embedded: EmbeddedPool;
  let client: PoolClient;
  let bridge: GithubBridge;
  let deliveries = 0;

  const deliver = async (
    body: string,
    opts: { event?: string; secret?: string; delivery?: string; signature?: string } = {},
  ): Promise<{ status: number; text: string }> => {
    deliveries += 1;
    const res = await fetch(bridge.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-github-event': opts.event ?? 'workflow_job',
        'x-github-delivery': opts.delivery ?? `delivery-${deliveries}`,
        'x-hub-signature-256': opts.signature ?? (await sign(opts.secret ?? 'new secret', body)),
      },
      body,
    });
    return { status: res.status, text: (await res.text()).trim() };
  };

  /** The runner of a job's node, once it has started. */
  const runnerOf = (jobId: number) => github.runnerStarted(`${jobRequestId(jobId)}-0`);

  /** Resolves once every node of the job's request is released. */
  const released = async (jobId: number): Promise<void> => {
    for (let i = 0; i < 300; i += 1) {
      const r = await client.get(jobRequestId(jobId));
      if (r && r.nodes.every((n) => n.state === 'released')) return;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    throw new Error(`the nodes of job ${jobId} were not released`);
  };

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'metastatic-github-'));
    github = await GithubStandIn.start();
    await writeFile(join(dir, 'app.pem'), github.privateKeyPem, { mode: 0o600 });
    await writeFile(join(dir, 'old-secret'), 'old secret\n', { mode: 0o600 });
    await writeFile(join(dir, 'new-secret'), 'new secret\n');
    await chmod(join(dir, 'new-secret'), 0o600);
    const parsed = parseConfigOrThrow(config(github.url, dir, github.appId), 'github.yaml');
    embedded = await EmbeddedPool.start({
      config: parsed,
      stateDir: join(dir, 'state'),
      reaperInterval: 0.5,
      log: silentLog,
      inMemory: true,
    });
    client = await PoolClient.connect({ stateDir: join(dir, 'state') });
    if (!parsed.github) throw new Error('no github section');
    bridge = await GithubBridge.start(parsed.github, client, silentLog);
  });

  afterAll(async () => {
    await bridge?.close();
    client?.close();
    await embedded?.stop();
    await github?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it("starts a JIT runner for a queued job on a slot, as the slot's user in its home, and releases the node when it exits", async () => {
    const sent = Date.now();
    expect(await deliver(payload('queued', 101))).toEqual({
      status: 202,
      text: 'job 101: requesting a small node',
    });
    const runner = await runnerOf(101);
    const startedMs = Date.now() - sent;
    // The configuration GitHub issued for this runner, and nothing else, reached it.
    expect(runner.jitconfig).toBe(github.issued.get(runner.name));
    expect(runner.user).toMatch(/^slot\d+$/);
    expect(runner.cwd).toBe(runner.home);
    const request = await embedded.context.store.getRequest(jobRequestId(101));
    expect(request?.requestor).toBe('github:Codertocat/Hello-World');
    expect(request?.nodes[0]?.state).toBe('ready');
    expect(await deliver(payload('in_progress', 101, LABELS, runner.name))).toMatchObject({ status: 202 });
    const finished = Date.now();
    github.finishJob(runner.name);
    await released(101);
    console.info(
      `github job 101: runner started ${startedMs} ms after its webhook; node released ${Date.now() - finished} ms after its exit`,
    );
  });

  it('makes one runner per job, however often its queued webhook comes; a replayed delivery is answered, not acted on', async () => {
    const body = payload('queued', 102);
    expect((await deliver(body, { delivery: 'd-102' })).status).toBe(202);
    expect(await deliver(body, { delivery: 'd-102' })).toEqual({
      status: 200,
      text: 'delivery d-102 seen already',
    });
    expect((await deliver(body, { delivery: 'd-102-redelivered' })).status).toBe(202);
    const runner = await runnerOf(102);
    expect((await deliver(body, { delivery: 'd-102-late' })).status).toBe(202);
    expect([...github.issued.keys()].filter((name) => name.startsWith('github-job-102-'))).toEqual([
      runner.name,
    ]);
    github.finishJob(runner.name);
    await released(102);
  });

  it('refuses a bad signature, a malformed payload and an oversized body, ignores an unrouted job; none makes a request', async () => {
    expect(await deliver(payload('queued', 103), { signature: `sha256=${'0'.repeat(64)}` })).toEqual({
      status: 401,
      text: 'no valid X-Hub-Signature-256',
    });
    expect((await deliver(payload('queued', 103), { secret: 'a guess' })).status).toBe(401);
    const unrouted = await deliver(payload('queued', 104, ['self-hosted', 'gpu']));
    expect(unrouted).toEqual({ status: 202, text: 'ignored: no route covers runs-on ["self-hosted","gpu"]' });
    const malformed = await deliver(JSON.stringify({ action: 'queued', workflow_job: { id: 105 } }));
    expect(malformed.status).toBe(400);
    expect(malformed.text).toMatch(/^not a workflow_job payload: workflow_job\.run_id: /);
    expect((await deliver('{"action": "queued", ')).text).toBe('the body is not JSON');
    expect((await deliver(`{"pad": "${'x'.repeat(1024 * 1024)}"}`)).status).toBe(413);
    expect(await deliver('{}', { event: 'ping' })).toEqual({ status: 200, text: 'pong' });
    for (const jobId of [103, 104, 105]) expect(await client.get(jobRequestId(jobId))).toBeUndefined();
    // The old secret still passes while both are set (rotation).
    expect((await deliver(payload('queued', 106), { secret: 'old secret' })).status).toBe(202);
    const runner = await runnerOf(106);
    github.finishJob(runner.name);
    await released(106);
  });

  it('stops a runner whose job completed without it, and releases its node', async () => {
    expect((await deliver(payload('queued', 107))).status).toBe(202);
    const runner = await runnerOf(107);
    // Another runner took job 107 (GitHub gives a job to any runner whose labels fit).
    expect((await deliver(payload('completed', 107, LABELS, 'someone-else'))).status).toBe(202);
    await released(107);
    for (let i = 0; i < 100 && bridge.active > 0; i += 1) await new Promise((r) => setTimeout(r, 50));
    expect(bridge.active).toBe(0);
    expect(runner.name).toBe('github-job-107-0');
  });

  it('costs one GitHub call per job, and one installation token for all of them', () => {
    expect(github.calls.jitConfigs).toBe(4);
    expect(bridge.api.calls.jitConfigs).toBe(4);
    expect(github.calls.tokens).toBe(1);
    expect(bridge.api.calls.tokens).toBe(1);
  });
});
