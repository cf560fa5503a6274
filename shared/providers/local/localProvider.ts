/**
 * The `local` driver: backing nodes are real child processes on this machine (see backingNode.ts), each
 * serving SSH on a TCP port of `host`. Used by the embedded stack in place of EC2.
 *
 * Every resource is recorded under `<stateDir>/local/<resourceId>.json`, its SSH host key (private, 0600)
 * under `<resourceId>.key`; both go when the resource ends. The public host keys are reported in
 * `attributes.hostKeys` (`["<type> <base64>"]`). A record whose pid is alive is a
 * resource "tagged as ours" (list()), so a restarted provider can still see, describe and terminate the
 * backing nodes of a previous run. State changes are reported as EC2-shaped events through `onEvent`,
 * delivered one at a time in the order they happened.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdir, readdir, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import type { BackingPool } from '../../config/model.ts';
import type { Clock } from '../../core/clock.ts';
import { type InstanceState, type StateChangeEvent, stateChangeEvent } from '../../core/events.ts';
import type { BackingProvider, BackingResource, LaunchSpec } from '../../core/provider.ts';
import { clip } from '../../core/text.ts';

export const LOCAL_EVENT_SOURCE = 'metastatic.local';

/** How long terminate() waits after SIGTERM before it sends SIGKILL. */
const TERMINATE_GRACE_MS = 5_000;
/** How long to wait for a process to disappear after SIGKILL (it always does; this only bounds a hang). */
const KILL_WAIT_MS = 5_000;
const POLL_MS = 50;
/**
 * How often the processes adopted from an earlier run are checked: they are not our children, so no
 * exit event tells us they died; a dead one is reported `terminated` within this long, as a child is at once.
 */
export const ADOPTED_WATCH_MS = 500;
const STDERR_TAIL_CHARS = 4_000;
const STDOUT_BUFFER_CHARS = 64_000;
/** Characters of a child's last stderr line carried into a failure reason. */
const MAX_END_REASON_LINE = 300;

export interface LocalProviderLogger {
  info(msg: string, extra?: object): void;
  warn(msg: string, extra?: object): void;
  error(msg: string, extra?: object): void;
}

export interface LocalProviderOptions {
  /** Directory for the provider's records; resources live under `<stateDir>/local/`. */
  readonly stateDir: string;
  /** The backing pools served by this provider (driver `local`; others are ignored). */
  readonly pools: readonly BackingPool[];
  /** Interface the backing nodes listen on; default 127.0.0.1. */
  readonly host?: string;
  /** Region reported in events; default `local`. */
  readonly region?: string;
  readonly clock: Clock;
  readonly onEvent: (event: StateChangeEvent) => Promise<void> | void;
  readonly logger?: LocalProviderLogger;
}

/** What `<stateDir>/local/<resourceId>.json` holds. */
interface LocalRecord {
  resourceId: string;
  backingNodeId: string;
  poolKey: string;
  label: string;
  attempt: number;
  pid: number;
  host: string;
  port?: number;
  state: 'pending' | 'running';
  /** The SSH host public keys, `<type> <base64>`, once the node announced them. */
  hostKeys?: string[];
  startedAt: number;
  readyAt?: number;
}

/** A child process started by this provider instance. */
interface Child {
  readonly record: LocalRecord;
  readonly process: ChildProcess;
  readonly exited: Promise<void>;
  hasExited: boolean;
  /** Set once terminate() took charge: the exit is then expected, and terminate() reports it. */
  terminating?: Promise<void>;
  /** Serializes this resource's state-file writes and removal. */
  io: Promise<void>;
  stderrTail: string;
}

const defaultLogger: LocalProviderLogger = {
  info: () => {},
  warn: (msg, extra) => console.warn(msg, extra ?? ''),
  error: (msg, extra) => console.error(msg, extra ?? ''),
};

const BACKING_NODE_SCRIPT = fileURLToPath(new URL('./backingNode.ts', import.meta.url));

/**
 * The tsx loader as an absolute URL: `--import tsx` alone resolves against the child's working directory,
 * which fails whenever metastatic is started from outside its own tree.
 */
function tsxLoader(): string {
  try {
    return pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href;
  } catch {
    return 'tsx';
  }
}

