import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import examples from '@octokit/webhooks-examples/api.github.com/index.json' with { type: 'json' };
import { sign } from '@octokit/webhooks-methods';
import { GithubBridge } from '../client/githubBridge.ts';
import { PoolClient } from '../client/poolClient.ts';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { silentLog } from '../shared/core/log.ts';
import { jobRequestId } from '../shared/github/webhook.ts';
import { EmbeddedPool } from '../shared/runtime/embeddedPool.ts';
import { largeNode, poolConfig, smallNode } from './configs.ts';
import { GithubStandIn, type StartedRunner } from './githubStandIn.ts';

/**
 * An embedded pool with the GitHub bridge in front of it and a GitHub API stand-in behind it
 * (githubStandIn.ts), as test/embedded/githubRunners.test.ts and bench/githubRunners.ts use it: a local
 * pool (isolation none, 2 backing nodes at most) whose label `small` has 4 slots per backing node; a route from runs-on
 * [self-hosted, linux, small, x64] to it; runners are testkit/standInRunner.sh. Webhooks are signed with
 * @octokit/webhooks-methods and shaped as @octokit/webhooks-examples' queued workflow_job.
 */

const QUEUED = (examples as unknown as { name: string; examples: Record<string, unknown>[] }[])
  .find((e) => e.name === 'workflow_job')
  ?.examples.find((e) => e.action === 'queued');

const RUNNER = join(import.meta.dirname, 'standInRunner.sh');
export const JOB_LABELS = ['self-hosted', 'linux', 'small'];
/** The secrets the bridge takes (rotation: both); deliveries are signed with NEW_SECRET by default. */
export const OLD_SECRET = 'old secret';
export const NEW_SECRET = 'new secret';

function config(api: string, dir: string, appId: number): string {
  return poolConfig({
    top: {
      github: {
        'api-url': api,
        'app-id': appId,
        'installation-id': 77,
        'private-key-file': join(dir, 'app.pem'),
        'webhook-secret-files': [join(dir, 'old-secret'), join(dir, 'new-secret')],
        'runner-command': `sh ${RUNNER} --jitconfig "$METASTATIC_JITCONFIG"`,
        'idle-timeout': 30,
        routes: [{ 'runs-on': ['Self-Hosted', 'Linux', 'small', 'x64'], label: 'small', lease: 60 }],
      },
    },
    backing: { pool: { 'max-servers': 2, isolation: 'none' }, labels: [largeNode({ 'boot-delay': 0.1 })] },
    meta: { labels: [smallNode({ name: 'small', 'max-parallel-jobs': 4 })] },
  });
}

/** A workflow_job payload as GitHub sends it (the documented example), for `jobId` with `labels`. */
export function jobPayload(
  action: string,
  jobId: number,
  labels = JOB_LABELS,
  runnerName: string | null = null,
): string {
  if (!QUEUED) throw new Error('no queued workflow_job example in @octokit/webhooks-examples');
  const job = QUEUED.workflow_job as Record<string, unknown>;
  return JSON.stringify({
    ...QUEUED,
    action,
    workflow_job: { ...job, id: jobId, labels, runner_name: runnerName, status: action },
  });
}

export interface DeliveryOptions {
  readonly event?: string;
  readonly secret?: string;
  readonly delivery?: string;
  readonly signature?: string;
}

export class GithubPool {
  private deliveries = 0;

  private constructor(
    private readonly dir: string,
    readonly github: GithubStandIn,
    readonly embedded: EmbeddedPool,
    readonly client: PoolClient,
    readonly bridge: GithubBridge,
  ) {}

  static async start(): Promise<GithubPool> {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-github-'));
    const github = await GithubStandIn.start();
    await writeFile(join(dir, 'app.pem'), github.privateKeyPem, { mode: 0o600 });
    await writeFile(join(dir, 'old-secret'), `${OLD_SECRET}\n`, { mode: 0o600 });
    await writeFile(join(dir, 'new-secret'), `${NEW_SECRET}\n`, { mode: 0o600 });
    const parsed = parseConfigOrThrow(config(github.url, dir, github.appId), 'github.yaml');
    if (!parsed.github) throw new Error('no github section');
    const stateDir = join(dir, 'state');
    const embedded = await EmbeddedPool.start({
      config: parsed,
      stateDir,
      reaperInterval: 0.5,
      log: silentLog,
      inMemory: true,
    });
    const client = await PoolClient.connect({ stateDir });
    const bridge = await GithubBridge.start(
      parsed.github,
      client,
      process.env.DEBUG_BRIDGE
        ? { debug() {}, info: console.log, warn: console.log, error: console.log }
        : silentLog,
    );
    github.setWebhook(bridge.url, NEW_SECRET);
    return new GithubPool(dir, github, embedded, client, bridge);
  }

  /** Posts `body` to the bridge as GitHub would (signed, with an event name and a delivery id). */
  async deliver(body: string, opts: DeliveryOptions = {}): Promise<{ status: number; text: string }> {
    this.deliveries += 1;
    const res = await fetch(this.bridge.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-github-event': opts.event ?? 'workflow_job',
        'x-github-delivery': opts.delivery ?? `delivery-${this.deliveries}`,
        'x-hub-signature-256': opts.signature ?? (await sign(opts.secret ?? NEW_SECRET, body)),
      },
      body,
    });
    return { status: res.status, text: (await res.text()).trim() };
  }

  /** The runner of a job's node, once it has started. */
  runnerOf(jobId: number): Promise<StartedRunner> {
    return this.github.runnerStarted(`${jobRequestId(jobId)}-0`);
  }

  /** Resolves once every node of the job's request is released. */
  async released(jobId: number): Promise<void> {
    for (let i = 0; i < 600; i += 1) {
      const r = await this.client.get(jobRequestId(jobId));
      if (r?.nodes.every((n) => n.state === 'released')) return;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    throw new Error(`the nodes of job ${jobId} were not released`);
  }

  /** Resolves once the bridge has no run left (a run settles just after its release is recorded). */
  async settled(): Promise<void> {
    for (let i = 0; i < 200 && this.bridge.active > 0; i += 1) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  async close(): Promise<void> {
    await this.bridge.close();
    this.client.close();
    await this.embedded.stop();
    await this.github.close();
    await rm(this.dir, { recursive: true, force: true });
  }
}
