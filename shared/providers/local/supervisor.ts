import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { BackingPool } from '../../core/model.ts';
import type { SlotLimits } from '../../core/slotLimits.ts';
import { errorCode, isAlive, isRecord, type LocalRecord } from './localRecords.ts';
import type { IsolationMode } from './slotIsolation.ts';

/**
 * The process supervisor of the local provider: starts a backing node process (backingNode.ts), reads
 * what it announces, and stops processes, its own children or ones adopted from an earlier run, with
 * SIGTERM then SIGKILL.
 */

/** How long a stop waits after SIGTERM before it sends SIGKILL. */
export const TERMINATE_GRACE_MS = 5_000;
/** How long to wait for a process to disappear after SIGKILL (it always does; this only bounds a hang). */
export const KILL_WAIT_MS = 5_000;
const POLL_MS = 50;
const STDERR_TAIL_CHARS = 4_000;
const STDOUT_BUFFER_CHARS = 64_000;

export interface SupervisorLogger {
  info(msg: string, extra?: object): void;
  warn(msg: string, extra?: object): void;
  error(msg: string, extra?: object): void;
}

/**
 * Run from this repository's sources (TypeScript: in-process tests), from its sources bundled by
 * bin/fromSources.mjs (the CLI in a clone: backingNode.js is beside the chunk this code is in), or built
 * (`dist/`: backingNode.js is beside this module).
 */
const FROM_SOURCES = import.meta.url.endsWith('.ts');

/**
 * The backing node's script: beside this module when built or bundled; from the sources, the bundle of
 * bin/fromSources.mjs (built when a source changed), which starts in about half the CPU time of the
 * TypeScript run through a loader.
 */
export async function backingNodeScript(): Promise<string> {
  if (!FROM_SOURCES) return fileURLToPath(new URL('./backingNode.js', import.meta.url));
  const fromSources = '../../../bin/fromSources.mjs';
  const { sourceBuild } = (await import(fromSources)) as { sourceBuild(): Promise<string> };
  return join(await sourceBuild(), 'backingNode.js');
}

/** What a backing node process of a label is started with, and what its resources report. */
export interface LabelSettings {
  readonly bootDelaySeconds: number;
  readonly attributes: Readonly<Record<string, unknown>>;
  /** The pool's `isolation`: whether its backing nodes contain their slots. */
  readonly isolation: IsolationMode;
}

/** A local label's settings; an unknown pool or label, or a bad boot-delay, is an Error. */
export function labelSettings(
  pool: BackingPool | undefined,
  poolKey: string,
  labelName: string,
): LabelSettings {
  if (!pool) throw new Error(`local provider: unknown backing pool ${poolKey}`);
  const label = pool.labels.get(labelName);
  if (!label) throw new Error(`local provider: backing pool ${poolKey} has no label ${labelName}`);
  const bootDelay = label.options['boot-delay'] ?? 0;
  if (typeof bootDelay !== 'number' || !Number.isFinite(bootDelay) || bootDelay < 0) {
    throw new Error(`local provider: label ${labelName} of ${poolKey}: boot-delay must be seconds >= 0`);
  }
  const attributes = label.options.attributes;
  const isolation = pool.poolOptions.isolation ?? 'auto';
  if (isolation !== 'auto' && isolation !== 'contain' && isolation !== 'none') {
    throw new Error(`local provider: backing pool ${poolKey}: isolation must be auto, contain or none`);
  }
  return { bootDelaySeconds: bootDelay, attributes: isRecord(attributes) ? attributes : {}, isolation };
}

export interface BackingNodeArgs {
  readonly backingNodeId: string;
  readonly resourceId: string;
  readonly bootDelaySeconds: number;
  readonly host: string;
  readonly stateFile: string;
  readonly hostKeyFile: string;
  readonly authorizedKeysFile: string;
  readonly liveFile: string;
  readonly workDir: string;
  /** Whether its slots are contained (slotIsolation.ts), and each slot's limits there. */
  readonly isolation: IsolationMode;
  readonly limits: SlotLimits;
}

