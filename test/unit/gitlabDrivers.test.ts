import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The GitLab custom executor's prepare.sh and run.sh (examples/gitlab-custom-executor) against what a
 * pool may hand them (issue 41), without a pool: `metastatic` is a stand-in that prints a given request
 * record (METASTATIC_BIN), and `ssh`, where a test says so, one that records its arguments. A record
 * whose host ssh would read as an option is refused; a label the pool lacks is the job's fault; an
 * address that never answers ends the driver within its bound. The drivers against a real pool and real
 * OpenSSH: test/embedded/ciRecipes.test.ts.
 */
const drivers = resolve(import.meta.dirname, '..', '..', 'examples', 'gitlab-custom-executor');
const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAX6KXqDdN6CVw710zrfJwiqCI16xI07DWIdiaUpjx42';
/** GitLab Runner's own values (command.go): build failure 1, system failure 2. */
const BUILD = 1;
const SYSTEM = 2;

let work: string;
let n = 0;
/** A silent TCP server: accepts, never speaks (an sshd that hangs, or an address that blackholes). */
let silent: Server;
let silentPort: number;
const sockets = new Set<Socket>();

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), 'metastatic-drivers-'));
  silent = createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((done) => silent.listen(0, '127.0.0.1', done));
  silentPort = (silent.address() as { port: number }).port;
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise((done) => silent.close(done));
  await rm(work, { recursive: true, force: true });
});

interface Job {
  dir: string;
  tmp: string;
  state: string;
  env: NodeJS.ProcessEnv;
  /** The arguments the stand-in ssh got, one call per line (empty without a stand-in). */
  sshCalls: () => Promise<string[][]>;
  /** The arguments the stand-in metastatic got, one call per line. */
  cliCalls: () => Promise<string[]>;
}

/** A job's directories and the runner's environment; `record`: what `metastatic request` prints. */
async function job(opts: { record?: object; requestStatus?: number; fakeSsh?: boolean }): Promise<Job> {
  const dir = join(work, `job${++n}`);
  const bin = join(dir, 'bin');
  const tmp = join(dir, 'tmp');
  const stateDir = join(dir, 'pool');
  await mkdir(bin, { recursive: true });
  await Promise.all([mkdir(tmp, { mode: 0o700 }), mkdir(stateDir)]);
  await writeFile(join(stateDir, 'client_ed25519'), 'not a key\n', { mode: 0o600 });
  await writeFile(join(dir, 'record.json'), JSON.stringify(opts.record ?? {}));
  await writeFile(
    join(bin, 'metastatic'),
    `#!/bin/sh\nprintf '%s\\n' "$*" >>'${dir}/cli.log'\n` +
      `case $1 in request) cat '${dir}/record.json'; exit ${opts.requestStatus ?? 0} ;; esac\nexit 0\n`,
  );
  await chmod(join(bin, 'metastatic'), 0o755);
  if (opts.fakeSsh) {
    // One line per call, arguments separated by a tab.
    await writeFile(
      join(bin, 'ssh'),
      `#!/bin/bash\nIFS=$'\\t'; printf '%s\\n' "$*" >>'${dir}/ssh.log'\nexit 0\n`,
    );
    await chmod(join(bin, 'ssh'), 0o755);
  }
  const env: NodeJS.ProcessEnv = {
    PATH: `${bin}:${process.env.PATH ?? ''}`,
    HOME: dir,
    TMPDIR: tmp,
    METASTATIC_STATE_DIR: stateDir,
    METASTATIC_BIN: join(bin, 'metastatic'),
    BUILD_FAILURE_EXIT_CODE: String(BUILD),
    SYSTEM_FAILURE_EXIT_CODE: String(SYSTEM),
    BUILD_EXIT_CODE_FILE: join(dir, 'exit_code'),
    CUSTOM_ENV_CI_JOB_ID: '5',
    CUSTOM_ENV_CI_RUNNER_ID: '7',
    METASTATIC_CI_LEASE: '600',
  };
  const lines = async (file: string) =>
    existsSync(file) ? (await readFile(file, 'utf8')).split('\n').filter((l) => l !== '') : [];
  return {
    dir,
    tmp,
    state: join(tmp, 'metastatic'),
    env,
    sshCalls: async () => (await lines(join(dir, 'ssh.log'))).map((l) => l.split('\t')),
    cliCalls: () => lines(join(dir, 'cli.log')),
  };
}

