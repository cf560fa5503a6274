import { type ChildProcess, spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { describe } from 'vitest';
import { onPath } from './onPath.ts';

/**
 * moto_server, a local server that speaks AWS's wire protocols (EC2 query/XML, DynamoDB, SQS,
 * EventBridge, CloudFormation, S3, IAM): the suites that must prove AWS would accept our requests run
 * the real SDK against it. One server per test file, on a free loopback port; `reset()` between tests.
 *
 * Where moto_server is not installed these suites skip, with one line saying why; with
 * METASTATIC_REQUIRE_MOTO=1 (set by .ci/run) its absence fails the run instead.
 */
export interface Moto {
  /** `http://localhost:PORT`: moto tells services apart by host name, so `localhost`, not 127.0.0.1. */
  readonly endpoint: string;
  readonly port: number;
  /** Forgets every resource (POST /moto-api/reset). */
  reset(): Promise<void>;
  stop(): Promise<void>;
}

/** Credentials moto accepts (any); never real ones. */
export const MOTO_CREDENTIALS = { accessKeyId: 'testing', secretAccessKey: 'testing' } as const;
/** moto's default account id. */
export const MOTO_ACCOUNT = '123456789012';

let availability: string | undefined | null = null;

/** Why moto cannot run here, or undefined when it can. */
export function motoUnavailable(): string | undefined {
  if (availability !== null) return availability;
  availability = onPath('moto_server')
    ? undefined
    : "moto_server is not installed (not on PATH); pip install 'moto[server]==5.2.1'";
  if (availability !== undefined && process.env.METASTATIC_REQUIRE_MOTO === '1') {
    throw new Error(`METASTATIC_REQUIRE_MOTO=1 but ${availability}`);
  }
  return availability;
}

/** `describe` that skips (saying why, once) where moto_server is absent. */
export function describeWithMoto(name: string, body: () => void): void {
  const why = motoUnavailable();
  if (why !== undefined) {
    console.warn(`skipping "${name}": ${why}`);
    // biome-ignore lint/suspicious/noSkippedTests: skipped only where moto_server is absent (never in CI)
    describe.skip(name, body);
    return;
  }
  describe(name, body);
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Starts moto_server on a free loopback port and waits until it answers. */
export async function startMoto(options: { env?: Record<string, string> } = {}): Promise<Moto> {
  const why = motoUnavailable();
  if (why !== undefined) throw new Error(why);
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const child = spawn('moto_server', ['-H', '127.0.0.1', '-p', String(port)], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, ...options.env },
    });
    let stderr = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-4000);
    });
    const endpoint = `http://localhost:${port}`;
    const up = await waitUntilUp(child, endpoint);
    if (up) {
      return {
        endpoint,
        port,
        reset: async () => {
          const res = await fetch(`${endpoint}/moto-api/reset`, { method: 'POST' });
          if (!res.ok) throw new Error(`moto reset failed: HTTP ${res.status}`);
        },
        stop: () => stopChild(child),
      };
    }
    await stopChild(child);
    // Another process took the port between freePort() and the bind: try another one.
    if (attempt >= 3) throw new Error(`moto_server did not start on port ${port}: ${stderr}`);
  }
}

async function waitUntilUp(child: ChildProcess, endpoint: string): Promise<boolean> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) return false;
    try {
      const res = await fetch(`${endpoint}/moto-api/data.json`);
      if (res.ok) return true;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}