/**
 * Starts a backing node process, in a session of its own. Every argument is passed as its own argv entry (no shell), so nothing a
 * configuration carries is interpreted. Resolves with the process once it has a pid.
 */
export async function spawnBackingNode(args: BackingNodeArgs): Promise<ChildProcess> {
  const proc = spawn(
    process.execPath,
    [
      '--enable-source-maps',
      await backingNodeScript(),
      '--id',
      args.backingNodeId,
      '--resource',
      args.resourceId,
      '--boot-delay',
      String(args.bootDelaySeconds),
      '--host',
      args.host,
      '--state-file',
      args.stateFile,
      '--host-key-file',
      args.hostKeyFile,
      '--authorized-keys-file',
      args.authorizedKeysFile,
      '--live-file',
      args.liveFile,
      '--work-dir',
      args.workDir,
      '--isolation',
      args.isolation,
      '--slot-limits',
      `${args.limits.millicores},${args.limits.memoryMiB},${args.limits.pids}`,
    ],
    // A session of its own (setsid): what dev's terminal sends its foreground group (Ctrl-C, Ctrl-Z, the
    // hangup when the terminal closes) reaches dev alone. dev stops its backing nodes itself on SIGINT
    // and SIGTERM; when dev dies any other way they keep running and the next dev adopts them.
    { stdio: ['ignore', 'pipe', 'pipe'], detached: true },
  );
  if (proc.pid === undefined) {
    const error = await new Promise<Error>((resolve) => proc.once('error', resolve));
    throw new Error(`local provider: cannot start backing node ${args.backingNodeId}: ${error.message}`);
  }
  return proc;
}

/** A child process as the supervisor watches it. */
export interface Supervised {
  readonly process: ChildProcess;
  /** Resolves once the process closed (after its stdout was drained). */
  readonly exited: Promise<void>;
  readonly hasExited: boolean;
  /** The last characters it wrote to stderr (for a failure reason). */
  readonly stderrTail: string;
}

/** Lines of a child's stderr relayed to the log per minute at most (the rest only kept in the tail). */
const RELAYED_PER_MINUTE = 20;

/** A counter that allows RELAYED_PER_MINUTE calls in each minute. */
function relayLimit(): () => boolean {
  let minute = 0;
  let count = 0;
  return () => {
    const now = Math.floor(Date.now() / 60_000);
    if (now !== minute) {
      minute = now;
      count = 0;
    }
    count += 1;
    return count <= RELAYED_PER_MINUTE;
  };
}

/**
 * Watches a child: every line it writes to stdout goes to `onLine`, each line of its stderr to the log
 * as a warning (at most RELAYED_PER_MINUTE a minute) and its tail is kept, and
 * `onClosed` is called once it closed. 'close' comes after 'exit' and after stdout was drained, so a
 * line is never seen after the close.
 */
export function supervise(
  proc: ChildProcess,
  resourceId: string,
  logger: SupervisorLogger,
  on: {
    readonly onLine: (line: string) => void;
    readonly onClosed: (code: number | null, signal: NodeJS.Signals | null) => void;
  },
): Supervised {
  let markExited = (): void => {};
  const run = {
    process: proc,
    exited: new Promise<void>((resolve) => {
      markExited = resolve;
    }),
    hasExited: false,
    stderrTail: '',
  };
  proc.on('error', (err) => {
    logger.error('local provider: backing node process error', { resourceId, error: err.message });
  });
  let stdout = '';
  proc.stdout?.setEncoding('utf8');
  proc.stdout?.on('data', (chunk: string) => {
    stdout += chunk;
    let newline = stdout.indexOf('\n');
    while (newline >= 0) {
      on.onLine(stdout.slice(0, newline).trim());
      stdout = stdout.slice(newline + 1);
      newline = stdout.indexOf('\n');
    }
    if (stdout.length > STDOUT_BUFFER_CHARS) stdout = '';
  });
  proc.stderr?.setEncoding('utf8');
  let stderr = '';
  const relay = relayLimit();
  proc.stderr?.on('data', (chunk: string) => {
    run.stderrTail = (run.stderrTail + chunk).slice(-STDERR_TAIL_CHARS);
    // What the process says of itself (a flood it bounds, a file it cannot read) reaches the pool's log.
    stderr = (stderr + chunk).slice(-STDERR_TAIL_CHARS);
    for (let newline = stderr.indexOf('\n'); newline >= 0; newline = stderr.indexOf('\n')) {
      const line = stderr.slice(0, newline).trim();
      stderr = stderr.slice(newline + 1);
      if (line !== '' && relay()) logger.warn('local provider: backing node says', { resourceId, line });
    }
  });
  proc.once('close', (code, signal) => {
    run.hasExited = true;
    markExited();
    on.onClosed(code, signal);
  });
  return run;
}

