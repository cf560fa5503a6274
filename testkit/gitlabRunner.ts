import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/*
 * A stand-in for GitLab Runner driving a custom executor, for tests where no gitlab-runner binary runs.
 * It follows the runner's documented contract and, where the docs are silent, its code (gitlab-runner
 * at commit d79f3e7b, August 2026):
 * - docs/executors/custom.md: the four drivers and their order; config_exec's JSON on stdout; prepare
 *   once; run_exec once per stage as `run_exec [run_args...] <script-path> <stage>`; cleanup always;
 *   CUSTOM_ENV_ + every job variable; BUILD_FAILURE_EXIT_CODE / SYSTEM_FAILURE_EXIT_CODE /
 *   BUILD_EXIT_CODE_FILE; SIGTERM to the process group on a timeout or a cancel, SIGKILL after
 *   graceful_kill_timeout; cleanup's output goes to the runner's log, not the job's.
 * - executors/custom/command/command.go: the exit codes are 1 (build failure; its exit code read from
 *   BUILD_EXIT_CODE_FILE's first line when present) and 2 (system failure); any other is an unknown
 *   failure. Every driver gets the runner's own environment, then TMPDIR (the job's temp dir, also the
 *   working directory), the exit-code variables and JOB_RESPONSE_FILE, then job_env, then CUSTOM_ENV_*.
 * - executors/custom/custom.go: the job's temp dir (`custom-executor*`) is made before config_exec and
 *   removed after cleanup_exec; the stage script is `<tmp>/script<random>/script`, mode 0700; stage
 *   `step_script` is passed to run_exec as `build_script`; cleanup runs with its own timeout even when
 *   the job was cancelled.
 * - common/build.go: retryCreateExecutor (prepare is tried up to 3 times, 3 s apart, each with a new
 *   executor and temp dir, cleanup_exec after each failed one; a build failure is not retried);
 *   executeScript / executePrepareScripts / executeUserScripts: prepare_script, get_sources,
 *   restore_cache, download_artifacts, the job's steps (step_script), after_script (also after a failure
 *   or a cancel of the script, with CI_JOB_STATUS set; its own failure ignored by default),
 *   archive_cache(_on_failure), upload_artifacts_on_success/_on_failure, cleanup_file_variables; a failed
 *   prepare_script ends the job at once, a failed get_sources skips the user scripts and after_script.
 * - shells/abstract.go: a stage with nothing to do (no cache, no artifacts, no dependencies, no
 *   after_script) is not sent to run_exec (ErrSkipBuildStage); this harness defines none of those.
 * - shells/bash.go (BashWriter.Finish): the shape of a generated bash script: a TERM trap, errexit and
 *   pipefail, the body in `(trap 'exit 1' TERM; eval $'...') < /dev/null`, then `exit 0`.
 * What it leaves out: caches, artifacts, services, file variables' contents, the runner's helper binary
 * and its real git strategy (a plain fetch and checkout here), step-runner dispatch, the terminal.
 */

/** [runners.custom] of config.toml, timeouts in seconds. */
export interface CustomExecutorConfig {
  readonly configExec?: string;
  readonly configArgs?: readonly string[];
  readonly configExecTimeout?: number;
  readonly prepareExec?: string;
  readonly prepareArgs?: readonly string[];
  readonly prepareExecTimeout?: number;
  readonly runExec: string;
  readonly runArgs?: readonly string[];
  readonly cleanupExec?: string;
  readonly cleanupArgs?: readonly string[];
  readonly cleanupExecTimeout?: number;
  readonly gracefulKillTimeout?: number;
  readonly forceKillTimeout?: number;
  /** [[runners]] builds_dir and cache_dir (config_exec may override both). */
  readonly buildsDir: string;
  readonly cacheDir: string;
}

export interface GitLabJob {
  readonly id: number;
  readonly runnerId: number;
  readonly projectPath: string;
  /** Where get_sources fetches from (a path or URL the node can reach). */
  readonly repositoryUrl: string;
  readonly sha: string;
  /** The job's own variables (they may override predefined ones, as in GitLab). */
  readonly variables?: Readonly<Record<string, string>>;
  readonly script: readonly string[];
  readonly afterScript?: readonly string[];
}

