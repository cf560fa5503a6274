import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { alive, killBackingNode, startDev, stopDev, until } from '../../testkit/processes.ts';

/**
 * Operator verbs against a running `metastatic dev`, through the CLI a user runs (issue 22, defect 5).
 * `metastatic reap` used to build its own local provider: when its min-ready step launched a backing
 * node, the CLI became that process's parent, never exited, and Ctrl-C on it (its process group) killed
 * the spare. It also re-read the configuration file, which dev does not, and the two undid each other's
 * work. Now the verbs are handed to the running pool, which acts with the configuration it started with.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

interface Run {
  readonly process: ChildProcess;
  exitCode(): number | null | undefined;
  output(): { stdout: string; stderr: string };
}

/** Starts the CLI in a process group of its own, as a shell runs a command (Ctrl-C signals that group). */
function startCli(args: string[]): Run {
  const child = spawn(process.execPath, [bin, ...args], {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  let code: number | null | undefined;
  child.stdout?.on('data', (d) => {
    stdout += d;
  });
  child.stderr?.on('data', (d) => {
    stderr += d;
  });
  child.on('exit', (c, signal) => {
    code = c ?? (signal ? -1 : null);
  });
  return { process: child, exitCode: () => code, output: () => ({ stdout, stderr }) };
}

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

/** The parent pid of a process (field 4 of /proc/<pid>/stat, after the parenthesized name). */
async function parentOf(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
  return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
}

function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // The group is gone already.
  }
}

interface ListedNode {
  id: string;
  state: string;
  request: string | null;
}
interface ListedBacking {
  id: string;
  state: string;
  resourceId: string | null;
}

describe('operator verbs against metastatic dev', { timeout: 240_000 }, () => {
  let stateDir: string;
  let config: string;
  let dev: ChildProcess;
  let devOutput = () => '';
  const started: Run[] = [];
  const backingPids = new Set<number>();
  const withState = (args: string[]) => ['--state-dir', stateDir, ...args];
  const listed = async <T>(what: string): Promise<T[]> => {
    const out = await cli(withState(['list', what, '--json']));
    if (out.code !== 0) throw new Error(out.stderr);
    return JSON.parse(out.stdout) as T[];
  };
  const readySpare = () =>
    until(
      'a ready min-ready node',
      async () => (await listed<ListedNode>('nodes')).find((n) => n.request === null && n.state === 'ready'),
      60_000,
    );
  const pidOf = async (resourceId: string): Promise<number> => {
    const record = JSON.parse(await readFile(join(stateDir, 'local', `${resourceId}.json`), 'utf8'));
    backingPids.add(record.pid);
    return record.pid as number;
  };
  /** Runs the CLI in its own process group and waits (bounded) for it to exit. */
  const runToExit = async (args: string[]) => {
    const run = startCli(withState(args));
    started.push(run);
    await until(
      `metastatic ${args.join(' ')} to exit`,
      () => (run.exitCode() !== undefined ? true : undefined),
      60_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}\n${JSON.stringify(run.output())}\n${devOutput()}`);
    });
    return { run, code: run.exitCode(), ...run.output() };
  };

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-operator-'));
    config = join(stateDir, 'pool.yaml');
    const example = await readFile(join(root, 'examples', 'local.yaml'), 'utf8');
    await writeFile(
      config,
      `labels:\n  - name: large-node\n  - name: small-node\n    min-ready: 1\n${example}`,
    );
    // The reaper runs only at start (an hour between runs): what `reap` does later is the CLI's call.
    const devProcess = await startDev(bin, stateDir, ['-c', config, '--reaper-interval', '3600']);
    dev = devProcess.process;
    devOutput = devProcess.log;
  });

  afterAll(async () => {
    for (const run of started) killGroup(run.process.pid);
    await stopDev(dev);
    for (const pid of backingPids) killBackingNode(pid);
    await rm(stateDir, { recursive: true, force: true });
  });

  it('reap refills min-ready through the pool: the CLI exits, and the backing process is not its child', async () => {
    const first = await readySpare();
    // The spare's backing process dies: its seat is refilled by the next reaper run, this `reap`.
    const firstBacking = (await listed<ListedBacking>('backing')).find((b) => b.resourceId !== null);
    expect(firstBacking).toBeDefined();
    process.kill(await pidOf(firstBacking?.resourceId as string), 'SIGKILL');
    await until(
      'the spare to fail',
      async () => ((await listed<ListedNode>('nodes')).some((n) => n.id === first.id) ? undefined : true),
      30_000,
    );

    const reap = await runToExit(['reap', '--json']);

    expect(reap.code, reap.stderr + devOutput()).toBe(0);
    expect(JSON.parse(reap.stdout).minReadyMade).toBe(1);
    const launched = await until(
      'the new backing node',
      async () =>
        (await listed<ListedBacking>('backing')).find(
          (b) => b.id !== firstBacking?.id && b.resourceId !== null && b.state !== 'failed',
        ),
      30_000,
    );
    const pid = await pidOf(launched.resourceId as string);
    expect(await parentOf(pid)).toBe(dev.pid);
    // Ctrl-C in the shell that ran it signals the CLI's process group: the spare is not in it.
    killGroup(reap.run.process.pid);
    const spare = await readySpare();
    expect(spare.id).not.toBe(first.id);
    expect(alive(pid)).toBe(true);
  });

  it('acts with the configuration dev started with when the file was edited since, and says so', async () => {
    const before = (await listed<ListedNode>('nodes')).filter((n) => n.request === null);
    expect(before).toHaveLength(1);
    const text = await readFile(config, 'utf8');
    await writeFile(config, text.replace('min-ready: 1', 'min-ready: 3'));

    const reap = await runToExit(['reap', '--json']);

    expect(reap.code, reap.stderr).toBe(0);
    expect(JSON.parse(reap.stdout)).toMatchObject({ minReadyMade: 0, minReadyEnded: 0 });
    expect(reap.stderr).toContain(config);
    expect(reap.stderr).toMatch(/changed since the pool started/);
    expect((await listed<ListedNode>('nodes')).filter((n) => n.request === null)).toEqual(before);
    await writeFile(config, text);
  });

  it('refuses a configuration file that differs from the running pool’s, naming both', async () => {
    const other = join(stateDir, 'other.yaml');
    const text = await readFile(config, 'utf8');
    await writeFile(other, text.replace('min-ready: 1', 'min-ready: 2'));

    const reap = await runToExit(['--stack-config', other, 'reap']);

    expect(reap.code).toBe(2);
    expect(reap.stderr).toContain(other);
    expect(reap.stderr).toContain(config);
    // The same contents under another name are the pool's configuration: accepted.
    await writeFile(other, text);
    const same = await runToExit(['--stack-config', other, 'reap', '--json']);
    expect(same.code, same.stderr).toBe(0);
  });

  it('has hold and drain run by the pool too; a refusal exits 1 with its reason', async () => {
    const unknown = await runToExit(['hold', 'nobody/0']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/unknown node "nobody\/0"/);

    const spare = await readySpare();
    const hold = await runToExit(['hold', spare.id, '--json']);
    expect(hold.code, hold.stderr).toBe(0);
    expect(JSON.parse(hold.stdout)).toMatchObject({ id: spare.id, held: true });
    const host = (await listed<ListedBacking>('backing')).find((b) => b.state !== 'failed');
    const drain = await runToExit(['drain', host?.id as string, '--json']);
    expect(drain.code, drain.stderr).toBe(0);
    expect(JSON.parse(drain.stdout)).toMatchObject({ id: host?.id, drained: true });
  });
});
