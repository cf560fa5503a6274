/**
 * The `local` driver: backing nodes are real child processes on this machine (see backingNode.ts), each
 * serving SSH on a TCP port of `host`. Used by the embedded pool in place of EC2. Its records on disk are
 * in localRecords.ts (a restarted provider adopts the live processes they name), starting and stopping
 * processes in supervisor.ts. The public host keys are reported in `attributes.hostKeys`
 * (`["<type> <base64>"]`). State changes are reported as EC2-shaped events through `onEvent`, delivered
 * one at a time in the order they happened (localEvents.ts). Processes of an earlier run are watched and
 * stopped by adoptedResources.ts.
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { Clock } from '../../core/clock.ts';
import type { BackingPool } from '../../core/model.ts';
import type { BackingProvider, BackingResource, LaunchSpec } from '../../core/provider.ts';
import { limitsOf } from '../../core/slotLimits.ts';
import type { StateChangeEvent } from '../../core/stateChanges.ts';
import { clip } from '../../core/text.ts';
import { AdoptedResources } from './adoptedResources.ts';
import { formatLiveSlots } from './liveSlots.ts';
import { LocalEventQueue } from './localEvents.ts';
import { isAlive, type LocalRecord, localResourceId, RecordFiles, resourceOf } from './localRecords.ts';
import {
  type LabelSettings,
  labelSettings,
  type Supervised,
  type SupervisorLogger,
  spawnBackingNode,
  stopChildProcess,
  supervise,
} from './supervisor.ts';

/** Characters of a child's last stderr line carried into a failure reason. */
const MAX_END_REASON_LINE = 300;

export type LocalProviderLogger = SupervisorLogger;

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
  /**
   * Public keys (OpenSSH lines) every backing node lets in besides its pool's `authorized-keys`: the
   * embedded pool's own client key (shared/runtime/clientKey.ts).
   */
  readonly authorizedKeys?: readonly string[];
}

/** A child process started by this provider instance. */
interface Child {
  readonly record: LocalRecord;
  /** The process, as the supervisor watches it (exit, stderr). */
  readonly run: Supervised;
  /** Set once terminate() took charge: the exit is then expected, and terminate() reports it. */
  terminating?: Promise<void>;
  /** Serializes this resource's state-file writes and removal. */
  io: Promise<void>;
}

const defaultLogger: LocalProviderLogger = {
  info: () => {},
  warn: (msg, extra) => console.warn(msg, extra ?? ''),
  error: (msg, extra) => console.error(msg, extra ?? ''),
};

export class LocalProvider implements BackingProvider {
  private readonly files: RecordFiles;
  private readonly host: string;
  private readonly clock: Clock;
  private readonly events: LocalEventQueue;
  private readonly logger: LocalProviderLogger;
  private readonly authorizedKeys: readonly string[];
  /** The live-slots file's text last written per resource, so an unchanged set is neither written nor signalled. */
  private readonly liveWritten = new Map<string, string>();
  private readonly pools = new Map<string, BackingPool>();
  /** Live children started by this instance. */
  private readonly children = new Map<string, Child>();
  /** Launches in progress, so concurrent launches of one spec share one process. */
  private readonly launches = new Map<string, Promise<{ resourceId: string }>>();
  /**
   * Resources this instance launched that have ended, with their last record. Like an EC2 idempotency token, launching the same
   * (backingNodeId, attempt) again returns the ended resource instead of starting a second one.
   */
  private readonly ended = new Map<string, LocalRecord>();
  /** Resources started by an earlier run of the provider (adopted from their state files). */
  private readonly adopted: AdoptedResources;
  /** Why a child exited before it was ready (see endReason). */
  private readonly endReasons = new Map<string, string>();
  private closed = false;