export interface RunOptions {
  /** The runner process's environment (every driver inherits it). */
  readonly env: NodeJS.ProcessEnv;
  /** Cancel the job (as from the UI) once the job log satisfies this, while the user script runs. */
  readonly cancelWhen?: (log: string) => boolean;
  /** PreparationRetries and its interval (common/build.go: 3 tries, 3 s apart). */
  readonly preparationRetries?: number;
  readonly preparationRetryIntervalMs?: number;
}

export type FailureReason = 'script_failure' | 'runner_system_failure' | 'unknown_failure' | 'job_canceled';

export interface StageRun {
  readonly stage: string;
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
}

export interface JobResult {
  readonly status: 'success' | 'failed' | 'canceled';
  readonly failureReason?: FailureReason;
  /** The exit code GitLab reports for a script failure ("exit status N"). */
  readonly exitCode?: number;
  /** The job log: config_exec's stderr, prepare_exec's and run_exec's stdout and stderr. */
  readonly log: string;
  /** The runner's own log: cleanup_exec's stdout and stderr. */
  readonly runnerLog: string;
  readonly stages: readonly StageRun[];
  /** The temp dir the runner made (removed by now), as the drivers saw it in TMPDIR. */
  readonly tempDirs: readonly string[];
}

const BUILD_FAILURE_EXIT_CODE = 1;
const SYSTEM_FAILURE_EXIT_CODE = 2;
/** executors/custom/consts.go and helpers/process/killer.go defaults. */
const DEFAULT_EXEC_TIMEOUT_S = 3600;
const DEFAULT_GRACEFUL_KILL_S = 600;
const DEFAULT_FORCE_KILL_S = 10;

interface Outcome {
  readonly ok: boolean;
  readonly kind?: 'build' | 'system' | 'unknown';
  readonly exitCode?: number;
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

interface Exec {
  readonly file: string;
  readonly args: readonly string[];
  readonly env: NodeJS.ProcessEnv;
  readonly cwd: string;
  readonly timeoutS?: number;
  readonly gracefulS: number;
  readonly forceS: number;
  readonly stdout: (d: string) => void;
  readonly stderr: (d: string) => void;
  readonly cancel?: AbortSignal;
}

/**
 * Starts a driver in a process group of its own (Setpgid, helpers/process/job_unix.go) and waits for it
 * and its output pipes (exec.Cmd.Wait). On a timeout or a cancel: SIGTERM to the group, SIGKILL to the
 * group after graceful_kill_timeout, given up after force_kill_timeout.
 */
function execDriver(x: Exec): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve, reject) => {
    const child = spawn(x.file, [...x.args], {
      cwd: x.cwd,
      env: x.env,
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const timers: NodeJS.Timeout[] = [];
    const signalGroup = (signal: NodeJS.Signals) => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, signal);
      } catch {
        // The group is gone.
      }
    };
    let killing = false;
    const kill = () => {
      if (killing) return;
      killing = true;
      signalGroup('SIGTERM');
      timers.push(
        setTimeout(() => {
          signalGroup('SIGKILL');
          timers.push(setTimeout(() => done({ code: null, signal: 'SIGKILL' }), x.forceS * 1000));
        }, x.gracefulS * 1000),
      );
    };
    let finished = false;
    const done = (r: { code: number | null; signal: NodeJS.Signals | null }) => {
      if (finished) return;
      finished = true;
      for (const t of timers) clearTimeout(t);
      x.cancel?.removeEventListener('abort', kill);
      resolve(r);
    };
    child.stdout.setEncoding('utf8').on('data', x.stdout);
    child.stderr.setEncoding('utf8').on('data', x.stderr);
    child.on('error', reject);
    child.on('close', (code, signal) => done({ code, signal }));
    if (x.timeoutS !== undefined) timers.push(setTimeout(kill, x.timeoutS * 1000));
    if (x.cancel?.aborted) kill();
    else x.cancel?.addEventListener('abort', kill);
  });
}

