import { readFile, stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Log } from '../shared/core/log.ts';
import type { GithubSettings } from '../shared/core/model.ts';
import { GithubApi, nodeRunner, redeliverLost, runnerLabels } from '../shared/github/githubApi.ts';
import { QUEUED_SCAN_GRACE_MS, queuedJobs } from '../shared/github/queuedScan.ts';
import {
  type JobEvent,
  jobRequestId,
  MAX_WEBHOOK_BYTES,
  RecentDeliveries,
  readDelivery,
  signedByOneOf,
} from '../shared/github/webhook.ts';
import { RequestExistsError } from './errors.ts';
import { loginOf } from './openssh.ts';
import type { PoolClient } from './poolClient.ts';
import type { ReadyNode } from './readyNode.ts';

/**
 * GitHub Actions jobs in packed slots (docs/github.md): a webhook listener on loopback and, per queued job
 * a route covers, one `run` of the pool client. The run sends the job's request (its id names the job, so
 * a redelivered webhook makes no second one), waits for its node, asks GitHub for a just-in-time runner
 * named after the node (runnerName), starts it on the node as the slot's user (the JIT configuration on the runner's
 * stdin, never on a command line the pool builds) and holds the session: when the runner exits (it takes
 * one job), the session ends and the run releases the node. A job that completes while its runner never
 * took one (another runner took it, or it was cancelled), and a runner idle past `idle-timeout`, end the
 * same way, by aborting the run. The listener answers at once; no GitHub or pool call is on its path.
 */

export const WEBHOOK_PATH = '/github/webhook';

interface Job {
  readonly jobId: number;
  readonly abort: AbortController;
  /** The runner's name (its node's id), once its node is ready. */
  runnerName?: string;
  /** An in_progress delivery named this runner: it took a job, and only its exit ends it now. */
  busy: boolean;
  idle?: NodeJS.Timeout;
}

export class GithubBridge {
  private readonly jobs = new Map<number, Job>();
  private readonly byRunner = new Map<string, Job>();
  private readonly recent = new RecentDeliveries();
  private readonly unrouted = new Set<string>();
  /** Jobs GitHub said completed: a queued delivery arriving after it (out of order) starts no runner. */
  private readonly completed = new RecentDeliveries();
  private readonly running = new Set<Promise<void>>();
  private reconciler: NodeJS.Timeout | undefined;
  private scanner: NodeJS.Timeout | undefined;

  private constructor(
    private readonly settings: GithubSettings,
    private readonly pool: PoolClient,
    readonly api: GithubApi,
    private readonly secrets: readonly string[],
    private readonly log: Log,
    private readonly server: Server,
    readonly url: string,
  ) {}