  constructor(options: LocalProviderOptions) {
    this.files = new RecordFiles(join(options.stateDir, 'local'));
    this.host = options.host ?? '127.0.0.1';
    this.clock = options.clock;
    this.logger = options.logger ?? defaultLogger;
    this.events = new LocalEventQueue(options.onEvent, options.region ?? 'local', this.clock, this.logger);
    this.adopted = new AdoptedResources(this.files, this.events, this.logger, (record) =>
      this.ended.set(record.resourceId, record),
    );
    this.authorizedKeys = options.authorizedKeys ?? [];
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
    if (child && !child.run.hasExited) {
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
      if (child.run.hasExited && !child.terminating) return;
      child.terminating ??= this.stopChild(child);
      return child.terminating;
    }
    if (this.ended.has(resourceId)) return;
    return this.adopted.terminate(resourceId);
  }

  async list(): Promise<BackingResource[]> {
    const ids = new Set<string>([...this.children.keys(), ...(await this.files.ids())]);
    const resources = await Promise.all([...ids].sort().map((id) => this.describe(id)));
    return resources.filter((r): r is BackingResource => r !== undefined);
  }

  /**
   * Terminates every child this instance started (e.g. on Ctrl-C) and resolves once all have exited and
   * their events were delivered. Later launches are refused.
   */
  async shutdown(): Promise<void> {
    this.closed = true;
    this.adopted.close();
    await Promise.allSettled([...this.launches.values()]);
    await Promise.allSettled(
      [...this.children.values()]
        .filter((c) => !c.run.hasExited)
        .map((c) => this.terminate(c.record.resourceId)),
    );
    await this.flush();
  }

  /**
   * Tells a backing process which of its slots are live, and for which node (slot -> node id): written to
   * its live file (liveSlots.ts), then SIGHUP so that it re-reads it at once. A login is let in only for
   * a node named there; the sessions of a node no longer named end. Unchanged sets are skipped.
   */
  async setLiveSlots(resourceId: string, slots: Readonly<Record<string, string>>): Promise<void> {
    const text = formatLiveSlots(slots);
    if (this.liveWritten.get(resourceId) === text) return;
    const child = this.children.get(resourceId);
    let pid: number | undefined;
    if (child) {
      if (child.run.hasExited || child.terminating) return;
      pid = child.record.pid;
    } else {
      const record = await this.liveRecord(resourceId);
      if (!record) return;
      if (record.state === 'running') pid = record.pid;
    }
    await this.files.writePrivate(this.files.liveFile(resourceId), text);
    this.liveWritten.set(resourceId, text);
    // Only a process that announced READY has its SIGHUP handler (the default action would end it); one
    // still starting reads the file before it listens. It re-reads it every second anyway.
    if (child) {
      if (child.record.state === 'running') child.run.process.kill('SIGHUP');
    } else if (pid !== undefined && (await isAlive(pid, resourceId))) {
      try {
        process.kill(pid, 'SIGHUP');
      } catch {
        // Gone meanwhile.
      }
    }
  }