/** `local-` + the first 16 hex digits of sha256(`<backingNodeId>#<attempt>`). */
export function localResourceId(backingNodeId: string, attempt: number): string {
  return `local-${createHash('sha256').update(`${backingNodeId}#${attempt}`).digest('hex').slice(0, 16)}`;
}

/** Whether `resourceId` has the shape of a local resource id (for routing events to this provider). */
export function isLocalResourceId(resourceId: string): boolean {
  return /^local-[0-9a-f]{16}$/.test(resourceId);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function errorCode(err: unknown): string | undefined {
  return isRecord(err) && typeof err.code === 'string' ? err.code : undefined;
}

function parseRecord(resourceId: string, text: string): LocalRecord | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isRecord(raw) || typeof raw.pid !== 'number' || !Number.isInteger(raw.pid) || raw.pid <= 0) {
    return undefined;
  }
  const str = (v: unknown): string => (typeof v === 'string' ? v : '');
  const num = (v: unknown): number | undefined =>
    typeof v === 'number' && Number.isFinite(v) ? v : undefined;
  const port = num(raw.port);
  const hostKeys = Array.isArray(raw.hostKeys)
    ? raw.hostKeys.filter((k): k is string => typeof k === 'string')
    : undefined;
  return {
    resourceId,
    backingNodeId: str(raw.backingNodeId),
    poolKey: str(raw.poolKey),
    label: str(raw.label),
    attempt: num(raw.attempt) ?? 0,
    pid: raw.pid,
    host: str(raw.host) || '127.0.0.1',
    ...(port !== undefined ? { port } : {}),
    // The child writes `state: 'running'` with its port; a record with a port is ready either way.
    state: raw.state === 'running' || port !== undefined ? 'running' : 'pending',
    ...(hostKeys?.length ? { hostKeys } : {}),
    startedAt: num(raw.startedAt) ?? 0,
    ...(num(raw.readyAt) !== undefined ? { readyAt: num(raw.readyAt) } : {}),
  };
}

/**
 * Whether `pid` is a live process running resource `resourceId`. On Linux the command line must name the
 * resource, which rules out a recycled pid and an exited-but-unreaped (zombie) child.
 */
