import { type ChildProcess, execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDev, stopDev, until } from '../../testkit/processes.ts';

/**
 * min-ready in `metastatic dev`, through the CLI a user runs: the pool makes its ready node as it
 * starts (not a reaper interval later), `list nodes` shows it with no request, and a request takes it.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 60_000 }, (err, stdout, stderr) => {
      done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr });
    });
  });
}

interface ListedNode {
  id: string;
  state: string;
  request: string | null;
  minReadyNode?: string;
}

describe('min-ready in metastatic dev', { timeout: 180_000 }, () => {
  let stateDir: string;
  let dev: ChildProcess;
  let devOutput = () => '';
  const withState = (args: string[]) => ['--state-dir', stateDir, ...args];
  const nodes = async (): Promise<ListedNode[]> => {
    const out = await cli(withState(['list', 'nodes', '--json']));
    if (out.code !== 0) throw new Error(out.stderr);
    return JSON.parse(out.stdout) as ListedNode[];
  };

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-min-ready-'));
    const config = join(stateDir, 'min-ready.yaml');
    const example = await readFile(join(root, 'examples', 'local.yaml'), 'utf8');
    await writeFile(
      config,
      `labels:\n  - name: large-node\n  - name: small-node\n    min-ready: 1\n${example}`,
    );
    // The default reaper interval (60 s): the ready node must come from the run at start.
    const started = await startDev(bin, stateDir, ['-c', config]);
    dev = started.process;
    devOutput = started.log;
  });

  afterAll(async () => {
    await stopDev(dev);
    await rm(stateDir, { recursive: true, force: true });
  });

  it('keeps a ready node with no request, and a request takes it at once', async () => {
    const ready = await until(
      'a min-ready node',
      async () => {
        const listed = await nodes();
        return listed.find((n) => n.request === null && n.state === 'ready');
      },
      60_000,
    );
    expect(ready.id).toBe('min-ready:small-node:0:0/0');
    const table = await cli(withState(['list', 'nodes']));
    expect(table.stdout).toMatch(/min-ready:small-node:0:0\/0\s+small-node\s+ready\s+\(min-ready\)/);

    const out = await cli(withState(['request', 'small-node', '--id', 'job-1', '--wait', '--json']));
    expect(out.code, out.stderr + devOutput()).toBe(0);
    const job = JSON.parse(out.stdout);
    expect(job.state).toBe('fulfilled');
    expect(job.nodes[0]).toMatchObject({ request: 'job-1', minReadyNode: ready.id });
    // The pool made the next one: the job's node and a new free ready node are listed, the taken one not.
    await until(
      'the replacement',
      async () => {
        const listed = await nodes();
        return listed.some((n) => n.id === 'min-ready:small-node:0:1/0' && n.state === 'ready')
          ? true
          : undefined;
      },
      60_000,
    );
    const ids = (await nodes()).map((n) => n.id).sort();
    expect(ids).toEqual(['job-1/0', 'min-ready:small-node:0:1/0']);
  });
});