  /** The local resources known now (children and records on disk), by id: the ones setLiveSlots serves. */
  async resourceIds(): Promise<string[]> {
    return [...new Set<string>([...this.children.keys(), ...(await this.files.ids())])];
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
  flush(): Promise<void> {
    return this.events.flush();
  }

  // --- internals --------------------------------------------------------------------------------------

  /** The authorized-keys file of a backing node of `poolKey`: the provider's keys, then the pool's. */
  private authorizedKeysFor(poolKey: string): string {
    const configured = this.pools.get(poolKey)?.poolOptions['authorized-keys'];
    const poolKeys = Array.isArray(configured) ? configured.filter((k) => typeof k === 'string') : [];
    return [...this.authorizedKeys, ...poolKeys].map((line) => `${line}\n`).join('');
  }

  private settings(poolKey: string, labelName: string): LabelSettings {
    return labelSettings(this.pools.get(poolKey), poolKey, labelName);
  }

  /** The resource's record if its process is alive; a stale record is removed. */
  private async liveRecord(resourceId: string): Promise<LocalRecord | undefined> {
    const record = await this.files.read(resourceId);
    if (!record) return undefined;
    if (await isAlive(record.pid, resourceId)) {
      if (!this.children.has(resourceId) && !this.launches.has(resourceId)) this.adopted.add(record);
      return record;
    }
    // A launch or a child of ours may have (re)written the record meanwhile: only a non-child's is stale.
    if (!this.children.has(resourceId) && !this.launches.has(resourceId)) await this.files.remove(resourceId);
    return undefined;
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

  private toResource(record: LocalRecord, state: BackingResource['state']): BackingResource {
    let labelAttributes: Readonly<Record<string, unknown>> = {};
    try {
      labelAttributes = this.settings(record.poolKey, record.label).attributes;
    } catch {
      // The pool or label is no longer configured (adopted from an older configuration).
    }
    return resourceOf(record, state, labelAttributes);
  }

  private async start(spec: LaunchSpec, resourceId: string): Promise<{ resourceId: string }> {
    const { bootDelaySeconds, isolation } = this.settings(spec.poolKey, spec.label);
    await mkdir(this.files.dir, { recursive: true });
    // A process of an earlier run of the provider may hold this resource already: adopt it.
    if (await this.liveRecord(resourceId)) return { resourceId };
    await this.files.remove(resourceId);
    if (this.closed) throw new Error('local provider is shut down');

    // Written before the process starts, which reads it once it listens: no login before it is there.
    const authorizedKeysFile = this.files.authorizedKeysFile(resourceId);
    await this.files.writePrivate(authorizedKeysFile, this.authorizedKeysFor(spec.poolKey));
    this.liveWritten.delete(resourceId);
    const proc = await spawnBackingNode({
      backingNodeId: spec.backingNodeId,
      resourceId,
      bootDelaySeconds,
      host: this.host,
      stateFile: this.files.file(resourceId),
      hostKeyFile: this.files.keyFile(resourceId),
      authorizedKeysFile,
      liveFile: this.files.liveFile(resourceId),
      workDir: this.files.workDir(resourceId),
      isolation,
      limits: limitsOf(spec.slot),
    });
    const pid = proc.pid as number;
    const record: LocalRecord = {
      resourceId,
      backingNodeId: spec.backingNodeId,
      poolKey: spec.poolKey,
      label: spec.label,
      attempt: spec.attempt,
      pid,
      host: this.host,
      state: 'pending',
      startedAt: this.clock.now(),
    };
    const child: Child = {
      record,
      run: supervise(proc, resourceId, this.logger, {
        onLine: (line) => this.onChildLine(child, line),
        onClosed: (code, signal) => this.onChildClosed(child, code, signal),
      }),
      io: Promise.resolve(),
    };
    this.children.set(resourceId, child);

    this.events.emit(resourceId, 'pending');
    await this.io(child, () => this.files.write(child.record));
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
    if (!match || child.record.state === 'running' || child.run.hasExited) return;
    child.record.port = Number(match[1]);
    child.record.state = 'running';
    child.record.readyAt = this.clock.now();
    const { resourceId, port } = child.record;
    // A terminating node is no longer reported as becoming ready.
    if (child.terminating) return;
    void this.io(child, () => this.files.write(child.record));
    this.events.emit(resourceId, 'running');
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
      const lastLine = child.run.stderrTail.trim().split('\n').pop()?.trim();
      const said = lastLine ? `: ${clip(lastLine, MAX_END_REASON_LINE)}` : '';
      this.endReasons.set(resourceId, `exited before it was ready (${how})${said}`);
    }
    this.logger.warn(
      `local provider: backing node exited ${wasReady ? 'unexpectedly' : 'before it was ready'}`,
      {
        resourceId,
        code,
        signal,
        stderr: child.run.stderrTail.trim() || undefined,
      },
    );
    void this.io(child, () => this.files.remove(resourceId));
    this.events.emit(resourceId, 'terminated');
  }

  private async stopChild(child: Child): Promise<void> {
    const { resourceId } = child.record;
    this.events.emit(resourceId, 'shutting-down');
    await stopChildProcess(child.run, resourceId, this.logger);
    await this.io(child, () => this.files.remove(resourceId));
    this.events.emit(resourceId, 'terminated');
    // Only now, so that a concurrent terminate() still finds `terminating` and waits for all of the above.
    this.children.delete(resourceId);
    this.ended.set(resourceId, child.record);
    this.logger.info('local provider: backing node terminated', { resourceId });
  }
}