async function isAlive(pid: number, resourceId: string): Promise<boolean> {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if (errorCode(err) !== 'EPERM') return false;
  }
  if (process.platform !== 'linux') return true;
  try {
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8');
    return cmdline.split('\0').includes(resourceId);
  } catch {
    return false;
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
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

interface LabelSettings {
  readonly bootDelaySeconds: number;
  readonly attributes: Readonly<Record<string, unknown>>;
}

export class LocalProvider implements BackingProvider {
  private readonly dir: string;
  private readonly host: string;
  private readonly region: string;
  private readonly clock: Clock;
  private readonly onEvent: LocalProviderOptions['onEvent'];
  private readonly logger: LocalProviderLogger;
  private readonly pools = new Map<string, BackingPool>();
  /** Live children started by this instance. */
  private readonly children = new Map<string, Child>();
  /** Launches in progress, so concurrent launches of one spec share one process. */
  private readonly launches = new Map<string, Promise<{ resourceId: string }>>();
  /** Terminations of resources this instance adopted from a state file (not its children). */
  private readonly adoptedStops = new Map<string, Promise<void>>();
  /**
   * Resources this instance launched that have ended, with their last record. Like an EC2 idempotency token, launching the same
   * (backingNodeId, attempt) again returns the ended resource instead of starting a second one.
   */
  private readonly ended = new Map<string, LocalRecord>();
  /** Processes adopted from an earlier run (alive when last seen), by resource id: watched (watchAdopted). */
  private readonly adopted = new Map<string, LocalRecord>();
  private adoptedWatch: NodeJS.Timeout | undefined;
  /** Why a child exited before it was ready (see endReason). */
  private readonly endReasons = new Map<string, string>();
  private events: Promise<void> = Promise.resolve();
  private closed = false;

  constructor(options: LocalProviderOptions) {
    this.dir = join(options.stateDir, 'local');
    this.host = options.host ?? '127.0.0.1';
    this.region = options.region ?? 'local';
    this.clock = options.clock;
    this.onEvent = options.onEvent;
    this.logger = options.logger ?? defaultLogger;
    for (const pool of options.pools) {
      if (pool.driver === 'local') this.pools.set(pool.key, pool);
    }
  }

  async launch(spec: LaunchSpec): Promise<{ resourceId: string }> {
    if (this.closed) throw new Error('local provider is shut down');
    const resourceId = localResourceId(spec.backingNodeId, spec.attempt);
    // A child of ours (even one being terminated) or an ended one: never a second process.
    if (this.children.has(resourceId) || this.ended.has(resourceId)) return { resourceId };
    const inFlight = this.launches.get(resourceId);
    if (inFlight) return inFlight;
    const launching = this.start(spec, resourceId).finally(() => this.launches.delete(resourceId));
    this.launches.set(resourceId, launching);
    return launching;
  }

  async describe(resourceId: string): Promise<BackingResource | undefined> {
    const child = this.children.get(resourceId);
    if (child && !child.hasExited) {
      return this.toResource(child.record, child.terminating ? 'shutting-down' : child.record.state);
    }
    // Like EC2, which keeps describing a terminated instance (with its tags) for a while, so the
    // fulfil flow can still tell which backing node a termination event is about.
    const gone = this.ended.get(resourceId);
    if (gone) return this.toResource(gone, 'terminated');
    const record = await this.liveRecord(resourceId);
    return record && this.toResource(record, record.state);
  }

  async terminate(resourceId: string): Promise<void> {
    const inFlight = this.launches.get(resourceId);
    if (inFlight) await inFlight.catch(() => {});
    const child = this.children.get(resourceId);
    if (child) {
      if (child.hasExited && !child.terminating) return;
      child.terminating ??= this.stopChild(child);
      return child.terminating;
    }
    if (this.ended.has(resourceId)) return;
    let stopping = this.adoptedStops.get(resourceId);
    if (!stopping) {
      stopping = this.stopAdopted(resourceId).finally(() => this.adoptedStops.delete(resourceId));
      this.adoptedStops.set(resourceId, stopping);
    }
    return stopping;
  }

  async list(): Promise<BackingResource[]> {
    const ids = new Set<string>(this.children.keys());
    try {
      for (const name of await readdir(this.dir)) {
        if (name.endsWith('.json')) ids.add(name.slice(0, -'.json'.length));
        else await this.removeOrphanTmp(name);
      }
    } catch (err) {
      if (errorCode(err) !== 'ENOENT') throw err;
    }
    const resources = await Promise.all([...ids].sort().map((id) => this.describe(id)));
    return resources.filter((r): r is BackingResource => r !== undefined);
  }

  /**
   * Terminates every child this instance started (e.g. on Ctrl-C) and resolves once all have exited and
   * their events were delivered. Later launches are refused.
   */
  async shutdown(): Promise<void> {
    this.closed = true;
    this.stopWatchingAdopted();
    await Promise.allSettled([...this.launches.values()]);
    await Promise.allSettled(
      [...this.children.values()].filter((c) => !c.hasExited).map((c) => this.terminate(c.record.resourceId)),
    );
    await this.flush();
  }

  /**
   * Why a child of this instance exited before it was ready: its exit code or signal and the last line
   * it wrote to stderr (e.g. `backing node: server error: getaddrinfo ENOTFOUND ...` for a host it cannot
   * listen on), so the cause reaches the backing node's failure reason and not only the log.
   */
  endReason(resourceId: string): string | undefined {
    return this.endReasons.get(resourceId);
  }

  /** Resolves once every event emitted so far has been handed to `onEvent`. */
  async flush(): Promise<void> {
    let current: Promise<void>;
    do {
      current = this.events;
      await current;
    } while (current !== this.events);
  }

  // --- internals --------------------------------------------------------------------------------------

  private settings(poolKey: string, labelName: string): LabelSettings {
    const pool = this.pools.get(poolKey);
    if (!pool) throw new Error(`local provider: unknown backing pool ${poolKey}`);
    const label = pool.labels.get(labelName);
    if (!label) throw new Error(`local provider: backing pool ${poolKey} has no label ${labelName}`);
    const bootDelay = label.options['boot-delay'] ?? 0;
    if (typeof bootDelay !== 'number' || !Number.isFinite(bootDelay) || bootDelay < 0) {
      throw new Error(`local provider: label ${labelName} of ${poolKey}: boot-delay must be seconds >= 0`);
    }
    const attributes = label.options.attributes;
    return { bootDelaySeconds: bootDelay, attributes: isRecord(attributes) ? attributes : {} };
  }

  private file(resourceId: string): string {
    return join(this.dir, `${resourceId}.json`);
  }

  private keyFile(resourceId: string): string {
    return join(this.dir, `${resourceId}.key`);
  }

  private async readRecord(resourceId: string): Promise<LocalRecord | undefined> {
    try {
      return parseRecord(resourceId, await readFile(this.file(resourceId), 'utf8'));
    } catch (err) {
      if (errorCode(err) === 'ENOENT') return undefined;
      throw err;
    }
  }

  /** The resource's record if its process is alive; a stale record is removed. */
  private async liveRecord(resourceId: string): Promise<LocalRecord | undefined> {
    const record = await this.readRecord(resourceId);
    if (!record) return undefined;
    if (await isAlive(record.pid, resourceId)) {
      if (!this.children.has(resourceId) && !this.launches.has(resourceId)) this.watchAdopted(record);
      return record;
    }
    // A launch or a child of ours may have (re)written the record meanwhile: only a non-child's is stale.
    if (!this.children.has(resourceId) && !this.launches.has(resourceId)) await this.removeFile(resourceId);
    return undefined;
  }

  /** Removes `<id>.json.<pid>.tmp` (or `<id>.key.<pid>.tmp`) left behind by a writer that died mid-write. */
  private async removeOrphanTmp(name: string): Promise<void> {
    const writer = /\.(?:json|key)\.(\d+)\.tmp$/.exec(name)?.[1];
    if (writer === undefined || Number(writer) === process.pid) return;
    try {
      process.kill(Number(writer), 0);
      return; // The writer is alive: its rename is still to come.
    } catch (err) {
      if (errorCode(err) !== 'ESRCH') return;
    }
    await unlink(join(this.dir, name)).catch(() => {});
  }

  private async writeRecord(record: LocalRecord): Promise<void> {
    const path = this.file(record.resourceId);
    const tmp = `${path}.${process.pid}.tmp`;
    await writeFile(tmp, `${JSON.stringify(record, null, 2)}\n`);
    await rename(tmp, path);
  }

  /** Removes the resource's record and its host key. */
  private async removeFile(resourceId: string): Promise<void> {
    for (const path of [this.file(resourceId), this.keyFile(resourceId)]) {
      try {
        await unlink(path);
      } catch (err) {
        if (errorCode(err) !== 'ENOENT') throw err;
      }
    }
  }

  /** Queues a file operation of a child after its previous ones; failures are logged, never thrown. */
  private io(child: Child, op: () => Promise<void>): Promise<void> {
    child.io = child.io.then(op).catch((err: unknown) => {
      this.logger.error('local provider: state file operation failed', {
        resourceId: child.record.resourceId,
        error: String(err),
      });
    });
    return child.io;
  }

  /** Queues an event; events reach `onEvent` one at a time, in order. A failing handler is logged. */
  private emit(resourceId: string, state: InstanceState): void {
    const event = stateChangeEvent({
      resourceId,
      state,
      source: LOCAL_EVENT_SOURCE,
      region: this.region,
      at: this.clock.now(),
    });
    this.events = this.events.then(async () => {
      try {
        await this.onEvent(event);
      } catch (err) {
        this.logger.error('local provider: event handler failed', { resourceId, state, error: String(err) });
      }
    });
  }

  private toResource(record: LocalRecord, state: BackingResource['state']): BackingResource {
    let labelAttributes: Readonly<Record<string, unknown>> = {};
    try {
      labelAttributes = this.settings(record.poolKey, record.label).attributes;
    } catch {
      // The pool or label is no longer configured (adopted from an older configuration).
    }
    return {
      resourceId: record.resourceId,
      backingNodeId: record.backingNodeId,
      poolKey: record.poolKey,
      state,
      ...(record.startedAt > 0 ? { launchedAt: record.startedAt } : {}),
      ...(state === 'running' || state === 'shutting-down' ? { host: record.host } : {}),
      ...(record.port !== undefined && state !== 'pending' ? { port: record.port } : {}),
      attributes: {
        ...labelAttributes,
        provider: 'local',
        pool: record.poolKey,
        label: record.label,
        resourceId: record.resourceId,
        pid: record.pid,
        ...(record.hostKeys ? { hostKeys: [...record.hostKeys] } : {}),
      },
    };
  }

  private async start(spec: LaunchSpec, resourceId: string): Promise<{ resourceId: string }> {
    const { bootDelaySeconds } = this.settings(spec.poolKey, spec.label);
    await mkdir(this.dir, { recursive: true });
    // A process of an earlier run of the provider may hold this resource already: adopt it.
    if (await this.liveRecord(resourceId)) return { resourceId };
    await this.removeFile(resourceId);
    if (this.closed) throw new Error('local provider is shut down');

    const proc = spawn(
      process.execPath,
      [
        '--import',
        tsxLoader(),
        BACKING_NODE_SCRIPT,
        '--id',
        spec.backingNodeId,
        '--resource',
        resourceId,
        '--boot-delay',
        String(bootDelaySeconds),
        '--host',
        this.host,
        '--state-file',
        this.file(resourceId),
        '--host-key-file',
        this.keyFile(resourceId),
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const pid = proc.pid;
    if (pid === undefined) {
      const error = await new Promise<Error>((resolve) => proc.once('error', resolve));
      throw new Error(`local provider: cannot start backing node ${spec.backingNodeId}: ${error.message}`);
    }

    let markExited = (): void => {};
    const child: Child = {
      record: {
        resourceId,
        backingNodeId: spec.backingNodeId,
        poolKey: spec.poolKey,
        label: spec.label,
        attempt: spec.attempt,
        pid,
        host: this.host,
        state: 'pending',
        startedAt: this.clock.now(),
      },
      process: proc,
      exited: new Promise<void>((resolve) => {
        markExited = resolve;
      }),
      hasExited: false,
      io: Promise.resolve(),
      stderrTail: '',
    };
    this.children.set(resourceId, child);

    proc.on('error', (err) => {
      this.logger.error('local provider: backing node process error', { resourceId, error: err.message });
    });
    let stdout = '';
    proc.stdout?.setEncoding('utf8');
    proc.stdout?.on('data', (chunk: string) => {
      stdout += chunk;
      let newline = stdout.indexOf('\n');
      while (newline >= 0) {
        this.onChildLine(child, stdout.slice(0, newline).trim());
        stdout = stdout.slice(newline + 1);
        newline = stdout.indexOf('\n');
      }
      if (stdout.length > STDOUT_BUFFER_CHARS) stdout = '';
    });
    proc.stderr?.setEncoding('utf8');
    proc.stderr?.on('data', (chunk: string) => {
      child.stderrTail = (child.stderrTail + chunk).slice(-STDERR_TAIL_CHARS);
    });
    // 'close' comes after 'exit' and after stdout was drained, so a READY line is never seen late.
    proc.once('close', (code, signal) => {
      child.hasExited = true;
      markExited();
      this.onChildClosed(child, code, signal);
    });

    this.emit(resourceId, 'pending');
    await this.io(child, () => this.writeRecord(child.record));
    this.logger.info('local provider: backing node starting', { resourceId, pid, bootDelaySeconds });
    return { resourceId };
  }

  private onChildLine(child: Child, line: string): void {
    // `HOSTKEY <type> <base64>` lines come before READY, so the keys are known once the node is running.
    const hostKey = /^HOSTKEY (\S+ \S+)$/.exec(line)?.[1];
    if (hostKey !== undefined) {
      if (child.record.state === 'pending' && !child.record.hostKeys?.includes(hostKey)) {
        child.record.hostKeys = [...(child.record.hostKeys ?? []), hostKey];
      }
      return;
    }
    const match = /^READY (\d+)$/.exec(line);
    if (!match || child.record.state === 'running' || child.hasExited) return;
    child.record.port = Number(match[1]);
    child.record.state = 'running';
    child.record.readyAt = this.clock.now();
    const { resourceId, port } = child.record;
    // A terminating node is no longer reported as becoming ready.
    if (child.terminating) return;
    void this.io(child, () => this.writeRecord(child.record));
    this.emit(resourceId, 'running');
    this.logger.info('local provider: backing node running', { resourceId, port });
  }

  private onChildClosed(child: Child, code: number | null, signal: NodeJS.Signals | null): void {
    const { resourceId } = child.record;
    if (child.terminating) return; // terminate() cleans up and reports.
    this.children.delete(resourceId);
    this.ended.set(resourceId, child.record);
    const wasReady = child.record.state === 'running';
    if (!wasReady) {
      const how = signal ? `signal ${signal}` : `exit code ${code}`;
      const lastLine = child.stderrTail.trim().split('\n').pop()?.trim();
      const said = lastLine ? `: ${clip(lastLine, MAX_END_REASON_LINE)}` : '';
      this.endReasons.set(resourceId, `exited before it was ready (${how})${said}`);
    }
    this.logger.warn(
      `local provider: backing node exited ${wasReady ? 'unexpectedly' : 'before it was ready'}`,
      {
        resourceId,
        code,
        signal,
        stderr: child.stderrTail.trim() || undefined,
      },
    );
    void this.io(child, () => this.removeFile(resourceId));
    this.emit(resourceId, 'terminated');
  }

  private async stopChild(child: Child): Promise<void> {
    const { resourceId } = child.record;
    this.emit(resourceId, 'shutting-down');
    child.process.kill('SIGTERM');
    if (!(await within(child.exited, TERMINATE_GRACE_MS))) {
      this.logger.warn('local provider: backing node ignored SIGTERM, killing it', { resourceId });
      child.process.kill('SIGKILL');
      if (!(await within(child.exited, KILL_WAIT_MS))) {
        this.logger.error('local provider: backing node did not exit after SIGKILL', { resourceId });
      }
    }
    await this.io(child, () => this.removeFile(resourceId));
    this.emit(resourceId, 'terminated');
    // Only now, so that a concurrent terminate() still finds `terminating` and waits for all of the above.
    this.children.delete(resourceId);
    this.ended.set(resourceId, child.record);
    this.logger.info('local provider: backing node terminated', { resourceId });
  }

  /**
   * Watches a live process this instance did not start (adopted from an earlier run's state file): when
   * it dies it is reported `terminated`, as a child's exit is, so no node is placed on its dead port
   * until the next reaper run.
   */
  private watchAdopted(record: LocalRecord): void {
    if (this.closed) return;
    this.adopted.set(record.resourceId, record);
    if (this.adoptedWatch) return;
    this.adoptedWatch = setInterval(() => void this.checkAdopted(), ADOPTED_WATCH_MS);
    this.adoptedWatch.unref();
  }

  private stopWatchingAdopted(): void {
    clearInterval(this.adoptedWatch);
    this.adoptedWatch = undefined;
  }

  private checking = false;

  private async checkAdopted(): Promise<void> {
    if (this.checking) return;
    this.checking = true;
    try {
      for (const [resourceId, record] of this.adopted) {
        if (this.closed) return;
        // Our own terminate() reports its end itself.
        if (this.adoptedStops.has(resourceId) || (await isAlive(record.pid, resourceId))) continue;
        this.adopted.delete(resourceId);
        this.ended.set(resourceId, record);
        this.logger.warn('local provider: adopted backing node exited', { resourceId, pid: record.pid });
        await this.removeFile(resourceId).catch(() => {});
        this.emit(resourceId, 'terminated');
      }
    } finally {
      this.checking = false;
      if (this.adopted.size === 0) this.stopWatchingAdopted();
    }
  }

  /** Stops a resource known only from its state file (started by an earlier run of the provider). */
  private async stopAdopted(resourceId: string): Promise<void> {
    this.adopted.delete(resourceId);
    const record = await this.readRecord(resourceId);
    if (!record) return;
    const alive = () => isAlive(record.pid, resourceId);
    if (!(await alive())) {
      await this.removeFile(resourceId);
      return;
    }
    this.emit(resourceId, 'shutting-down');
    const signalAndWait = async (signal: NodeJS.Signals, ms: number): Promise<boolean> => {
      try {
        process.kill(record.pid, signal);
      } catch (err) {
        if (errorCode(err) === 'ESRCH') return true;
        throw err;
      }
      const deadline = Date.now() + ms;
      while (Date.now() < deadline) {
        if (!(await alive())) return true;
        await delay(POLL_MS);
      }
      return !(await alive());
    };
    if (!(await signalAndWait('SIGTERM', TERMINATE_GRACE_MS))) {
      this.logger.warn('local provider: backing node ignored SIGTERM, killing it', { resourceId });
      if (!(await signalAndWait('SIGKILL', KILL_WAIT_MS))) {
        this.logger.error('local provider: backing node did not exit after SIGKILL', { resourceId });
      }
    }
    await this.removeFile(resourceId);
    this.emit(resourceId, 'terminated');
  }
}
