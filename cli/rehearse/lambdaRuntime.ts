import { type ChildProcess, fork } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DeployedFunction } from './deployed.ts';

/**
 * The deployed functions run as Lambda runs them, on this machine: each container a Node process of its
 * own (lambdaWorker.ts) with the environment CloudFormation gave it (as moto's Lambda keeps it) plus what
 * the Lambda runtime sets, loading the bundle CDK deployed (its code directory in the assembly) once. A
 * container runs one invocation at a time (FunctionProcess); a function has up to `--concurrency` of them
 * (FunctionPool), started as invocations overlap, where Lambda would scale to each mapping's
 * maxConcurrency or the account's limit. An invocation that outlives the function's timeout is ended as
 * Lambda ends it: the process is killed and the invocation fails; the next one starts a new process (a
 * cold start).
 */

const FROM_SOURCES = import.meta.url.endsWith('.ts');

/** The worker's script: beside this module when built or bundled; from the sources, the source bundle's. */
export async function lambdaWorkerScript(): Promise<string> {
  if (!FROM_SOURCES) return fileURLToPath(new URL('./lambdaWorker.js', import.meta.url));
  const fromSources = '../../bin/fromSources.mjs';
  const { sourceBuild } = (await import(fromSources)) as { sourceBuild(): Promise<string> };
  return join(await sourceBuild(), 'lambdaWorker.js');
}

/** A failed invocation (the handler threw, or the function timed out or its process died). */
export class InvocationError extends Error {
  constructor(
    readonly functionName: string,
    message: string,
  ) {
    super(message);
    this.name = 'InvocationError';
  }
}

interface Pending {
  readonly resolve: (value: unknown) => void;
  readonly reject: (err: Error) => void;
}

/** What invokes a function: one container (FunctionProcess) or several (FunctionPool). */
export interface Invoker {
  readonly fn: DeployedFunction;
  invoke<T = unknown>(event: unknown): Promise<T>;
  stop(graceMs?: number): Promise<void>;
}

/**
 * A function's containers: up to `size` FunctionProcesses, each running one invocation at a time. An
 * invocation goes to an idle container, else to a new one while there are fewer than `size`, else waits
 * behind the container with the fewest invocations (as Lambda throttles past a mapping's concurrency).
 */
export class FunctionPool implements Invoker {
  private readonly containers: FunctionProcess[] = [];
  private readonly load = new Map<FunctionProcess, number>();
  /** The most containers seen busy at once: invocations that ran at the same time. */
  peak = 0;

  constructor(
    readonly fn: DeployedFunction,
    readonly size: number,
    private readonly container: () => FunctionProcess,
  ) {
    if (!Number.isInteger(size) || size < 1)
      throw new Error(`a function has 1 container or more, not ${size}`);
  }

  /** Containers started so far. */
  get started(): number {
    return this.containers.length;
  }

  async invoke<T = unknown>(event: unknown): Promise<T> {
    const load = (c: FunctionProcess) => this.load.get(c) ?? 0;
    let chosen = this.containers.find((c) => load(c) === 0);
    if (!chosen && this.containers.length < this.size) {
      chosen = this.container();
      this.containers.push(chosen);
    }
    chosen ??= this.containers.reduce((a, b) => (load(b) < load(a) ? b : a));
    const c = chosen;
    this.load.set(c, load(c) + 1);
    this.peak = Math.max(this.peak, this.containers.filter((x) => load(x) > 0).length);
    try {
      return await c.invoke<T>(event);
    } finally {
      this.load.set(c, load(c) - 1);
    }
  }

  async stop(graceMs?: number): Promise<void> {
    await Promise.all(this.containers.map((c) => c.stop(graceMs)));
  }
}

export class FunctionProcess implements Invoker {
  private child: ChildProcess | undefined;
  private ready: Promise<void> | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  /** Invocations wait for the one before (one at a time, as one container). */
  private queue: Promise<unknown> = Promise.resolve();
  private stopped = false;

