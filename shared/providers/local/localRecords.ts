import { createHash } from 'node:crypto';
import { readdir, readFile, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { BackingResource } from '../../core/provider.ts';
import { SLOT_USER_PREFIX } from './liveSlots.ts';
import { removeSlotGroups } from './slotIsolation.ts';

/**
 * The local provider's records on disk. Every resource is recorded under `<stateDir>/local/<resourceId>.json`,
 * its SSH host key (private, 0600) under `<resourceId>.key`, the public keys it lets in under
 * `<resourceId>.authorized_keys`, its live slots under `<resourceId>.live` (liveSlots.ts) and its slots'
 * working directories under `<resourceId>.work/`; all go when the resource ends. A record
 * whose pid is alive is a resource "tagged as ours", so a restarted provider can still see, describe and
 * terminate the backing nodes of a previous run.
 */

export /** What `<stateDir>/local/<resourceId>.json` holds. */
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

/** `local-` + the first 16 hex digits of sha256(`<backingNodeId>#<attempt>`). */
export function localResourceId(backingNodeId: string, attempt: number): string {
  return `local-${createHash('sha256').update(`${backingNodeId}#${attempt}`).digest('hex').slice(0, 16)}`;
}

export { isLocalResourceId } from './driver.ts';

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function errorCode(err: unknown): string | undefined {
  return isRecord(err) && typeof err.code === 'string' ? err.code : undefined;
}

export function parseRecord(resourceId: string, text: string): LocalRecord | undefined {
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
export async function isAlive(pid: number, resourceId: string): Promise<boolean> {
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

/** The record files of one state directory. Writes are atomic (a temporary file renamed over the record). */
export class RecordFiles {
  constructor(readonly dir: string) {}

  file(resourceId: string): string {
    return join(this.dir, `${resourceId}.json`);
  }

  keyFile(resourceId: string): string {
    return join(this.dir, `${resourceId}.key`);
  }

  authorizedKeysFile(resourceId: string): string {
    return join(this.dir, `${resourceId}.authorized_keys`);
  }

  liveFile(resourceId: string): string {
    return join(this.dir, `${resourceId}.live`);
  }

  workDir(resourceId: string): string {
    return join(this.dir, `${resourceId}.work`);
  }

  /** Writes one of the resource's files atomically (tmp + rename), private to the user. */
  async writePrivate(path: string, text: string): Promise<void> {
    const tmp = `${path}.${process.pid}.tmp`;
    await writeFile(tmp, text, { mode: 0o600 });
    await rename(tmp, path);
  }

  async read(resourceId: string): Promise<LocalRecord | undefined> {
    try {
      return parseRecord(resourceId, await readFile(this.file(resourceId), 'utf8'));
    } catch (err) {
      if (errorCode(err) === 'ENOENT') return undefined;
      throw err;
    }
  }

  async write(record: LocalRecord): Promise<void> {
    const path = this.file(record.resourceId);
    const tmp = `${path}.${process.pid}.tmp`;
    await writeFile(tmp, `${JSON.stringify(record, null, 2)}\n`);
    await rename(tmp, path);
  }

  /**
   * Removes the resource's record, its host key, its authorized and live files, its slot program and its
   * slots' directories (and, for a backing node that died unstopped, its contained slots' cgroups).
   */
  async remove(resourceId: string): Promise<void> {
    // A backing node that died unstopped (SIGKILL) left its contained slots' processes and cgroups.
    const record = await this.read(resourceId).catch(() => undefined);
    if (record) await removeSlotGroups(record.backingNodeId);
    const files = [
      this.file(resourceId),
      this.keyFile(resourceId),
      this.authorizedKeysFile(resourceId),
      this.liveFile(resourceId),
      this.file(resourceId).replace(/\.json$/, '.slot'),
    ];
    for (const path of files) {
      try {
        await unlink(path);
      } catch (err) {
        if (errorCode(err) !== 'ENOENT') throw err;
      }
    }
    await rm(this.workDir(resourceId), { recursive: true, force: true });
  }

  /** The resource ids recorded; temporary files a dead writer left behind are removed on the way. */
  async ids(): Promise<string[]> {
    const out: string[] = [];
    try {
      for (const name of await readdir(this.dir)) {
        if (name.endsWith('.json')) out.push(name.slice(0, -'.json'.length));
        else await this.removeOrphanTmp(name);
      }
    } catch (err) {
      if (errorCode(err) !== 'ENOENT') throw err;
    }
    return out;
  }

  /** Removes `<id>.json.<pid>.tmp` (or `.key`, `.authorized_keys`, `.live`) left behind by a writer that died mid-write. */
  private async removeOrphanTmp(name: string): Promise<void> {
    const writer = /\.(?:json|key|authorized_keys|live)\.(\d+)\.tmp$/.exec(name)?.[1];
    if (writer === undefined || Number(writer) === process.pid) return;
    try {
      process.kill(Number(writer), 0);
      return; // The writer is alive: its rename is still to come.
    } catch (err) {
      if (errorCode(err) !== 'ESRCH') return;
    }
    await unlink(join(this.dir, name)).catch(() => {});
  }
}

/** A record as the resource the provider reports, in `state`, with its label's attributes. */
export function resourceOf(
  record: LocalRecord,
  state: BackingResource['state'],
  labelAttributes: Readonly<Record<string, unknown>>,
): BackingResource {
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
      // One user per slot (`slot<N>`, liveSlots.ts): a node's username is this and its slot (core/request.ts).
      slotUserPrefix: SLOT_USER_PREFIX,
      ...(record.hostKeys ? { hostKeys: [...record.hostKeys] } : {}),
    },
  };
}