/** Stops a child: SIGTERM, then SIGKILL once TERMINATE_GRACE_MS passed; resolves once it exited (or gave up). */
export async function stopChildProcess(
  run: Supervised,
  resourceId: string,
  logger: SupervisorLogger,
): Promise<void> {
  run.process.kill('SIGTERM');
  if (await within(run.exited, TERMINATE_GRACE_MS)) return;
  logger.warn('local provider: backing node ignored SIGTERM, killing it', { resourceId });
  run.process.kill('SIGKILL');
  if (!(await within(run.exited, KILL_WAIT_MS))) {
    logger.error('local provider: backing node did not exit after SIGKILL', { resourceId });
  }
}

/**
 * Stops a process that is not our child (adopted from an earlier run): no exit event tells when it is
 * gone, so `alive` is polled. SIGTERM, then SIGKILL once TERMINATE_GRACE_MS passed.
 */
export async function stopAdoptedProcess(
  pid: number,
  alive: () => Promise<boolean>,
  resourceId: string,
  logger: SupervisorLogger,
): Promise<void> {
  const signalAndWait = async (signal: NodeJS.Signals, ms: number): Promise<boolean> => {
    try {
      process.kill(pid, signal);
    } catch (err) {
      if (errorCode(err) === 'ESRCH') return true;
      throw err;
    }
    const deadline = Date.now() + ms;
    while (Date.now() < deadline) {
      if (!(await alive())) return true;
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
    return !(await alive());
  };
  if (await signalAndWait('SIGTERM', TERMINATE_GRACE_MS)) return;
  logger.warn('local provider: backing node ignored SIGTERM, killing it', { resourceId });
  if (!(await signalAndWait('SIGKILL', KILL_WAIT_MS))) {
    logger.error('local provider: backing node did not exit after SIGKILL', { resourceId });
  }
}

/** Resolves true when `promise` settles within `ms`, false otherwise; leaves no timer behind. */
async function within(promise: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true as const), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Polls processes adopted from an earlier run's records every `everyMs` and calls `died` once for each
 * that is gone, except those `skip` names (being stopped: the stop reports its end itself). The timer
 * runs only while something is watched, and never keeps the process alive.
 */
export class AdoptedWatch {
  private readonly records = new Map<string, LocalRecord>();
  private timer: NodeJS.Timeout | undefined;
  private checking = false;
  private stopped = false;

  constructor(
    private readonly everyMs: number,
    private readonly died: (record: LocalRecord) => Promise<void>,
    private readonly skip: (resourceId: string) => boolean,
  ) {}

  add(record: LocalRecord): void {
    if (this.stopped) return;
    this.records.set(record.resourceId, record);
    if (this.timer) return;
    this.timer = setInterval(() => void this.check(), this.everyMs);
    this.timer.unref();
  }

  remove(resourceId: string): void {
    this.records.delete(resourceId);
  }

  stop(): void {
    this.stopped = true;
    this.clear();
  }

  private clear(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  private async check(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      for (const [resourceId, record] of this.records) {
        if (this.stopped) return;
        if (this.skip(resourceId) || (await isAlive(record.pid, resourceId))) continue;
        this.records.delete(resourceId);
        await this.died(record);
      }
    } finally {
      this.checking = false;
      if (this.records.size === 0) this.clear();
    }
  }
}