/** Runs a driver to its end (killed after `limitMs`: then `code` is null) with how long it took. */
function drive(
  script: string,
  args: string[],
  j: Job,
  env: NodeJS.ProcessEnv = {},
  limitMs = 15_000,
): Promise<{ code: number | null; err: string; ms: number }> {
  const started = Date.now();
  return new Promise((done, fail) => {
    const child = spawn(join(drivers, script), args, {
      cwd: j.tmp,
      env: { ...j.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    let err = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    const killer = setTimeout(() => {
      try {
        if (child.pid) process.kill(-child.pid, 'SIGKILL');
      } catch {}
    }, limitMs);
    child.on('error', fail);
    child.on('close', (code) => {
      clearTimeout(killer);
      done({ code, err, ms: Date.now() - started });
    });
  });
}

const ready = (node: Record<string, unknown>) => ({
  id: 'gitlab-7-5-x',
  state: 'fulfilled',
  nodes: [
    {
      id: 'gitlab-7-5-x/0',
      state: 'ready',
      host: '127.0.0.1',
      port: 40000,
      username: 'slot0',
      hostKeys: [KEY],
      ...node,
    },
  ],
});

/** The state prepare.sh leaves for run.sh, written directly: the node file and its known_hosts. */
async function prepared(j: Job, host: string, port: number): Promise<void> {
  await mkdir(j.state, { mode: 0o700 });
  await writeFile(join(j.state, 'request'), 'gitlab-7-5-x\n');
  await writeFile(join(j.state, 'node'), `gitlab-7-5-x/0\n${host}\n${port}\nslot0\n`);
  await writeFile(join(j.state, 'known_hosts'), `[127.0.0.1]:${port} ${KEY}\n`, { mode: 0o600 });
  await writeFile(join(j.dir, 'script'), 'echo hi\n');
}

describe('prepare.sh and run.sh: what a node record may put on ssh', () => {
  it('prepare refuses a record whose host or user ssh would read as an option, before anything reaches a file', async () => {
    for (const node of [
      { host: '-G' },
      { host: '-Ekhlog' },
      { host: '-oProxyCommand=x' },
      { username: '-x' },
    ]) {
      const j = await job({ record: ready(node), fakeSsh: true });
      const r = await drive('prepare.sh', [], j);
      expect(r.code, `${JSON.stringify(node)}: ${r.err}`).toBe(SYSTEM);
      expect(r.err).toMatch(/bad (host|username)/);
      expect(existsSync(join(j.state, 'node'))).toBe(false);
      expect(existsSync(join(j.state, 'known_hosts'))).toBe(false);
      expect(await j.sshCalls()).toEqual([]);
    }
  });

  it('prepare logs in once to check the node, run sends the stage: the destination after "--", bounded', async () => {
    const j = await job({ record: ready({}), fakeSsh: true });
    const p = await drive('prepare.sh', [], j, { METASTATIC_CI_WAIT: '60' });
    expect(p.code, p.err).toBe(0);
    await writeFile(join(j.dir, 'script'), 'echo hi\n');
    const r = await drive('run.sh', [join(j.dir, 'script'), 'build_script'], j);
    expect(r.code, r.err).toBe(0);
    const calls = await j.sshCalls();
    expect(calls.map((c) => c.slice(c.indexOf('--')))).toEqual([
      ['--', '127.0.0.1', 'true'],
      ['--', '127.0.0.1', 'bash'],
    ]);
    for (const c of calls) {
      expect(c).toContain('-F');
      expect(c.slice(0, c.indexOf('--'))).not.toContain('127.0.0.1');
      expect(c.some((a) => /^ConnectTimeout=[1-9][0-9]*$/.test(a))).toBe(true);
      expect(c.some((a) => /^ServerAliveInterval=[1-9][0-9]*$/.test(a))).toBe(true);
      expect(c.some((a) => /^ServerAliveCountMax=[1-9][0-9]*$/.test(a))).toBe(true);
    }
  });

  it('run refuses a node file whose host ssh would read as an option (ssh never runs)', async () => {
    const j = await job({ fakeSsh: true });
    await prepared(j, '-G', 40000);
    const r = await drive('run.sh', [join(j.dir, 'script'), 'build_script'], j);
    expect(r.code, r.err).toBe(SYSTEM);
    expect(await j.sshCalls()).toEqual([]);
  });
});

describe('prepare.sh: which failures GitLab retries', () => {
  it('a label the pool does not have is a build failure (not retried); another failure a system failure', async () => {
    const unknown = await job({
      record: {
        id: 'gitlab-7-5-x',
        state: 'failed',
        reason: 'unknown label "gpu" (configured: small-node)',
        nodes: [],
      },
      requestStatus: 1,
    });
    const r = await drive('prepare.sh', [], unknown, { CUSTOM_ENV_METASTATIC_LABEL: 'gpu' });
    expect(r.code, r.err).toBe(BUILD);
    expect(r.err).toContain('gpu');
    const other = await job({
      record: { id: 'gitlab-7-5-x', state: 'failed', reason: 'launch failed 3 times', nodes: [] },
      requestStatus: 1,
    });
    expect((await drive('prepare.sh', [], other)).code).toBe(SYSTEM);
  });

  it('waits as long as the pool keeps the request, unless METASTATIC_CI_WAIT says less', async () => {
    const failed = { id: 'gitlab-7-5-x', state: 'failed', reason: 'request-timeout', nodes: [] };
    const timeoutOf = async (env: NodeJS.ProcessEnv) => {
      const j = await job({ record: failed, requestStatus: 1 });
      await drive('prepare.sh', [], j, env);
      const call = (await j.cliCalls()).find((c) => c.startsWith('request ')) ?? '';
      return Number(/--timeout ([0-9]+)/.exec(call)?.[1]);
    };
    // Beyond any bound a configuration can give (request-timeout <= 7 days; launch-retries (20) x
    // (launch-timeout + boot-timeout, a day each) + 5 min): the pool ends the request first.
    expect(await timeoutOf({})).toBeGreaterThanOrEqual(20 * 2 * 86400 + 300);
    expect(await timeoutOf({ METASTATIC_CI_WAIT: '60' })).toBe(60);
  });
});

describe('prepare.sh and run.sh: a node whose address never answers', () => {
  it('run gives up within ConnectTimeout (a system failure), not after minutes', async () => {
    const j = await job({});
    await prepared(j, '127.0.0.1', silentPort);
    const r = await drive('run.sh', [join(j.dir, 'script'), 'build_script'], j, {
      METASTATIC_CI_CONNECT_TIMEOUT: '1',
    });
    expect(r.code, r.err).toBe(SYSTEM);
    expect(r.ms).toBeLessThan(10_000);
  });

  it('prepare gives up on the login within METASTATIC_CI_LOGIN_WAIT (a system failure: retried)', async () => {
    const j = await job({ record: ready({ port: silentPort }) });
    const r = await drive('prepare.sh', [], j, {
      METASTATIC_CI_CONNECT_TIMEOUT: '1',
      METASTATIC_CI_LOGIN_WAIT: '1',
    });
    expect(r.code, r.err).toBe(SYSTEM);
    expect(r.err).toContain('did not accept the login');
    expect(r.ms).toBeLessThan(10_000);
  });
});