  constructor(
    readonly fn: DeployedFunction,
    private readonly script: string,
    /** The whole environment of the process (the function's, the runtime's, moto's). */
    private readonly env: NodeJS.ProcessEnv,
    /** Each line the function prints (its logs). */
    private readonly onOutput: (line: string) => void,
  ) {}

  invoke<T = unknown>(event: unknown): Promise<T> {
    const run = this.queue.then(
      () => this.invokeNow(event),
      () => this.invokeNow(event),
    );
    this.queue = run.catch(() => undefined);
    return run as Promise<T>;
  }

  private async invokeNow(event: unknown): Promise<unknown> {
    if (this.stopped) throw new InvocationError(this.fn.functionName, 'the rehearsal is stopping');
    await this.start();
    const child = this.child as ChildProcess;
    const id = this.nextId++;
    const timeoutMs = this.fn.timeoutSeconds * 1000;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(
          new InvocationError(
            this.fn.functionName,
            `Task timed out after ${this.fn.timeoutSeconds}.00 seconds`,
          ),
        );
        this.kill();
      }, timeoutMs);
      this.pending.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      child.send({ type: 'invoke', id, event, deadline: Date.now() + timeoutMs });
    });
  }

  private start(): Promise<void> {
    if (this.ready && this.child && this.child.exitCode === null && this.child.signalCode === null) {
      return this.ready;
    }
    const child = fork(this.script, [], {
      env: this.env,
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
      execArgv: [],
      // Not in the terminal's process group: Ctrl-C reaches the rehearsal, which ends its functions after
      // the invocations under way (the process exits by itself if the rehearsal dies: its IPC closes).
      detached: true,
    });
    this.child = child;
    for (const stream of [child.stdout, child.stderr]) {
      let rest = '';
      stream?.on('data', (chunk: Buffer) => {
        const lines = (rest + chunk.toString('utf8')).split('\n');
        rest = lines.pop() ?? '';
        for (const line of lines) if (line.trim() !== '' && !metricsNoise(line)) this.onOutput(line);
      });
    }
    this.ready = new Promise<void>((resolve, reject) => {
      child.on(
        'message',
        (message: {
          type: string;
          id?: number;
          ok?: boolean;
          result?: unknown;
          error?: { name: string; message: string };
        }) => {
          if (message.type === 'ready') {
            resolve();
            return;
          }
          const waiting = message.id === undefined ? undefined : this.pending.get(message.id);
          if (!waiting) return;
          this.pending.delete(message.id as number);
          if (message.ok) waiting.resolve(message.result);
          else
            waiting.reject(
              new InvocationError(
                this.fn.functionName,
                `${message.error?.name ?? 'Error'}: ${message.error?.message ?? 'failed'}`,
              ),
            );
        },
      );
      child.on('exit', (code, signal) => {
        const why = `the function's process exited (${signal ?? `code ${code}`})`;
        reject(new InvocationError(this.fn.functionName, why));
        for (const [id, waiting] of this.pending) {
          this.pending.delete(id);
          waiting.reject(new InvocationError(this.fn.functionName, why));
        }
      });
      child.on('error', (err) => reject(new InvocationError(this.fn.functionName, err.message)));
    });
    return this.ready;
  }

  private kill(): void {
    const child = this.child;
    this.child = undefined;
    this.ready = undefined;
    if (child && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }

  /** Ends the process (after the invocation under way, if any, up to `graceMs`). */
  async stop(graceMs = 5_000): Promise<void> {
    this.stopped = true;
    await Promise.race([this.queue, new Promise((r) => setTimeout(r, graceMs))]);
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    await new Promise<void>((resolve) => {
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 2_000).unref();
    });
  }
}

/**
 * What Powertools Metrics prints: EMF lines (Lambda would send them to CloudWatch; nothing reads them
 * here) and, with metrics off, its notice that there were none. The rehearsal leaves them out of the
 * functions' output.
 */
function metricsNoise(line: string): boolean {
  return line.startsWith('{"_aws":') || line.startsWith('No application metrics to publish.');
}
