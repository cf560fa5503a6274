import { createPublicKey, createVerify, generateKeyPairSync, randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { components } from '@octokit/openapi-types';

/**
 * GitHub's REST API as far as the pool uses it, served on loopback from GitHub's documented shapes
 * (@octokit/openapi-types): an App installation's access token (the App's RS256 JWT verified against
 * its public key, as GitHub does), and `generate-jitconfig` for a repository or an organization (the
 * token checked; a runner name in use is 409, as GitHub answers). Plus what a test needs of the runner
 * side: a stand-in runner (testkit/standInRunner.sh) reports here that it started, with whom and where,
 * and waits here for its job to end (`finishJob`), as a JIT runner takes one job and exits.
 *
 * Not GitHub: what it answers is what GitHub's documentation says it answers, no more; the tests that use
 * it say so.
 */

type InstallationToken = components['schemas']['installation-token'];
type Runner = components['schemas']['runner'];

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
  readonly calls = { tokens: 0, jitConfigs: 0 };
  /** The JIT configurations issued, by runner name. */
  readonly issued = new Map<string, string>();
  readonly started = new Map<string, StartedRunner>();
  private readonly publicKey: ReturnType<typeof createPublicKey>;
  private readonly tokens = new Set<string>();
  private readonly waiting = new Map<string, () => void>();
  private readonly finished = new Set<string>();
  private nextRunnerId = 1;

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

  /** Resolves once the runner `name` has reported its start. */
  async runnerStarted(name: string, timeoutMs = 30_000): Promise<StartedRunner> {
    const end = Date.now() + timeoutMs;
    while (Date.now() < end) {
      const started = this.started.get(name);
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

  private accessToken(req: IncomingMessage, res: ServerResponse): void {
    const jwt = /^bearer (.+)$/i.exec(req.headers.authorization ?? '')?.[1];
    if (!jwt || !this.validJwt(jwt)) {
      answer(res, 401, { message: 'A JSON web token could not be decoded' });
      return;
    }
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
