import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect, type PoolClient } from '../../cli/client.ts';
import {
  type CustomExecutorConfig,
  type GitLabJob,
  runCustomExecutorJob,
} from '../../testkit/gitlabRunner.ts';
import { startDev, stopDev } from '../../testkit/processes.ts';

/**
 * The CI recipes of docs/ci.md against one `metastatic dev`: the GitLab custom executor's drivers
 * (examples/gitlab-custom-executor) driven as GitLab Runner drives them (testkit/gitlabRunner.ts), with
 * the real OpenSSH client and real processes, and the plain shell example (examples/shell).
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');
const drivers = join(root, 'examples', 'gitlab-custom-executor');

/** A job variable a driver must never hand to a shell as code. */
const TRICKY = `a b 'c' "d" $(touch PWNED) \`touch PWNED\` ; touch PWNED`;

describe.concurrent('the GitLab custom executor on metastatic dev', { timeout: 120_000 }, () => {
  let stateDir: string;
  let work: string;
  let dev: ChildProcess;
  let devLog = () => '';
  let env: NodeJS.ProcessEnv;
  let repo: string;
  let sha: string;

  const config: CustomExecutorConfig = {
    configExec: join(drivers, 'config.sh'),
    prepareExec: join(drivers, 'prepare.sh'),
    runExec: join(drivers, 'run.sh'),
    cleanupExec: join(drivers, 'cleanup.sh'),
    prepareExecTimeout: 60,
    cleanupExecTimeout: 60,
    gracefulKillTimeout: 5,
    forceKillTimeout: 5,
    buildsDir: '/builds',
    cacheDir: '/cache',
  };
  let jobs = 0;
  const job = (over: Partial<GitLabJob>): GitLabJob => ({
    id: 1000 + ++jobs,
    runnerId: 7,
    projectPath: 'group/project',
    repositoryUrl: repo,
    sha,
    variables: { METASTATIC_LABEL: 'small-node', TRICKY },
    script: ['true'],
    ...over,
  });
  let client: PoolClient;
  /** The request a job's prepare sent, by the id its log names; its nodes' states. */
  const nodesOf = async (log: string): Promise<string[]> => {
    const id = /request (gitlab-7-[0-9]+-[0-9a-f]+)/.exec(log)?.[1];
    if (!id) throw new Error(`no request in the job log:\n${log}`);
    const r = await client.store.getRequest(id);
    return (r?.nodes ?? []).map((n) => n.state);
  };

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-ci-'));
    work = await mkdtemp(join(tmpdir(), 'metastatic-ci-work-'));
    // The example pool, with room for every job here on one backing node that outlives the file's jobs
    // (a boot per job would cost seconds): the jobs run concurrently, as a runner's would.
    // Uncontained (isolation: none): the jobs fetch their sources from a repository in this process's
    // /tmp, which a contained slot does not see (slots' containment: test/embedded/slotIsolation.test.ts).
    const yaml = (await readFile(join(root, 'examples', 'local.yaml'), 'utf8'))
      .replace('        max-servers: 8 #', '        isolation: none\n        max-servers: 8 #')
      .replace('max-parallel-jobs: 2', 'max-parallel-jobs: 4')
      .replace('grace-time: 2', 'grace-time: 60');
    await writeFile(join(work, 'pool.yaml'), yaml);
    const started = await startDev(bin, stateDir, ['-c', join(work, 'pool.yaml')]);
    dev = started.process;
    devLog = started.log;
    client = await connect(stateDir);
    // `metastatic` on PATH, as an installed package puts it. Run from the sources here, through tsx,
    // whose compile cache lives in TMPDIR: the runner points TMPDIR at a new dir per job, which would
    // make every call compile the CLI afresh (an installed package runs built JavaScript).
    const binDir = join(work, 'bin');
    await mkdir(binDir);
    await writeFile(
      join(binDir, 'metastatic'),
      `#!/bin/sh\nTMPDIR='${tmpdir()}' exec '${process.execPath}' '${bin}' "$@"\n`,
    );
    await chmod(join(binDir, 'metastatic'), 0o755);
    // The project's repository, which get_sources fetches on the node.
    repo = join(work, 'repo');
    await mkdir(repo);
    const git = (...args: string[]) =>
      execFileSync('git', ['-C', repo, ...args], {
        encoding: 'utf8',
        env: {
          ...process.env,
          GIT_AUTHOR_NAME: 't',
          GIT_AUTHOR_EMAIL: 't@t',
          GIT_COMMITTER_NAME: 't',
          GIT_COMMITTER_EMAIL: 't@t',
        },
      }).trim();
    git('init', '-q', '-b', 'main');
    await writeFile(join(repo, 'hello.txt'), 'hello from the repository\n');
    git('add', 'hello.txt');
    git('commit', '-q', '-m', 'hello');
    sha = git('rev-parse', 'HEAD');
    env = {
      ...process.env,
      PATH: `${binDir}:${process.env.PATH ?? ''}`,
      METASTATIC_STATE_DIR: stateDir,
      // A lease no job here outlives: only the job that tests renewal takes a short one (each renewal
      // starts the CLI, seconds of CPU on this shared machine).
      METASTATIC_CI_LEASE: '120',
      METASTATIC_CI_WAIT: '60',
    };
    // Not the runner's own state dir: the drivers must use TMPDIR, not their working directory.
    delete env.METASTATIC_STACK;
  });

  afterAll(async () => {
    client?.close();
    await stopDev(dev);
    await rm(stateDir, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
  });

  it('runs a passing job on a node: sources fetched, output seen, variables kept literal, lease renewed, node released', async () => {
    const j = job({ script: ['cat hello.txt', 'printf "tricky=%s\\n" "$TRICKY"', 'sleep 7', 'pwd'] });
    const result = await runCustomExecutorJob(config, j, { env: { ...env, METASTATIC_CI_LEASE: '15' } });
    expect(result.status, result.log + result.runnerLog).toBe('success');
    expect(result.stages.map((s) => [s.stage, s.exitCode])).toEqual([
      ['prepare_exec', 0],
      ['prepare_script', 0],
      ['get_sources', 0],
      ['build_script', 0],
      ['cleanup_file_variables', 0],
    ]);
    expect(result.log).toContain('hello from the repository');
    expect(result.log).toContain(`tricky=${TRICKY}\n`);
    // builds_dir is relative to the slot's own directory, with the runner's shared-dir path.
    expect(result.log).toMatch(/\/builds\/runner7\/0\/group\/project\n/);
    expect(result.runnerLog).toContain('released');
    expect(await nodesOf(result.log)).toEqual(['released']);
    // A 15 s lease, renewed every 5 s while the node is awaited and the stages run (the pool logs each).
    const id = /request (gitlab-7-[0-9]+-[0-9a-f]+)/.exec(result.log)?.[1] ?? '?';
    const renewals = devLog()
      .split('\n')
      .filter((l) => l.includes('lease renewed') && l.includes(id));
    expect(renewals.length, devLog()).toBeGreaterThan(0);
    expect(existsSync(join(result.tempDirs[0] ?? '', 'metastatic'))).toBe(false);
    for (const dir of [work, process.cwd()]) expect(existsSync(join(dir, 'PWNED'))).toBe(false);
  });

  it("fails a job with the script's own exit code, and still runs its after_script on the node", async () => {
    const j = job({
      script: ['echo before', 'exit 3', 'echo never'],
      afterScript: ['echo "after: $CI_JOB_STATUS"'],
    });
    const result = await runCustomExecutorJob(config, j, { env });
    expect(result.status, result.log).toBe('failed');
    expect(result.failureReason).toBe('script_failure');
    expect(result.exitCode).toBe(3);
    expect(result.log).toContain('before');
    expect(result.log).not.toMatch(/^never$/m);
    expect(result.log).toContain('after: failed');
    expect(result.stages.map((s) => [s.stage, s.exitCode])).toEqual([
      ['prepare_exec', 0],
      ['prepare_script', 0],
      ['get_sources', 0],
      ['build_script', 1],
      ['after_script', 0],
      ['cleanup_file_variables', 0],
    ]);
    expect(await nodesOf(result.log)).toEqual(['released']);
  });

  it('releases the node of a cancelled job (SIGTERM to run_exec), after its after_script ran', async () => {
    const j = job({
      script: ['echo started', 'sleep 600', 'echo never'],
      afterScript: ['echo "after: $CI_JOB_STATUS"'],
    });
    const result = await runCustomExecutorJob(config, j, {
      env,
      cancelWhen: (log) => log.includes('\nstarted\n'),
    });
    expect(result.status, result.log).toBe('canceled');
    expect(result.log).toContain('after: canceled');
    expect(result.log).not.toMatch(/^never$/m);
    expect(result.stages.find((s) => s.stage === 'build_script')?.exitCode).not.toBe(0);
    expect(await nodesOf(result.log)).toEqual(['released']);
  });

  it('refuses a label carrying shell code in prepare, sends nothing, and cleanup has nothing to do', async () => {
    const marker = join(work, 'LABEL-PWNED');
    const j = job({ variables: { METASTATIC_LABEL: `small-node$(touch ${marker})` } });
    const result = await runCustomExecutorJob(config, j, { env });
    expect(result.status).toBe('failed');
    expect(result.failureReason).toBe('script_failure'); // the job's fault: not retried
    expect(result.log).toContain('does not serve the label');
    expect(result.runnerLog).toContain('nothing to release');
    expect(existsSync(marker)).toBe(false);
    expect(result.log).not.toContain('requesting');
  });

  it('fails a job naming a label the pool does not have as a build failure, tried once (issue 41)', async () => {
    const j = job({ variables: { METASTATIC_LABEL: 'no-such-label' } });
    const result = await runCustomExecutorJob(config, j, { env, preparationRetryIntervalMs: 100 });
    expect(result.status, result.log).toBe('failed');
    expect(result.failureReason).toBe('script_failure'); // not runner_system_failure, retried 3 times
    expect(result.stages.map((s) => [s.stage, s.exitCode])).toEqual([['prepare_exec', 1]]);
    expect(result.log).toContain('the pool has no label no-such-label');
  });

  it('runs the plain shell example: the script on a node over metastatic ssh, its status, the node released', async () => {
    const script = join(work, 'job.sh');
    await writeFile(script, 'echo "on $METASTATIC_NODE_ID in $(basename "$PWD")"\nexit 4\n');
    const run = await new Promise<{ code: number | null; out: string; err: string }>((done, fail) => {
      const child = spawn(join(root, 'examples', 'shell', 'run-on-node.sh'), ['small-node', script], {
        env,
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => {
        out += d;
      });
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        err += d;
      });
      child.on('error', fail);
      child.on('close', (code) => done({ code, out, err }));
    });
    expect(run.code, run.err).toBe(4);
    const id = /(shell-[0-9]+-[0-9]+)/.exec(run.err)?.[1];
    expect(run.out).toContain(`on ${id}/0`);
    expect((await client.store.getRequest(id ?? '?'))?.nodes.map((n) => n.state)).toEqual(['released']);
  });
});
