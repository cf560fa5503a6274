import { type ChildProcess, spawn } from 'node:child_process';
import { chmod, copyFile, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PoolClient } from '../../client/poolClient.ts';
import type { PoolRequest } from '../../client/records.ts';
import { startDev, stopDev, until } from '../../testkit/processes.ts';

/**
 * `metastatic run` as a CI step uses it, against one `metastatic dev` (reaper every 0.5 s) shared by every
 * test here: the command's output and status come back unchanged, the request is released whatever ends
 * it (exit, signal to the command, SIGINT/SIGTERM to run, kill -9 through the lease), and each failure
 * has its exit code and reason. Independent cases run concurrently; the pool's stop comes last.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

const CONFIG = `providers:
  - name: local
    driver: local
    pools:
      - name: main
        max-servers: 8
        labels:
          - name: large-node
            boot-delay: 0.2
  - name: meta
    driver: metastatic
    pools:
      - name: main
        max-servers: 40
        labels:
          - name: small-node
            backing-label: large-node
            max-parallel-jobs: 8
            grace-time: 60
            cores: 1
            memory: 2GiB
`;

interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: string;
}

interface Running {
  child: ChildProcess;
  stderr(): string;
  done: Promise<Ran>;
}

describe('metastatic run against metastatic dev', { timeout: 120_000 }, () => {
  let stateDir: string;
  let work: string;
  let dev: ChildProcess;
  let devLog = () => '';
  let pool: PoolClient;

  /** Starts `metastatic run ARGS` (no shell), `input` on its stdin. */
  const start = (args: string[], input?: Buffer | string): Running => {
    const child = spawn(process.execPath, [bin, '--state-dir', stateDir, 'run', ...args], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    let err = '';
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => {
      err += d;
    });
    child.stdin?.on('error', () => {});
    child.stdin?.end(input);
    const done = new Promise<Ran>((resolve) =>
      child.on('close', (code, signal) => resolve({ code, signal, stdout: Buffer.concat(out), stderr: err })),
    );
    return { child, stderr: () => err, done };
  };
  const run = (args: string[], input?: Buffer | string) => start(args, input).done;

  /** The request as recorded, once none of its nodes is held any more. */
  const released = (id: string) =>
    until(
      `request ${id} released`,
      async () => {
        const r = await pool.get(id);
        return r && r.nodes.length > 0 && r.nodes.every((n) => n.state === 'released') ? r : undefined;
      },
      30_000,
    );
  /** The request id `run` printed on stderr (`running on <id>/0 ...`). */
  const requestIdIn = (stderr: string) => /running on ([^/\s]+)\/0/.exec(stderr)?.[1] ?? '';

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-run-'));
    work = await mkdtemp(join(tmpdir(), 'metastatic-run-work-'));
    const config = join(work, 'run.yaml');
    await writeFile(config, CONFIG);
    const started = await startDev(bin, stateDir, ['-c', config, '--reaper-interval', '0.5']);
    dev = started.process;
    devLog = started.log;
    pool = await PoolClient.connect({ stateDir });
  });

  afterAll(async () => {
    pool?.close();
    await stopDev(dev);
    await rm(stateDir, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
  });

  describe.concurrent('while the pool runs', () => {
    it("prints the command's stdout alone and exits with its status; the node is released", async () => {
      const out = await run(['small-node', '--id', 'hi', '--', 'sh', '-c', 'echo hi; exit 3']);
      expect(out.code, out.stderr + devLog()).toBe(3);
      expect(out.stdout.toString()).toBe('hi\n');
      expect(out.stderr).toContain('running on hi/0');
      expect((await released('hi')).nodes[0]?.reason ?? '').not.toContain('lease');
    });

    it('passes stdin and stdout byte for byte (0-255), and each argument exactly', async () => {
      const bytes = Buffer.from(Array.from({ length: 256 * 64 }, (_, i) => i % 256));
      const args = ['a b', "it's", '"q"', '$HOME', 'x;y', 'l1\nl2', '', '*', '`id`', '\\'];
      const script = 'cat; printf "[%s]\\n" "$@"';
      const out = await run(['small-node', '-q', '--', 'sh', '-c', script, 'sh', ...args], bytes);
      expect(out.code, out.stderr).toBe(0);
      const listed = Buffer.from(args.map((a) => `[${a}]\n`).join(''));
      expect(out.stdout.equals(Buffer.concat([bytes, listed]))).toBe(true);
      expect(out.stderr).toBe('');
    });

    it('exits 128+n when a signal killed the command', async () => {
      const out = await run(['small-node', '-q', '--', 'sh', '-c', 'kill -TERM $$']);
      expect(out.code, out.stderr).toBe(143);
    });

    for (const [signal, code] of [
      ['SIGINT', 130],
      ['SIGTERM', 143],
    ] as const) {
      it(`releases the node and exits ${code} on ${signal}`, async () => {
        const running = start(['small-node', '--', 'sh', '-c', 'echo started; exec sleep 100']);
        await until(
          'the command to run',
          () => (running.stderr().includes('running on') ? true : undefined),
          90_000,
        );
        running.child.kill(signal);
        const out = await running.done;
        expect(out.code, out.stderr).toBe(code);
        expect(out.stderr).toContain(`stopped by ${signal}`);
        await released(requestIdIn(out.stderr));
      });
    }

    it('kill -9: the lease releases the node (lease 10 s, reaper every 0.5 s)', async () => {
      const running = start(['small-node', '--lease', '10', '--', 'sleep', '100']);
      await until(
        'the command to run',
        () => (running.stderr().includes('running on') ? true : undefined),
        90_000,
      );
      const killedAt = Date.now();
      running.child.kill('SIGKILL');
      // Its ssh lives on (holding the pipes) until the node's release ends the session.
      const id = requestIdIn(running.stderr());
      const r: PoolRequest = await released(id);
      expect(r.nodes[0]?.reason).toBe('lease expired');
      expect(Date.now() - killedAt).toBeLessThan(10_000 + 500 + 8_000);
    });

    it('exits 124 with the reason when no node can be had, 2 for an unknown label', async () => {
      const [none, unknown] = await Promise.all([
        run(['--cores', '500', '--', 'true']),
        run(['no-such-label', '--', 'true']),
      ]);
      expect(none.code).toBe(124);
      expect(none.stderr).toMatch(/no node could be had: request \S+ failed: no label's slot fits/);
      expect(unknown.code).toBe(2);
      expect(unknown.stderr).toContain('unknown label "no-such-label"');
      expect(none.stdout.length + unknown.stdout.length).toBe(0);
    });

    it('two runs at once each get a node of their own', async () => {
      const both = await Promise.all(
        [1, 2].map(() => run(['small-node', '-q', '--', 'sh', '-c', 'echo "$METASTATIC_NODE_ID"; sleep 1'])),
      );
      for (const out of both) expect(out.code, out.stderr).toBe(0);
      const ids = both.map((o) => o.stdout.toString().trim());
      expect(new Set(ids).size).toBe(2);
    });

    it('with several labels runs on the first node and lists every node in METASTATIC_NODES', async () => {
      const out = await run([
        'small-node',
        'small-node',
        '--id',
        'pair',
        '--',
        'sh',
        '-c',
        'echo "$METASTATIC_NODE_ID $METASTATIC_REQUEST_ID"; echo "$METASTATIC_NODES" | cut -d" " -f1',
      ]);
      expect(out.code, out.stderr).toBe(0);
      expect(out.stdout.toString()).toBe('pair/0 pair\npair/0\npair/1\n');
      expect(out.stderr).toContain('also pair/1');
      await released('pair');
    });

    it('refuses an --id already in the table with exit 2, and runs on it with --attach (issue 41, defect 4)', async () => {
      // Another job's request, with the body this run would send: the pool would hand it over.
      await pool.request({ id: 'taken', labels: ['small-node'], requestor: 'cli', lease: 60 });
      await pool.waitFor('taken');
      const refused = await run(['small-node', '--id', 'taken', '--', 'echo', 'ran']);
      expect(refused.code, refused.stderr).toBe(2);
      expect(refused.stderr).toContain('request taken already exists');
      expect(refused.stderr).toContain('--attach');
      expect(refused.stdout.toString()).toBe('');
      expect((await pool.get('taken'))?.nodes.map((n) => n.state)).toEqual(['ready']);
      const attached = await run(['small-node', '--id', 'taken', '--attach', '-q', '--', 'echo', 'ran']);
      expect(attached.code, attached.stderr).toBe(0);
      expect(attached.stdout.toString()).toBe('ran\n');
      await released('taken');
    });

    it('refuses a key file others can read, with the reason, before requesting', async () => {
      const loose = join(work, 'loose_key');
      await copyFile(join(stateDir, 'client_ed25519'), loose);
      await chmod(loose, 0o644);
      const out = await run(['small-node', '--identity', loose, '--', 'true']);
      expect(out.code).toBe(125);
      expect(out.stderr).toContain(`permissions 0644 for identity ${loose} are too open`);
    });
  });

  it('exits 123 saying so when the pool stops under the command', async () => {
    const running = start(['small-node', '--', 'sleep', '100']);
    await until(
      'the command to run',
      () => (running.stderr().includes('running on') ? true : undefined),
      90_000,
    );
    dev.kill('SIGTERM');
    const out = await running.done;
    expect(out.code, out.stderr).toBe(123);
    expect(out.stderr).toMatch(/the pool (stopped|ended the node) under the command.*(stopped)/);
  });
});
