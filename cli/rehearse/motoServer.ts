import { type ChildProcess, spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { freePort } from '../../shared/runtime/freePort.ts';
import { RehearsalError } from './errors.ts';

/**
 * moto_server, a local server that speaks AWS's wire protocols (CloudFormation, S3, IAM, SSM, Lambda,
 * SQS, DynamoDB, EventBridge, EC2): what the rehearsal deploys to. Started here on a loopback port, or a
 * running one used as it is (`--endpoint`). The tests start theirs through the same code
 * (testkit/moto.ts).
 */
export interface MotoServer {
  /** `http://localhost:PORT`: moto tells services apart by host name, so `localhost`, not 127.0.0.1. */
  readonly endpoint: string;
  readonly port: number;
  /** Whether this process started it (then `stop` ends it and everything in it). */
  readonly owned: boolean;
  /** The pid of the moto_server this process started. */
  readonly pid?: number;
  stop(): Promise<void>;
}

/** Credentials moto accepts (any); never real ones. */
export const MOTO_CREDENTIALS = { accessKeyId: 'testing', secretAccessKey: 'testing' } as const;

const INSTALL_HINT = "install it with: pip install 'moto[server]' (tested with moto 5.2.1)";

export interface StartMotoOptions {
  /** The port to listen on (default: a free one). */
  readonly port?: number;
  /** The account moto's resources belong to (MOTO_ACCOUNT_ID; default moto's 123456789012). */
  readonly account?: string;
  /** More environment for moto_server. */
  readonly env?: Readonly<Record<string, string>>;
  /** The moto_server command (default: `moto_server` on PATH). */
  readonly command?: string;
  /**
   * In a process group of its own, so that Ctrl-C in a terminal (SIGINT to the whole foreground group)
   * does not end it under the rehearsal, which stops it itself as it cleans up; it is killed when this
   * process exits.
   */
  readonly ownGroup?: boolean;
}

/** Starts moto_server on a loopback port and waits until it answers. */
export async function startMotoServer(options: StartMotoOptions = {}): Promise<MotoServer> {
  const command = options.command ?? 'moto_server';
  if (options.port !== undefined && !(await portIsFree(options.port))) {
    throw new RehearsalError(
      `port ${options.port} is in use: give another --port, or leave it out for a free one (or use the ` +
        `moto already listening there with --endpoint http://localhost:${options.port})`,
    );
  }
  for (let attempt = 0; ; attempt++) {
    const port = options.port ?? (await freePort());
    const child = spawn(command, ['-H', '127.0.0.1', '-p', String(port)], {
      stdio: ['ignore', 'ignore', 'pipe'],
      detached: options.ownGroup === true,
      env: {
        ...process.env,
        ...(options.account ? { MOTO_ACCOUNT_ID: options.account } : {}),
        ...options.env,
      },
    });
    let stderr = '';
    let spawnError: NodeJS.ErrnoException | undefined;
    child.on('error', (err: NodeJS.ErrnoException) => {
      spawnError = err;
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString()).slice(-4000);
    });
    const endpoint = `http://localhost:${port}`;
    const killOnExit = () => child.kill('SIGKILL');
    if (options.ownGroup) process.once('exit', killOnExit);
    child.once('exit', () => process.removeListener('exit', killOnExit));
    const up = await waitUntilUp(child, endpoint, () => spawnError);
    if (up) {
      return {
        endpoint,
        port,
        owned: true,
        ...(child.pid ? { pid: child.pid } : {}),
        stop: () => stopChild(child),
      };
    }
    await stopChild(child);
    if (spawnError?.code === 'ENOENT') {
      throw new RehearsalError(`${command} is not installed (not found on PATH); ${INSTALL_HINT}`);
    }
    if (spawnError) throw new RehearsalError(`cannot start ${command}: ${spawnError.message}`);
    // Another process took the port between freePort() and the bind: try another one.
    if (options.port !== undefined || attempt >= 3) {
      throw new RehearsalError(
        `${command} did not start on port ${port}${stderr ? `:\n${stderr.trim()}` : ''}`,
      );
    }
  }
}

/** A moto_server already running at `endpoint` (`--endpoint`): checked to answer as moto does. */
export async function connectMotoServer(endpoint: string): Promise<MotoServer> {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new RehearsalError(`--endpoint ${endpoint} is not a URL (e.g. http://localhost:5000)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new RehearsalError(`--endpoint ${endpoint}: give an http:// URL (e.g. http://localhost:5000)`);
  }
  const base = url.origin;
  try {
    await motoAccount(base);
  } catch (err) {
    throw new RehearsalError(
      `no moto_server answers at ${base} (${(err as Error).message}): start one (moto_server -p PORT), ` +
        'or leave out --endpoint to have the rehearsal start its own',
    );
  }
  const port = Number(url.port || (url.protocol === 'https:' ? 443 : 80));
  return { endpoint: base, port, owned: false, stop: async () => {} };
}

/**
 * The account a moto_server answers for (STS GetCallerIdentity, through its query API): MOTO_ACCOUNT_ID,
 * or moto's default. Also what tells a running moto from anything else on the port.
 */
export async function motoAccount(endpoint: string, region = 'us-east-1'): Promise<string> {
  const res = await fetch(endpoint, {
    method: 'POST',
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      authorization: `AWS4-HMAC-SHA256 Credential=${MOTO_CREDENTIALS.accessKeyId}/20260101/${region}/sts/aws4_request, SignedHeaders=host, Signature=0`,
    },
    body: 'Action=GetCallerIdentity&Version=2011-06-15',
    signal: AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  const account = /<Account>(\d{12})<\/Account>/.exec(text)?.[1];
  if (!res.ok || !account) throw new Error(`HTTP ${res.status}, not moto's GetCallerIdentity answer`);
  return account;
}

/** Forgets every resource of a moto_server (POST /moto-api/reset). */
export async function resetMotoServer(endpoint: string): Promise<void> {
  const res = await fetch(`${endpoint}/moto-api/reset`, { method: 'POST' });
  if (!res.ok) throw new Error(`moto reset failed: HTTP ${res.status}`);
}

function portIsFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

async function waitUntilUp(
  child: ChildProcess,
  endpoint: string,
  failed: () => Error | undefined,
): Promise<boolean> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (failed() || child.exitCode !== null || child.signalCode !== null) return false;
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
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) {
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}