/** command.go's reading of a driver's exit. */
async function outcome(
  r: { code: number | null; signal: NodeJS.Signals | null },
  buildExitCodeFile: string,
): Promise<Outcome> {
  if (r.code === 0) return { ok: true, ...r };
  if (r.code === BUILD_FAILURE_EXIT_CODE) {
    let text: string;
    try {
      text = await readFile(buildExitCodeFile, 'utf8');
    } catch {
      return { ok: false, kind: 'build', exitCode: BUILD_FAILURE_EXIT_CODE, ...r };
    }
    const first = text.split('\n')[0] ?? '';
    // strconv.Atoi: an optional sign and decimal digits, nothing else.
    if (!/^[+-]?[0-9]+$/.test(first))
      return { ok: false, kind: 'unknown', exitCode: SYSTEM_FAILURE_EXIT_CODE, ...r };
    return { ok: false, kind: 'build', exitCode: Number(first), ...r };
  }
  if (r.code === SYSTEM_FAILURE_EXIT_CODE) return { ok: false, kind: 'system', ...r };
  return { ok: false, kind: 'unknown', ...r };
}

/** helpers.ShellEscape for bash: ANSI-C quoting, `$'...'`. */
export function bashQuote(s: string): string {
  let out = "$'";
  for (const ch of s) {
    const c = ch.codePointAt(0) ?? 0;
    if (ch === '\\' || ch === "'") out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\t') out += '\\t';
    else if (ch === '\r') out += '\\r';
    else if (c < 0x20 || c === 0x7f) out += `\\x${c.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return `${out}'`;
}

/** BashWriter.Finish: how every generated stage script is wrapped. */
function finish(body: string): string {
  return (
    '#!/usr/bin/env bash\n\n' +
    "trap 'exit 1' TERM\n\n" +
    'case "$(set -o)" in *"pipefail"*) set -o pipefail;; esac; set -o errexit\n' +
    'set +o noclobber\n' +
    `(trap 'exit 1' TERM; eval ${bashQuote(body)}) < /dev/null\n` +
    'exit 0\n'
  );
}

/** Runs one job through the drivers, as GitLab Runner would; resolves with what GitLab would record. */
export async function runCustomExecutorJob(
  config: CustomExecutorConfig,
  job: GitLabJob,
  options: RunOptions,
): Promise<JobResult> {
  let log = '';
  let runnerLog = '';
  const cancel = new AbortController();
  let inUserScript = false;
  const toLog = (d: string) => {
    log += d;
    if (options.cancelWhen && !cancel.signal.aborted && inUserScript && options.cancelWhen(log))
      cancel.abort();
  };
  const toRunnerLog = (d: string) => {
    runnerLog += d;
  };
  const stages: StageRun[] = [];
  const tempDirs: string[] = [];
  const graceful = config.gracefulKillTimeout ?? DEFAULT_GRACEFUL_KILL_S;
  const force = config.forceKillTimeout ?? DEFAULT_FORCE_KILL_S;
  const retries = options.preparationRetries ?? 3;
  const interval = options.preparationRetryIntervalMs ?? 3000;

  for (let attempt = 1; ; attempt++) {
    // executor.Prepare: a temp dir, the job response file, config_exec, then prepare_exec.
    const tempDir = await mkdtemp(join(tmpdir(), 'custom-executor'));
    tempDirs.push(tempDir);
    const jobResponseFile = join(tempDir, 'response.json');
    await writeFile(jobResponseFile, `${JSON.stringify({ id: job.id, token: 'jobT0ken' })}\n`, {
      mode: 0o600,
    });
    const buildExitCodeFile = join(tempDir, 'build_exit_code');
    let buildsDir = config.buildsDir;
    let cacheDir = config.cacheDir;
    let shared = false;
    let jobEnv: Record<string, string> = {};

    const variables = (status = 'running'): Record<string, string> => {
      const projectDir = shared
        ? `${buildsDir}/${`runner${job.runnerId}`.slice(0, 8)}/0/${job.projectPath}`
        : `${buildsDir}/${job.projectPath}`;
      return {
        CI: 'true',
        GITLAB_CI: 'true',
        CI_SERVER: 'yes',
        CI_JOB_ID: String(job.id),
        CI_RUNNER_ID: String(job.runnerId),
        CI_PROJECT_PATH: job.projectPath,
        CI_REPOSITORY_URL: job.repositoryUrl,
        CI_COMMIT_SHA: job.sha,
        CI_BUILDS_DIR: buildsDir,
        CI_PROJECT_DIR: projectDir,
        CI_CACHE_DIR: cacheDir,
        CI_CONCURRENT_ID: '0',
        CI_CONCURRENT_PROJECT_ID: '0',
        CI_JOB_TIMEOUT: '3600',
        CI_JOB_STATUS: status,
        CI_JOB_SERVICES: '',
        ...job.variables,
      };
    };
    const driverEnv = (vars: Record<string, string>): NodeJS.ProcessEnv => ({
      ...options.env,
      TMPDIR: tempDir,
      BUILD_FAILURE_EXIT_CODE: String(BUILD_FAILURE_EXIT_CODE),
      SYSTEM_FAILURE_EXIT_CODE: String(SYSTEM_FAILURE_EXIT_CODE),
      BUILD_EXIT_CODE_FILE: buildExitCodeFile,
      JOB_RESPONSE_FILE: jobResponseFile,
      ...jobEnv,
      ...Object.fromEntries(Object.entries(vars).map(([k, v]) => [`CUSTOM_ENV_${k}`, v])),
    });
    const cleanupExec = async () => {
      if (config.cleanupExec) {
        await execDriver({
          file: config.cleanupExec,
          args: config.cleanupArgs ?? [],
          env: driverEnv(variables()),
          cwd: tempDir,
          timeoutS: config.cleanupExecTimeout ?? DEFAULT_EXEC_TIMEOUT_S,
          gracefulS: graceful,
          forceS: force,
          stdout: toRunnerLog,
          stderr: toRunnerLog,
        });
      }
      await rm(tempDir, { recursive: true, force: true });
    };

    let prepared: Outcome = { ok: true, code: 0, signal: null };
    if (config.configExec) {
      let json = '';
      const r = await execDriver({
        file: config.configExec,
        args: config.configArgs ?? [],
        env: driverEnv(variables()),
        cwd: tempDir,
        timeoutS: config.configExecTimeout ?? DEFAULT_EXEC_TIMEOUT_S,
        gracefulS: graceful,
        forceS: force,
        stdout: (d) => {
          json += d;
        },
        stderr: toLog,
      });
      prepared = await outcome(r, buildExitCodeFile);
      if (prepared.ok && json.trim() !== '') {
        const c = JSON.parse(json) as {
          builds_dir?: string;
          cache_dir?: string;
          builds_dir_is_shared?: boolean;
          job_env?: Record<string, string>;
          shell?: string;
          driver?: { name?: string; version?: string };
        };
        if (c.builds_dir !== undefined) buildsDir = c.builds_dir;
        if (c.cache_dir !== undefined) cacheDir = c.cache_dir;
        if (c.builds_dir_is_shared !== undefined) shared = c.builds_dir_is_shared;
        if (c.job_env) jobEnv = c.job_env;
        if (c.shell !== undefined && c.shell !== 'bash')
          throw new Error(`this harness writes bash only, not ${c.shell}`);
        if (c.driver?.name)
          log += `Using Custom executor with driver ${c.driver.name} ${c.driver.version ?? ''}...\n`;
      }
    }
    if (prepared.ok && config.prepareExec) {
      const r = await execDriver({
        file: config.prepareExec,
        args: config.prepareArgs ?? [],
        env: driverEnv(variables()),
        cwd: tempDir,
        timeoutS: config.prepareExecTimeout ?? DEFAULT_EXEC_TIMEOUT_S,
        gracefulS: graceful,
        forceS: force,
        stdout: toLog,
        stderr: toLog,
      });
      prepared = await outcome(r, buildExitCodeFile);
      stages.push({ stage: 'prepare_exec', exitCode: r.code, signal: r.signal });
    }
    if (!prepared.ok) {
      await cleanupExec();
      // A build failure is not retried; anything else is, up to PreparationRetries.
      if (prepared.kind === 'build' || attempt >= retries) {
        return {
          status: 'failed',
          failureReason: prepared.kind === 'build' ? 'script_failure' : 'runner_system_failure',
          ...(prepared.kind === 'build' ? { exitCode: prepared.exitCode } : {}),
          log,
          runnerLog,
          stages,
          tempDirs,
        };
      }
      log += `Preparation failed: exit status ${prepared.code}\nWill be retried in ${interval / 1000}s ...\n`;
      await new Promise((r) => setTimeout(r, interval));
      continue;
    }

    // executor.Run, once per stage.
    let scriptN = 0;
    let stageStatus = 'running';
    const runStage = async (stage: string, body: string, signal?: AbortSignal): Promise<Outcome> => {
      const dir = join(tempDir, `script${++scriptN}${Math.random().toString(36).slice(2, 8)}`);
      await mkdir(dir, { mode: 0o700 });
      const file = join(dir, 'script');
      await writeFile(file, finish(body), { mode: 0o700 });
      const r = await execDriver({
        file: config.runExec,
        args: [...(config.runArgs ?? []), file, stage],
        env: driverEnv(variables(stageStatus)),
        cwd: tempDir,
        gracefulS: graceful,
        forceS: force,
        stdout: toLog,
        stderr: toLog,
        ...(signal ? { cancel: signal } : {}),
      });
      stages.push({ stage, exitCode: r.code, signal: r.signal });
      return outcome(r, buildExitCodeFile);
    };
    const vars = variables();
    const exports = Object.entries(vars)
      .map(([k, v]) => `export ${k}=${bashQuote(v)}\n`)
      .join('');
    const cd = `cd ${bashQuote(vars.CI_PROJECT_DIR ?? '')}\n`;
    const commands = (lines: readonly string[]) =>
      lines.map((c) => `echo ${bashQuote(`$ ${c}`)}\n${c}\n`).join('');
    const tmpProjectDir = `${vars.CI_PROJECT_DIR}.tmp`;

    let result: { status: JobResult['status']; failureReason?: FailureReason; exitCode?: number } = {
      status: 'success',
    };
    const fail = (o: Outcome) => {
      result =
        o.kind === 'build'
          ? {
              status: 'failed',
              failureReason: 'script_failure',
              ...(o.exitCode === undefined ? {} : { exitCode: o.exitCode }),
            }
          : {
              status: 'failed',
              failureReason: o.kind === 'system' ? 'runner_system_failure' : 'unknown_failure',
            };
    };

    const prepareScript = await runStage(
      'prepare_script',
      `echo "Running on $(hostname)..."\nrm -f ${bashQuote(`${tmpProjectDir}/gitlab_runner_env`)}\n`,
    );
    if (!prepareScript.ok) {
      fail(prepareScript);
      await cleanupExec();
      return { ...result, log, runnerLog, stages, tempDirs };
    }
    const getSources = await runStage(
      'get_sources',
      `${exports}export GIT_TERMINAL_PROMPT=0\n` +
        `rm -rf "$CI_PROJECT_DIR"\nmkdir -p "$CI_PROJECT_DIR"\ncd "$CI_PROJECT_DIR"\n` +
        'echo "Fetching changes..."\ngit init -q .\n' +
        'git fetch -q "$CI_REPOSITORY_URL" "+refs/heads/*:refs/remotes/origin/*"\n' +
        'echo "Checking out $CI_COMMIT_SHA..."\ngit checkout -q -f "$CI_COMMIT_SHA"\n',
    );

    if (getSources.ok) {
      // executeUserScripts: the script may be cancelled; after_script still runs.
      inUserScript = true;
      const step = await runStage('build_script', exports + cd + commands(job.script), cancel.signal);
      inUserScript = false;
      if (cancel.signal.aborted) {
        result = { status: 'canceled', failureReason: 'job_canceled' };
        log += 'WARNING: script canceled externally (UI, API)\n';
      } else if (!step.ok) {
        fail(step);
      }
      if (job.afterScript?.length) {
        stageStatus =
          result.status === 'success' ? 'success' : result.status === 'canceled' ? 'canceled' : 'failed';
        const afterVars = variables(stageStatus);
        const afterExports = Object.entries(afterVars)
          .map(([k, v]) => `export ${k}=${bashQuote(v)}\n`)
          .join('');
        const after = await runStage(
          'after_script',
          `${afterExports}${cd}echo "Running after script..."\n${commands(job.afterScript)}`,
        );
        // AFTER_SCRIPT_IGNORE_ERRORS defaults to true: its failure is logged only.
        if (!after.ok) log += 'WARNING: after_script failed, but job will continue unaffected\n';
      }
    } else {
      fail(getSources);
    }
    // No cache and no artifacts here: archive_cache* and upload_artifacts_* are skipped (ErrSkipBuildStage).
    const cleanupVars = await runStage(
      'cleanup_file_variables',
      `rm -f ${bashQuote(`${tmpProjectDir}/gitlab_runner_env`)} ${bashQuote(`${tmpProjectDir}/masking.db`)}\n`,
    );
    if (!cleanupVars.ok) log += 'WARNING: Error while executing file based variables removal script\n';
    await cleanupExec();
    return { ...result, log, runnerLog, stages, tempDirs };
  }
}
