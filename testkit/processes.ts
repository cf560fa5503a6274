import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

/** Whether a process exists (signal 0 probes without touching it). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls until the probe returns a value, or fails naming what it waited for. Never asserts timing. */
export async function until<T>(
  what: string,
  probe: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 30_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Kills a local backing node left behind by a test, if that pid still is one: by cleanup time a pid that
 * has exited may belong to another process (pids are reused), which must not be killed.
 */
export function killBackingNode(pid: number): void {
  let cmdline: string;
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return; // gone (or no /proc: nothing can be checked, so nothing is killed)
  }
  if (!/backingNode\.(ts|js)\0/.test(cmdline)) return;
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Exited meanwhile.
  }
}

/** A `metastatic dev` process started by a test, and what it printed so far. */
export interface DevProcess {
  readonly process: ChildProcess;
  /** Its stdout and stderr so far (for a failed assertion's message). */
  log(): string;
}

/**
 * Starts `metastatic dev` (bin/metastatic.mjs) on `stateDir` with these extra arguments (and `env`, by
 * default this process's), and waits until it has written dev.json (its engines and queues are up).
 */
export async function startDev(
  bin: string,
  stateDir: string,
  args: readonly string[],
  env: NodeJS.ProcessEnv = process.env,
): Promise<DevProcess> {
  const child = spawn(process.execPath, [bin, '--state-dir', stateDir, 'dev', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env,
  });
  let output = '';
  child.stdout?.on('data', (d) => {
    output += d;
  });
  child.stderr?.on('data', (d) => {
    output += d;
  });
  await until('dev.json', async () => (existsSync(join(stateDir, 'dev.json')) ? true : undefined));
  return { process: child, log: () => output };
}

/** Stops a `metastatic dev` a test started (SIGTERM; SIGKILL if it is not gone within 30 s). */
export async function stopDev(dev: ChildProcess | undefined): Promise<void> {
  if (!dev || dev.exitCode !== null) return;
  dev.kill('SIGTERM');
  await until('dev to stop', () => (dev.exitCode !== null ? true : undefined), 30_000).catch(() =>
    dev.kill('SIGKILL'),
  );
}

/** How many processes run as `uid` (whose command line matches `pattern`, when given): pgrep's count. */
export function processesOf(uid: number | string, pattern?: string): number {
  try {
    const args = ['-u', String(uid), ...(pattern === undefined ? [] : ['-f', pattern])];
    return execFileSync('pgrep', args).toString().trim().split('\n').length;
  } catch {
    return 0; // pgrep exits 1 when none matches
  }
}
