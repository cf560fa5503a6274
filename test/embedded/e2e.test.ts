import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { alive, startDev, until } from '../../testkit/processes.ts';

const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function cli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      [bin, ...args],
      { env: { ...process.env, ...env }, timeout: 60_000 },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        done({ code, stdout, stderr });
      },
    );
  });
}

/** The CLI with its stdout read by nobody: the pipe's far end is closed at once (`metastatic … | true`). */
function cliIntoClosedPipe(
  args: string[],
): Promise<{ code: number | null; signal: string | null; stderr: string }> {
  return new Promise((done) => {
    const child = spawn(process.execPath, [bin, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.destroy();
    let stderr = '';
    child.stderr.on('data', (d) => {
      stderr += d;
    });
    child.on('close', (code, signal) => done({ code, signal, stderr }));
  });
}

/** A process's group and session, from /proc/<pid>/stat (the fields after the command's name). */
function sessionOf(pid: number): { pgid: number; sid: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const [, , pgid, sid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return { pgid: Number(pgid), sid: Number(sid) };
}

function greeting(port: number): Promise<string> {
  return new Promise((ok, fail) => {
    const s = connect(port, '127.0.0.1');
    s.once('data', (d) => {
      ok(d.toString());
      s.destroy();
    });
    s.once('error', fail);
  });
}

// Each step spawns a CLI process (node + tsx) against a embedded pool of more processes: on a loaded machine a
// step takes many times its usual few seconds. The timeouts catch hangs; they assert no speed.
describe('metastatic CLI end to end (a new user’s session)', { timeout: 180_000 }, () => {
  let stateDir: string;
  let dev: ChildProcess;
  let devOutput = () => '';
  const withState = (args: string[]) => ['--state-dir', stateDir, ...args];

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-e2e-'));
    const started = await startDev(bin, stateDir, ['--reaper-interval', '0.3']);
    dev = started.process;
    devOutput = started.log;
  });

  afterAll(async () => {
    if (dev.exitCode === null) dev.kill('SIGKILL');
    await rm(stateDir, { recursive: true, force: true });
  });

  it('packs three requests onto two backing processes, releases them and stops both after grace-time', async () => {
    const runs = [];
    for (let i = 0; i < 3; i++)
      runs.push(await cli(withState(['request', 'small-node', '--wait', '--json', '--timeout', '30'])));
    for (const r of runs) expect(r.code, r.stderr + devOutput()).toBe(0);
    const requests = runs.map((r) => JSON.parse(r.stdout));
    for (const r of requests) {
      expect(r.state).toBe('fulfilled');
      expect(r.nodes).toHaveLength(1);
      expect(Object.keys(r.nodes[0]).sort()).toEqual(
        [
          'attributes',
          'backingNodeId',
          'host',
          'hostKeys',
          'id',
          'label',
          'port',
          'request',
          'slot',
          'state',
          'username',
          'connectionType',
          'pythonPath',
          'shellType',
        ].sort(),
      );
      expect(r.nodes[0].request).toBe(r.id);
      // One user per slot on a local backing node.
      expect(r.nodes[0].username).toBe(`slot${r.nodes[0].slot}`);
    }
    const nodes = requests.map((r) => r.nodes[0]);
    expect(new Set(nodes.map((n) => n.backingNodeId)).size).toBe(2);
    expect(nodes[0].backingNodeId).toBe(nodes[1].backingNodeId);
    for (const n of nodes) expect(await greeting(n.port)).toContain(n.backingNodeId);
    const pids = [...new Set(nodes.map((n) => n.attributes.pid as number))];
    expect(pids.every(alive)).toBe(true);

    const listed = JSON.parse((await cli(withState(['list', 'backing', '--json']))).stdout);
    expect(listed.map((b: { usedSlots: number }) => b.usedSlots).sort()).toEqual([1, 2]);
    expect(Object.keys(listed[0])).toEqual(
      expect.arrayContaining([
        'id',
        'label',
        'state',
        'slots',
        'usedSlots',
        'host',
        'port',
        'launchedAt',
        'lastUsedAt',
      ]),
    );

    for (const n of nodes) {
      const rel = await cli(withState(['release', n.id, '--json']));
      expect(rel.code, rel.stderr).toBe(0);
      expect(JSON.parse(rel.stdout).state).toBe('released');
    }
    // grace-time is 2 s in examples/local.yaml; the reaper runs every 0.3 s.
    await until('both backing nodes stopped', async () => {
      const out = JSON.parse((await cli(withState(['list', 'backing', '--json']))).stdout);
      return out.length === 0 ? true : undefined;
    });
    await until('backing processes gone', async () => (pids.some(alive) ? undefined : true));
    const all = JSON.parse((await cli(withState(['list', 'backing', '--json', '--all']))).stdout);
    expect(all.map((b: { state: string }) => b.state)).toEqual(['stopped', 'stopped']);
  });

  it('requests a node by shape: the label whose slot fits is chosen and recorded', async () => {
    const r = await cli(withState(['request', '--cores', '1', '--memory', '1GiB', '--wait', '--json']));
    expect(r.code, r.stderr + devOutput()).toBe(0);
    const request = JSON.parse(r.stdout);
    expect(request).toMatchObject({
      state: 'fulfilled',
      labels: ['small-node'],
      shapes: [{ cores: 1, memory: '1GiB' }],
    });
    expect(request.nodes[0].label).toBe('small-node');
    expect((await cli(withState(['release', request.nodes[0].id]))).code).toBe(0);
    const tooBig = await cli(withState(['request', '--cores', '4', '--wait', '--json', '--timeout', '30']));
    expect(tooBig.code).toBe(1);
    expect(JSON.parse(tooBig.stdout).reason).toContain("no label's slot fits shape 1 (4 cores)");
    const both = await cli(withState(['request', 'small-node', '--cores', '1']));
    expect(both.code).toBe(2);
    expect(both.stderr).toContain('give labels or a shape (--cores, --memory, --disk), not both');
    const badSize = await cli(withState(['request', '--memory', '4 gigs']));
    expect(badSize.code).toBe(2);
    expect(badSize.stderr).toContain('--memory: must be a size with a unit');
  });

  it('cancels a request by id: one not received yet ends cancelled; a fulfilled one is refused (exit 1)', async () => {
    const early = await cli(withState(['cancel', 'never-sent', '--reason', 'changed my mind', '--json']));
    expect(early.code, early.stderr + devOutput()).toBe(0);
    expect(JSON.parse(early.stdout)).toMatchObject({
      id: 'never-sent',
      state: 'failed',
      reason: 'cancelled: changed my mind',
    });
    const served = await cli(
      withState(['request', 'small-node', '--id', 'served-1', '--wait', '--timeout', '30']),
    );
    expect(served.code, served.stderr).toBe(0);
    const late = await cli(withState(['cancel', 'served-1']));
    expect(late.code).toBe(1);
    expect(late.stderr).toContain('request served-1 was already fulfilled: release its nodes instead');
    expect((await cli(withState(['release', 'served-1/0']))).code).toBe(0);
    expect((await cli(withState(['cancel', '../bad']))).code).toBe(2);
  });

  it('exits quietly, 141 as a Unix tool ended by SIGPIPE, when the reader closes its output (list, validate, schema)', async () => {
    const results = await Promise.all([
      cliIntoClosedPipe(withState(['list', 'requests', '--all'])),
      cliIntoClosedPipe(['validate', join(root, 'examples', 'local.yaml')]),
      cliIntoClosedPipe(['schema']),
    ]);
    expect(results).toEqual(Array(3).fill({ code: 141, signal: null, stderr: '' }));
  });

  it('reports an unknown node and a usage error with distinct exit codes', async () => {
    const unknown = await cli(withState(['release', 'nobody/0']));
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain('unknown node nobody/0');
    const usage = await cli(withState(['release', 'not-a-node-id']));
    expect(usage.code).toBe(2);
    const badLabel = await cli(withState(['request', 'no-such-label', '--wait', '--json']));
    expect(badLabel.code).toBe(1);
    expect(JSON.parse(badLabel.stdout)).toMatchObject({
      state: 'failed',
      reason: expect.stringContaining('unknown label'),
    });
  });

  it('stops on SIGINT, leaving no backing process and no dev.json, also when its output closed first', async () => {
    const r = JSON.parse((await cli(withState(['request', 'small-node', '--wait', '--json']))).stdout);
    const pid = r.nodes[0].attributes.pid as number;
    expect(alive(pid)).toBe(true);
    // The backing process leads a session of its own: a signal from dev's terminal (Ctrl-C, Ctrl-Z, a
    // hangup) reaches dev alone, which stops its backing nodes in order (below) or leaves them running.
    const { sid, pgid } = sessionOf(pid);
    expect({ sid, pgid }).toEqual({ sid: pid, pgid: pid });
    expect(sessionOf(dev.pid as number).sid).not.toBe(pid);
    const exited = new Promise<number | null>((ok) => dev.once('exit', (code) => ok(code)));
    // `npm start | tee dev.log`, then Ctrl-C: the signal ends tee as well, so the pool stops with its
    // output pipe closed (every line it writes then fails with EPIPE). It must still stop everything.
    dev.stdout?.destroy();
    dev.stderr?.destroy();
    dev.kill('SIGINT');
    expect(await exited).toBe(0);
    expect(alive(pid)).toBe(false);
    expect(existsSync(join(stateDir, 'dev.json'))).toBe(false);
  });
});

describe('metastatic CLI without a running pool', { timeout: 180_000 }, () => {
  it('validates configurations with YAML paths and exit codes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-cfg-'));
    const bad = join(dir, 'bad.yaml');
    await writeFile(
      bad,
      'providers:\n  - name: meta\n    driver: metastatic\n    pools:\n      - name: main\n        labels:\n          - name: s\n            backing-label: nowhere\n            max-parallel-jobs: 0\n',
    );
    const invalid = await cli(['validate', bad]);
    expect(invalid.code).toBe(1);
    expect(invalid.stderr).toContain('providers[0].pools[0].labels[0].max-parallel-jobs');
    expect(invalid.stderr).toContain('providers[0].pools[0].labels[0].backing-label');
    const valid = await cli(['validate', join(root, 'examples', 'local.yaml')]);
    expect(valid.code).toBe(0);
    expect(valid.stderr).toBe('');
    // Valid but ignored keys are warnings: exit 0, the path on stderr, and in --json.
    const example = await readFile(join(root, 'examples', 'local.yaml'), 'utf8');
    const minReady = join(dir, 'min-ready.yaml');
    await writeFile(
      minReady,
      `labels:\n  - name: large-node\n    min-ready: 1\n  - name: small-node\n    min-ready: 2\n${example}`,
    );
    const warned = await cli(['validate', minReady]);
    expect(warned.code).toBe(0);
    // small-node's min-ready is kept; large-node is a backing label, which min-ready does not keep.
    expect(warned.stderr).toBe(
      `warning: ${minReady}: labels[0].min-ready: no metastatic pool offers label "large-node": no node of it is kept ready\n`,
    );
    const asJson = JSON.parse((await cli(['validate', minReady, '--json'])).stdout);
    expect(asJson).toMatchObject({ valid: true, warnings: [{ path: 'labels[0].min-ready' }] });
    // Shapes: which label a request by each would get, and which none can serve (exit 1).
    const shapes = await cli([
      'validate',
      join(root, 'examples', 'local.yaml'),
      '--shape',
      'cores=1,memory=2GiB',
      '--shape',
      'cores=8',
      '--json',
    ]);
    expect(shapes.code).toBe(1);
    expect(JSON.parse(shapes.stdout)).toMatchObject({
      valid: true,
      labels: [
        { pool: 'meta/main', label: 'small-node', slot: { cores: 1, memory: '2GiB' }, slotHourlyCost: 0.1 },
      ],
      shapes: [
        { shape: 'cores=1,memory=2GiB', label: 'small-node', slotHourlyCost: 0.1 },
        {
          shape: 'cores=8',
          label: null,
          reason: expect.stringContaining("no label's slot fits shape 1 (8 cores)"),
        },
      ],
    });
    // A scan of instances the functions cannot reach (issue 22, defect 7): refused, with the fix, unless
    // the functions run in the instances' VPC. host-key-checking alone is accepted outside it: the keys
    // then come from the console output (host-keys: console, the default there; issue 23).
    const scanning = join(dir, 'scanning.yaml');
    const aws = await readFile(join(root, 'examples', 'aws.yaml'), 'utf8');
    const checking = aws.replace(/(\n( *)backing-label: .*\n)/, '$1$2host-key-checking: true\n');
    await writeFile(scanning, checking.replace(/(\n( *)security-group-id: .*\n)/, '$1$2host-keys: scan\n'));
    const refused = await cli(['validate', scanning]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/pools\[0\]\.host-keys: host-keys: scan: .*--functions-in-vpc/);
    expect((await cli(['validate', scanning, '--functions-in-vpc'])).code).toBe(0);
    const fromConsole = join(dir, 'console.yaml');
    await writeFile(fromConsole, checking);
    expect((await cli(['validate', fromConsole])).code).toBe(0);
    const badShape = await cli(['validate', join(root, 'examples', 'local.yaml'), '--shape', 'cores']);
    expect(badShape.code).toBe(2);
    expect(badShape.stderr).toContain('--shape cores: expected key=value pairs');
    await rm(dir, { recursive: true, force: true });
  });

  it('explains how to start a pool when none is running', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-none-'));
    const r = await cli(['--state-dir', dir, 'list', 'nodes']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('no running pool found');
    // As it was started (node bin/metastatic.mjs, here): this repository's bin/metastatic (issue 41, defect 9).
    expect(r.stderr).toContain('Start one with `bin/metastatic dev`');
    await rm(dir, { recursive: true, force: true });
  });

  it("refuses the pool's own min-ready ids with exit 2, before looking for a pool", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-none-'));
    const r = await cli(['--state-dir', dir, 'cancel', 'min-ready:small-node:0:1']);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toContain(
      '"min-ready:small-node:0:1" is one of the pool\'s own min-ready requests: no message may end it',
    );
    await rm(dir, { recursive: true, force: true });
  });

  // Issue 22, defects 2 and 4: parseInt read 1e300 as 1 and 0x10 as 0; 1e-300 cores passed to the queue.
  it('refuses numbers a request cannot carry with exit 2, before looking for a pool', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-none-'));
    const cases: Array<[string[], string]> = [
      [['--priority', '1e300'], '--priority must be an integer from -1000000 to 1000000'],
      [['--priority', '0x10'], '--priority must be an integer from -1000000 to 1000000'],
      [['--priority', '12abc'], '--priority must be an integer from -1000000 to 1000000'],
      [['--priority', '1000001'], '--priority must be an integer from -1000000 to 1000000'],
      [['--priority', ''], '--priority must be an integer from -1000000 to 1000000'],
      [['--cores', '0.0001'], '--cores: must be at least 0.001 (a thousandth of a core)'],
      [['--cores', '1e-300'], '--cores must be a number > 0, written in decimal'],
      [['--expected-duration', '0.5'], 'expected-duration: must be at least 1 second'],
      [
        ['--expected-duration', '1e-320'],
        '--expected-duration must be a number of seconds >= 0, written in decimal',
      ],
    ];
    const runs = await Promise.all(
      cases.map(([args]) =>
        cli(['--state-dir', dir, 'request', ...(args[0] === '--cores' ? [] : ['small-node']), ...args]),
      ),
    );
    for (const [i, r] of runs.entries()) {
      const [args, message] = cases[i] as [string[], string];
      expect(r.code, `${args.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr, args.join(' ')).toContain(message);
    }
    await rm(dir, { recursive: true, force: true });
  });

  it('exits 2 on usage errors and 0 on --help', async () => {
    expect((await cli(['frobnicate'])).code).toBe(2);
    const help = await cli(['request', '--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('--wait');
    expect(help.stdout).toContain('--cores');
  });
});
