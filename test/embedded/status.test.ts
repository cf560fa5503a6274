import { type ChildProcess, execFile, execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { slotBar } from '../../cli/commands/status.ts';
import { until } from '../../testkit/processes.ts';

/**
 * `metastatic status` against a running embedded pool: its JSON, its plain snapshots when the output is
 * not a terminal, and `--watch` in a real terminal (tmux: the command runs in a pane, the test reads the
 * pane's screen and sends Ctrl-C), refreshing in place as the pool changes.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');
const hasTmux = (() => {
  try {
    execFileSync('tmux', ['-V'], { stdio: 'pipe' });
    return true;
  } catch {
    return false;
  }
})();

function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 60_000 }, (err, stdout, stderr) =>
      done({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    );
  });
}

describe('metastatic status', { timeout: 120_000 }, () => {
  let stateDir: string;
  let dev: ChildProcess;
  let log = '';
  const session = `metastatic-status-${process.pid}`;
  const state = (args: string[]) => ['--state-dir', stateDir, ...args];
  const tmux = (...args: string[]) => execFileSync('tmux', args, { encoding: 'utf8', stdio: 'pipe' });

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-status-'));
    dev = spawn(process.execPath, [bin, ...state(['dev', '--reaper-interval', '1'])], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    dev.stdout?.on('data', (d) => {
      log += d;
    });
    dev.stderr?.on('data', (d) => {
      log += d;
    });
    await until('dev.json', () => (existsSync(join(stateDir, 'dev.json')) ? true : undefined), 60_000);
    const first = await cli(state(['request', 'small-node', '--id', 'st-1', '--wait', '--timeout', '60']));
    expect(first.code, first.stderr + log).toBe(0);
  }, 120_000);

  afterAll(async () => {
    if (hasTmux) {
      try {
        tmux('kill-session', '-t', session);
      } catch {
        // ended already
      }
    }
    if (dev && dev.exitCode === null) {
      dev.kill('SIGINT');
      await until('dev stopped', () => (dev.exitCode !== null ? true : undefined), 30_000).catch(() =>
        dev.kill('SIGKILL'),
      );
    }
    await rm(stateDir, { recursive: true, force: true });
  });

  it('prints the pool as JSON: labels, backing nodes with their slots, waiting requests, last events', async () => {
    const out = await cli(state(['status', '--json']));
    expect(out.code, out.stderr).toBe(0);
    const s = JSON.parse(out.stdout);
    expect(s.labels).toEqual([
      {
        label: 'small-node',
        nodesReady: 1,
        nodesPending: 0,
        minReady: 0,
        requestsWaiting: 0,
        backingNodes: 1,
        slotsUsed: 1,
        slots: 2,
      },
    ]);
    expect(s.backing).toEqual([
      expect.objectContaining({
        label: 'small-node',
        backingLabel: 'large-node',
        state: 'ready',
        usedSlots: 1,
        slots: 2,
      }),
    ]);
    expect(s.waiting).toEqual([]);
    expect(s.events.map((e: { type: string }) => e.type)).toEqual(
      expect.arrayContaining(['Backing Node Launched', 'Request Fulfilled']),
    );
    expect(s.events.at(-1)).toMatchObject({ type: 'Request Fulfilled', subject: 'st-1' });
  });

  it('draws slot bars scaled to at most 16 cells', () => {
    expect(slotBar(1, 2)).toBe('[█·]');
    expect(slotBar(0, 4)).toBe('[····]');
    expect(slotBar(32, 64)).toBe(`[${'█'.repeat(8)}${'·'.repeat(8)}]`);
  });

  it('with --watch and no terminal, prints plain snapshots one after another until SIGINT', async () => {
    const proc = spawn(process.execPath, [bin, ...state(['status', '--watch', '--interval', '0.2'])], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    proc.stdout?.on('data', (d) => {
      out += d;
    });
    await until(
      'three snapshots',
      () => ((out.match(/^metastatic status at /gm) ?? []).length >= 3 ? true : undefined),
      30_000,
    );
    proc.kill('SIGINT');
    await until('status stopped', () => (proc.exitCode !== null ? true : undefined), 10_000);
    expect(proc.exitCode).toBe(0);
    expect(out.includes('\u001b')).toBe(false); // no escape sequences in plain output
    expect(out).toContain('[█·] 1/2');
  });

  it('with --watch --json, prints one JSON object per line', async () => {
    const proc = spawn(
      process.execPath,
      [bin, ...state(['status', '--watch', '--json', '--interval', '0.2'])],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    proc.stdout?.on('data', (d) => {
      out += d;
    });
    await until('two lines', () => (out.split('\n').filter(Boolean).length >= 2 ? true : undefined), 30_000);
    proc.kill('SIGINT');
    await until('status stopped', () => (proc.exitCode !== null ? true : undefined), 10_000);
    for (const line of out.split('\n').filter(Boolean))
      expect(JSON.parse(line).labels[0].label).toBe('small-node');
  });

  it.skipIf(!hasTmux)(
    'with --watch in a terminal, redraws in place as the pool changes, and Ctrl-C ends it',
    async () => {
      const command = [process.execPath, bin, ...state(['status', '--watch', '--interval', '0.3'])]
        .map((w) => `'${w.replaceAll("'", `'\\''`)}'`)
        .join(' ');
      tmux('new-session', '-d', '-s', session, '-x', '120', '-y', '40', command);
      const screen = () => tmux('capture-pane', '-p', '-t', session);
      const first = await until(
        'the first screen',
        () => (screen().includes('[█·] 1/2') ? screen() : undefined),
        30_000,
      );
      expect(first).toMatch(/^metastatic status at .* every 0\.3s, Ctrl-C to stop$/m);
      expect(first).toMatch(/^small-node\s+1\s+0\s+0\s+0\s+1\s+1\/2$/m);
      // The pool changes: the same screen shows the second node on the same backing node, not a second copy.
      const second = await cli(state(['request', 'small-node', '--id', 'st-2', '--wait', '--timeout', '60']));
      expect(second.code, second.stderr).toBe(0);
      const redrawn = await until(
        'the redrawn screen',
        () => (screen().includes('[██] 2/2') ? screen() : undefined),
        30_000,
      );
      expect(redrawn).toMatch(/^small-node\s+2\s+0\s+0\s+0\s+1\s+2\/2$/m);
      expect(redrawn.match(/^metastatic status at /gm)).toHaveLength(1);
      expect(redrawn).not.toContain('[█·] 1/2');
      tmux('send-keys', '-t', session, 'C-c');
      await until(
        'the session to end with the command',
        () => {
          try {
            tmux('has-session', '-t', session);
            return undefined;
          } catch {
            return true;
          }
        },
        10_000,
      );
    },
  );
});
