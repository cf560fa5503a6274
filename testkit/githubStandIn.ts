import { createPublicKey, createVerify, generateKeyPairSync, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { components } from '@octokit/openapi-types';
import { sign } from '@octokit/webhooks-methods';

/**
 * GitHub's REST API as far as the pool uses it, served on loopback from GitHub's documented shapes
 * (@octokit/openapi-types): an App installation's access token (the App's RS256 JWT verified against
 * its public key, as GitHub does), `generate-jitconfig` for a repository or an organization (the token
 * checked; a runner name in use is 409, as GitHub answers), and the App's webhook delivery log with
 * redelivery (a delivery the test records as lost is sent again, signed, to the webhook URL). Plus what a test needs of the runner
 * side: a stand-in runner (testkit/standInRunner.sh) reports here that it started, with whom and where,
 * and waits here for its job to end (`finishJob`), as a JIT runner takes one job and exits.
 *
 * Not GitHub: what it answers is what GitHub's documentation says it answers, no more; the tests that use
 * it say so.
 */

type InstallationToken = components['schemas']['installation-token'];
type DeliveryItem = components['schemas']['hook-delivery-item'];
type Runner = components['schemas']['runner'];
type Installation = components['schemas']['installation'];

export interface StartedRunner {
  readonly name: string;
  readonly user: string;
  readonly home: string;
  readonly cwd: string;
  readonly jitconfig: string;
}

export class GithubStandIn {
  readonly appId = 4242;
  readonly privateKeyPem: string;
  readonly calls = { tokens: 0, jitConfigs: 0, deliveryLists: 0, redeliveries: 0 };
  /** The App's webhook delivery log, oldest first (GitHub lists it newest first). */
  readonly deliveryLog: DeliveryItem[] = [];
  private readonly deliveryBodies = new Map<string, { event: string; body: string }>();
  private webhook: { url: string; secret: string } | undefined;
  /** The App's one installation. */
  readonly installationId = 77;
  /** Jobs as GitHub holds them, for a queued-job scan to find (no webhook is sent for them). */
  readonly queuedJobs: {
    id: number;
    repository: string;
    runId: number;
    labels: string[];
    status: 'queued' | 'in_progress' | 'completed';
    createdAt: string;
  }[] = [];
  /** When each generate-jitconfig was answered (performance.now()), in order. */
  readonly jitConfigTimes: number[] = [];
  /** The JIT configurations issued, by runner name. */
  readonly issued = new Map<string, string>();
  readonly started = new Map<string, StartedRunner>();
  private readonly publicKey: ReturnType<typeof createPublicKey>;
  private readonly tokens = new Set<string>();
  private readonly waiting = new Map<string, () => void>();
  private readonly finished = new Set<string>();
  private nextRunnerId = 1;
  /** The answers the next generate-jitconfig calls get instead of a configuration (a rate limit). */
  readonly rateLimits: ('primary' | 'secondary')[] = [];

  private constructor(
    private readonly server: Server,
    readonly url: string,
    keys: { privateKey: string; publicKey: string },
  ) {
    this.privateKeyPem = keys.privateKey;
    this.publicKey = createPublicKey(keys.publicKey);
  }

  static async start(): Promise<GithubStandIn> {
    const keys = generateKeyPairSync('rsa', {
      modulusLength: 2048,
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    let standIn: GithubStandIn | undefined;
    const server = createServer((req, res) => {
      void standIn?.serve(req, res).catch(() => answer(res, 500, { message: 'stand-in error' }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    standIn = new GithubStandIn(server, `http://127.0.0.1:${port}`, keys);
    return standIn;
  }

  /** Where the App's webhooks go, and the secret they are signed with (for redeliveries). */
  setWebhook(url: string, secret: string): void {
    this.webhook = { url, secret };
  }

  /** GitHub tried to deliver `body` and got `statusCode` (0: it could not connect): a lost webhook. */
  recordDelivery(guid: string, action: string, body: string, statusCode: number): void {
    this.deliveryBodies.set(guid, { event: 'workflow_job', body });
    this.logDelivery(guid, action, statusCode, false);
  }

  private logDelivery(guid: string, action: string, statusCode: number, redelivery: boolean): void {
    this.deliveryLog.push({
      id: this.deliveryLog.length + 1,
      guid,
      delivered_at: new Date().toISOString(),
      redelivery,
      duration: 0.01,
      status: statusCode === 0 ? 'failed to connect' : statusCode < 300 ? 'OK' : 'Invalid HTTP Response',
      status_code: statusCode,
      event: 'workflow_job',
      action,
      installation_id: 77,
      repository_id: 1296269,
    });
  }

  /** Resolves once the runner `name` (or, with `prefix`, one whose name starts so) has reported its start. */
  async runnerStarted(name: string, timeoutMs = 30_000, prefix = false): Promise<StartedRunner> {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      const started = prefix
        ? [...this.started.values()].find((r) => r.name.startsWith(name))
        : this.started.get(name);
      if (started) return started;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`runner ${name} did not start within ${timeoutMs} ms`);
  }

  /** The runner `name`'s job ends: it exits. */
  finishJob(name: string): void {
    this.finished.add(name);
    this.waiting.get(name)?.();
  }

  async close(): Promise<void> {
    for (const release of this.waiting.values()) release();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '').split('?')[0] ?? '';
    const body = await readJson(req);
    let m = /^\/app\/installations\/(\d+)\/access_tokens$/.exec(path);
    if (req.method === 'POST' && m) return this.accessToken(req, res);
    m = /^\/(?:repos\/[^/]+\/[^/]+|orgs\/[^/]+)\/actions\/runners\/generate-jitconfig$/.exec(path);
    if (req.method === 'POST' && m) return this.jitConfig(req, res, body);
    if (req.method === 'GET' && path === '/app/hook/deliveries') {
      if (!this.appAuthorized(req, res)) return;
      this.calls.deliveryLists += 1;
      return answer(res, 200, [...this.deliveryLog].reverse().slice(0, 100));
    }
    m = /^\/app\/hook\/deliveries\/(\d+)\/attempts$/.exec(path);
    if (req.method === 'POST' && m) {
      if (!this.appAuthorized(req, res)) return;
      this.calls.redeliveries += 1;
      return this.redeliver(Number(m[1]), res);
    }
    if (req.method === 'GET' && path === '/app/installations') {
      if (!this.appAuthorized(req, res)) return;
      const installation: Partial<Installation> = { id: this.installationId, app_id: this.appId };
      return answer(res, 200, [installation]);
    }
    if (req.method === 'GET' && (path === '/installation/repositories' || path.startsWith('/repos/'))) {
      if (!this.tokenAuthorized(req, res)) return;
      const scan = this.scanAnswer(path, new URL(req.url ?? '/', 'http://x').searchParams.get('status'));
      if (scan) return answer(res, 200, scan);
    }
    m = /^\/_standin\/runners\/([^/]+)\/(started|job)$/.exec(path);
    if (m?.[2] === 'started' && req.method === 'POST') {
      const name = decodeURIComponent(m[1] ?? '');
      this.started.set(name, { name, ...(body as Omit<StartedRunner, 'name'>) });
      return answer(res, 204, undefined);
    }
    if (m?.[2] === 'job' && req.method === 'GET') {
      const name = decodeURIComponent(m[1] ?? '');
      if (!this.finished.has(name)) await new Promise<void>((resolve) => this.waiting.set(name, resolve));
      return answer(res, 200, { done: true });
    }
    answer(res, 404, { message: 'Not Found', documentation_url: 'https://docs.github.com/rest' });
  }

  /** Whether the call carries an installation token this stand-in made; answers 401 when it does not. */
  private tokenAuthorized(req: IncomingMessage, res: ServerResponse): boolean {
    const token = /^token (.+)$/i.exec(req.headers.authorization ?? '')?.[1];
    if (token && this.tokens.has(token)) return true;
    answer(res, 401, { message: 'Bad credentials' });
    return false;
  }

  /**
   * GitHub's state of the jobs in `queuedJobs`, as the three reads of a queued-job scan see it: the
   * installation's repositories, a repository's runs in a status (a run is queued while all its jobs are,
   * in progress once one is not), and a run's jobs. Only the fields the pool reads are filled.
   */
  private scanAnswer(path: string, status: string | null): unknown {
    const repos = [...new Set(this.queuedJobs.map((j) => j.repository))];
    if (path === '/installation/repositories') {
      return { total_count: repos.length, repositories: repos.map((full_name) => ({ full_name })) };
    }
    const runs = /^\/repos\/([^/]+\/[^/]+)\/actions\/runs$/.exec(path);
    if (runs) {
      const jobs = this.queuedJobs.filter((j) => j.repository === runs[1]);
      const ids = [...new Set(jobs.map((j) => j.runId))].filter((run) => {
        const all = jobs.filter((j) => j.runId === run);
        const queued = all.every((j) => j.status === 'queued');
        return status === 'queued' ? queued : status === 'in_progress' ? !queued : true;
      });
      return { total_count: ids.length, workflow_runs: ids.map((id) => ({ id })) };
    }
    const jobs = /^\/repos\/([^/]+\/[^/]+)\/actions\/runs\/(\d+)\/jobs$/.exec(path);
    if (jobs) {
      const of = this.queuedJobs.filter((j) => j.repository === jobs[1] && j.runId === Number(jobs[2]));
      return {
        total_count: of.length,
        jobs: of.map((j) => ({
          id: j.id,
          run_id: j.runId,
          status: j.status,
          labels: j.labels,
          created_at: j.createdAt,
        })),
      };
    }
    return undefined;
  }

  /** Whether the call carries the App's JWT; answers 401 when it does not. */
  private appAuthorized(req: IncomingMessage, res: ServerResponse): boolean {
    const jwt = /^bearer (.+)$/i.exec(req.headers.authorization ?? '')?.[1];
    if (jwt && this.validJwt(jwt)) return true;
    answer(res, 401, { message: 'A JSON web token could not be decoded' });
    return false;
  }

  /** Delivers a logged delivery again to the App's webhook URL, signed, with its guid; logs the attempt. */
  private async redeliver(id: number, res: ServerResponse): Promise<void> {
    const item = this.deliveryLog.find((d) => d.id === id);
    const sent = item && this.deliveryBodies.get(item.guid);
    if (!item || !sent || !this.webhook) return answer(res, 404, { message: 'Not Found' });
    let status = 0;
    try {
      const delivered = await fetch(this.webhook.url, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-github-event': sent.event,
          'x-github-delivery': item.guid,
          'x-hub-signature-256': await sign(this.webhook.secret, sent.body),
        },
        body: sent.body,
      });
      status = delivered.status;
    } catch {
      status = 0;
    }
    this.logDelivery(item.guid, item.action ?? '', status, true);
    answer(res, 202, {});
  }

  private accessToken(req: IncomingMessage, res: ServerResponse): void {
    if (!this.appAuthorized(req, res)) return;
    this.calls.tokens += 1;
    const token = `ghs_${randomBytes(18).toString('hex')}`;
    this.tokens.add(token);
    const out: InstallationToken = {
      token,
      expires_at: new Date(Date.now() + 3600_000).toISOString(),
      permissions: { administration: 'write' },
      repository_selection: 'all',
    };
    answer(res, 201, out);
  }

  private jitConfig(req: IncomingMessage, res: ServerResponse, body: unknown): void {
    const token = /^token (.+)$/i.exec(req.headers.authorization ?? '')?.[1];
    if (!token || !this.tokens.has(token)) {
      answer(res, 401, { message: 'Bad credentials' });
      return;
    }
    const limit = this.rateLimits.shift();
    if (limit) {
      // As GitHub answers (docs: "Rate limits for the REST API"): a primary limit names when it resets,
      // a secondary one how long to wait.
      const headers: Record<string, string> =
        limit === 'primary'
          ? {
              'x-ratelimit-limit': '5000',
              'x-ratelimit-remaining': '0',
              'x-ratelimit-reset': String(Math.ceil(Date.now() / 1000) + 1),
            }
          : { 'retry-after': '1' };
      res.writeHead(403, { 'content-type': 'application/json', ...headers });
      res.end(
        JSON.stringify({
          message:
            limit === 'primary'
              ? 'API rate limit exceeded for installation.'
              : 'You have exceeded a secondary rate limit. Please wait a few minutes before you try again.',
        }),
      );
      return;
    }
    const b = body as { name?: unknown; runner_group_id?: unknown; labels?: unknown; work_folder?: unknown };
    const labels = Array.isArray(b.labels) ? b.labels : [];
    if (
      typeof b.name !== 'string' ||
      !Number.isInteger(b.runner_group_id) ||
      labels.length === 0 ||
      labels.length > 100 ||
      !labels.every((l) => typeof l === 'string')
    ) {
      answer(res, 422, { message: 'Validation Failed' });
      return;
    }
    if (this.issued.has(b.name)) {
      answer(res, 409, { message: 'Already exists - A runner with the same name' });
      return;
    }
    this.calls.jitConfigs += 1;
    this.jitConfigTimes.push(performance.now());
    const runner: Runner = {
      id: this.nextRunnerId++,
      name: b.name,
      os: 'unknown',
      status: 'offline',
      busy: false,
      labels: (labels as string[]).map((name, id) => ({ id, name, type: 'custom' as const })),
    };
    const encoded = Buffer.from(JSON.stringify({ api: this.url, name: b.name, id: runner.id })).toString(
      'base64',
    );
    this.issued.set(b.name, encoded);
    answer(res, 201, { runner, encoded_jit_config: encoded });
  }

  /** An RS256 JWT signed with the App's key, issued by the App, not expired (GitHub's rules for App JWTs). */
  private validJwt(jwt: string): boolean {
    const [header, payload, signature] = jwt.split('.');
    if (!header || !payload || !signature) return false;
    const verifier = createVerify('RSA-SHA256');
    verifier.update(`${header}.${payload}`);
    if (!verifier.verify(this.publicKey, Buffer.from(signature, 'base64url'))) return false;
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as {
      iss?: unknown;
      exp?: number;
    };
    return String(claims.iss) === String(this.appId) && (claims.exp ?? 0) * 1000 > Date.now();
  }
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function answer(res: ServerResponse, status: number, body: unknown): void {
  if (body === undefined) {
    res.writeHead(status).end();
    return;
  }
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}