  /** Reads the App's key and the webhook secrets, and listens on 127.0.0.1 (settings.webhookPort). */
  static async start(settings: GithubSettings, pool: PoolClient, log: Log): Promise<GithubBridge> {
    const { privateKeyFile, webhookSecretFiles } = settings;
    if (privateKeyFile === undefined || webhookSecretFiles === undefined) {
      throw new Error(
        `github.${privateKeyFile === undefined ? 'private-key-file' : 'webhook-secret-files'}: required by metastatic dev (on AWS the stack's secrets hold the key and the webhook secret)`,
      );
    }
    const privateKey = await secretFile(privateKeyFile, 'github.private-key-file', log);
    const secrets = await Promise.all(
      webhookSecretFiles.map(async (f, i) =>
        (await secretFile(f, `github.webhook-secret-files[${i}]`, log)).trim(),
      ),
    );
    let bridge: GithubBridge | undefined;
    const server = createServer((req, res) => {
      if (!bridge) return reply(res, 503, 'starting');
      void bridge.serve(req, res).catch((err: unknown) => {
        log.error('github webhook: could not answer', { error: err as Error });
        if (!res.headersSent) reply(res, 500, 'internal error');
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(settings.webhookPort, '127.0.0.1', () => resolve());
    });
    const { port } = server.address() as AddressInfo;
    const url = `http://127.0.0.1:${port}${WEBHOOK_PATH}`;
    bridge = new GithubBridge(settings, pool, new GithubApi(settings, privateKey), secrets, log, server, url);
    const started = bridge;
    started.reconciler = setInterval(() => {
      void started.reconcile().catch((err: unknown) => {
        log.warn(`github: could not look for lost webhooks: ${(err as Error).message}`);
      });
    }, settings.reconcileInterval * 1000);
    started.reconciler.unref();
    if (settings.queuedScanInterval > 0) {
      started.scanner = setInterval(() => {
        void started.scanQueued().catch((err: unknown) => {
          log.warn(`github: could not look at GitHub's queued jobs: ${(err as Error).message}`);
        });
      }, settings.queuedScanInterval * 1000);
      started.scanner.unref();
    }
    return bridge;
  }

  /** Stops listening, ends every runner and releases its node; resolves once every run has. */
  async close(): Promise<void> {
    clearInterval(this.reconciler);
    clearInterval(this.scanner);
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const job of this.jobs.values()) job.abort.abort(new Error('the pool is stopping'));
    await Promise.allSettled([...this.running]);
  }

  /**
   * Lost webhooks: every workflow_job delivery of the last hour that never reached the pool (GitHub
   * marks a delivery failed after 10 s and does not try again by itself) is delivered again, through the
   * App's delivery log. Run every `reconcile-interval`; one call, plus one per lost delivery.
   */
  async reconcile(now = Date.now()): Promise<{ redelivered: number }> {
    return redeliverLost(this.api, this.log, now);
  }

  /**
   * Queued jobs whose webhook never came (GitHub never attempted it): each routed job GitHub shows queued
   * for longer than QUEUED_SCAN_GRACE_MS with no run here gets one (shared/github/queuedScan.ts). Run every
   * `queued-scan-interval`.
   */
  async scanQueued(now = Date.now()): Promise<{ found: number }> {
    const jobs = await queuedJobs(this.api, this.settings.routes, {
      ...(this.settings.installationId === undefined ? {} : { installationId: this.settings.installationId }),
      graceMs: QUEUED_SCAN_GRACE_MS,
      now,
    });
    let found = 0;
    for (const event of jobs) {
      if (this.jobs.has(event.jobId) || this.completed.has(String(event.jobId))) continue;
      this.log.info(
        `github: job ${event.jobId} of ${event.repository} is queued with no webhook seen; requesting its node`,
      );
      this.queued(event);
      found += 1;
    }
    return { found };
  }

  /** Jobs with a run in progress (waiting for a node, or running a runner). */
  get active(): number {
    return this.jobs.size;
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== 'POST' || req.url?.split('?')[0] !== WEBHOOK_PATH) {
      return reply(res, req.method === 'POST' ? 404 : 405, `POST ${WEBHOOK_PATH}`);
    }
    const declared = Number(header(req, 'content-length') ?? 0);
    const body = declared > MAX_WEBHOOK_BYTES ? undefined : await readBody(req);
    if (body === undefined) {
      // Answered, then the connection closed: the rest of the body is not read.
      res.setHeader('connection', 'close');
      reply(res, 413, `a delivery is at most ${MAX_WEBHOOK_BYTES} bytes`);
      res.on('finish', () => req.destroy());
      return;
    }
    const signature = header(req, 'x-hub-signature-256');
    if (!(await signedByOneOf(this.secrets, body, signature))) {
      this.log.warn('github webhook: refused a delivery without a valid signature', {
        delivery: header(req, 'x-github-delivery'),
      });
      return reply(res, 401, 'no valid X-Hub-Signature-256');
    }
    const delivery = header(req, 'x-github-delivery');
    if (delivery && !this.recent.first(delivery)) return reply(res, 200, `delivery ${delivery} seen already`);
    const verdict = readDelivery(header(req, 'x-github-event'), body, this.settings.routes);
    if (verdict.status >= 400) {
      this.log.warn(`github webhook: refused delivery ${delivery}: ${verdict.reason}`);
    } else if (verdict.reason.startsWith('ignored: no route') && !this.unrouted.has(verdict.reason)) {
      this.unrouted.add(verdict.reason);
      this.log.info(`github webhook: ${verdict.reason} (said once)`);
    }
    if (verdict.event) this.act(verdict.event);
    reply(res, verdict.status, verdict.reason);
  }

  private act(event: JobEvent): void {
    if (event.kind === 'queued') {
      this.queued(event);
      return;
    }
    if (event.kind === 'in_progress') {
      const job = event.runnerName ? this.byRunner.get(event.runnerName) : undefined;
      if (job) {
        job.busy = true;
        clearTimeout(job.idle);
      }
      return;
    }
    // completed: a runner of ours that never took a job is not needed any more (another runner took
    // it, or it was cancelled before it ran); one that took a job ends by itself.
    this.completed.first(String(event.jobId));
    const job = this.jobs.get(event.jobId);
    if (job && !job.busy) job.abort.abort(new Error(`job ${event.jobId} completed without this runner`));
  }

  private queued(event: Extract<JobEvent, { kind: 'queued' }>): void {
    if (this.jobs.has(event.jobId)) return;
    if (this.completed.has(String(event.jobId))) {
      this.log.info(`github job ${event.jobId}: queued after it completed (out of order); no runner`);
      return;
    }
    const job: Job = { jobId: event.jobId, abort: new AbortController(), busy: false };
    this.jobs.set(event.jobId, job);
    const { route } = event;
    const run = this.pool
      .run(
        {
          id: jobRequestId(event.jobId),
          labels: [route.label],
          lease: route.lease,
          requestor: `github:${event.repository}`,
        },
        async ([node], ctx) => this.runner(job, event, node as ReadyNode, ctx.signal),
        { signal: job.abort.signal },
      )
      .then(
        (code) => this.log.info(`github job ${event.jobId}: runner exited (${code}); its node is released`),
        (err: unknown) => {
          if (err instanceof RequestExistsError) {
            this.log.info(`github job ${event.jobId}: requested already (${jobRequestId(event.jobId)})`);
          } else if (job.abort.signal.aborted) {
            this.log.info(
              `github job ${event.jobId}: ${(job.abort.signal.reason as Error).message}; released`,
            );
          } else {
            this.log.warn(`github job ${event.jobId}: ${(err as Error).message}`);
          }
        },
      )
      .finally(() => {
        clearTimeout(job.idle);
        this.jobs.delete(event.jobId);
        if (job.runnerName) this.byRunner.delete(job.runnerName);
        this.running.delete(run);
      });
    this.running.add(run);
  }

  /** The runner on `node`, until it exits (or the run is aborted): its exit code. */
  private async runner(
    job: Job,
    event: Extract<JobEvent, { kind: 'queued' }>,
    node: ReadyNode,
    signal: AbortSignal,
  ): Promise<number | null> {
    const { name, jit } = await nodeRunner(this.api, {
      ...(event.installationId === undefined ? {} : { installationId: event.installationId }),
      repository: event.repository,
      nodeId: node.id,
      labels: runnerLabels(event.route.runsOn, event.route.label),
    });
    job.runnerName = name;
    this.byRunner.set(name, job);
    signal.throwIfAborted();
    job.idle = setTimeout(() => {
      if (!job.busy)
        job.abort.abort(new Error(`its runner took no job within ${this.settings.idleTimeout}s`));
    }, this.settings.idleTimeout * 1000);
    const remote = `IFS= read -r METASTATIC_JITCONFIG && export METASTATIC_JITCONFIG && ${this.settings.runnerCommand}`;
    const out: string[] = [];
    const ended = await this.pool.runSsh(loginOf(node), [remote], {
      stdio: ['pipe', 'pipe', 'pipe'],
      signal,
      onSpawn: (child) => {
        child.stdin?.end(`${jit.encodedJitConfig}\n`);
        const keep = (chunk: Buffer) => {
          out.push(chunk.toString('utf8'));
          if (out.length > 50) out.shift();
        };
        child.stdout?.on('data', keep);
        child.stderr?.on('data', keep);
      },
    });
    if (ended.code !== 0 && !signal.aborted) {
      this.log.warn(`github job ${event.jobId}: runner ${name} ended with ${ended.code ?? ended.signal}`, {
        output: out.join('').slice(-2000),
      });
    }
    return ended.code;
  }
}

async function secretFile(path: string, key: string, log: Log): Promise<string> {
  try {
    const info = await stat(path);
    if ((info.mode & 0o077) !== 0)
      log.warn(`${key}: ${path} is readable by others than its owner (chmod 600 it)`);
    return await readFile(path, 'utf8');
  } catch (err) {
    throw new Error(`${key}: cannot read ${path}: ${(err as Error).message}`);
  }
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

/** The body, or undefined once it passes MAX_WEBHOOK_BYTES (the rest is not read). */
async function readBody(req: IncomingMessage): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_WEBHOOK_BYTES) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

function reply(res: ServerResponse, status: number, message: string): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8' });
  res.end(`${message}\n`);
}
