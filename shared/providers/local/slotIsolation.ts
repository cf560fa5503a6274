/**
 * A local backing node's slots contained, where the machine allows it: run as root on Linux,
 * with util-linux's `unshare`, `setpriv` and `mount` and a writable cgroup hierarchy. Each slot's jobs
 * then run through the slot program (shared/providers/slot/slotProgram.ts, written beside the backing
 * node's state file) as a uid of their own, in the slot's cgroup (its label's cores and memory, a pids
 * cap), in mount and PID namespaces of their own (/home/slot<N>, a private /tmp, only their own
 * processes). The uids are numbers no user of the machine has (no user is added to its user database);
 * every cgroup made is removed when the slot's node goes and when the backing node stops.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync } from 'node:fs';
import { chown, lchown, readdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { SlotLimits } from '../../core/slotLimits.ts';
import { SLOT_PROGRAM } from '../slot/slotProgram.ts';
import { slotUser } from './liveSlots.ts';

/** The first slot uid: far above any uid or subordinate range a distribution hands out. */
const UID_BASE = 1_900_000_000;
/** Slot uids per backing node: slot N of a backing node is `base + N`, N < this. */
const UIDS_PER_NODE = 1024;
const NODES = 100_000;

/**
 * `isolation` of a local pool: contain where possible (auto: as root, else rootless, else not), always
 * (contain: as root, else the node fails), never; `rootless` (a backing node's own argument, not a
 * configuration value): without root even as root, for tests.
 */
export type IsolationMode = 'auto' | 'contain' | 'none' | 'rootless';

/** Why slots cannot be contained without root here (user and mount namespaces), or undefined. */
export function rootlessUnavailable(): string | undefined {
  if (process.platform !== 'linux') return `slots are contained on Linux only (this is ${process.platform})`;
  const tool = ['unshare', 'setpriv', 'mount'].find(
    (t) => !['/usr/bin', '/bin', '/usr/sbin', '/sbin'].some((d) => existsSync(join(d, t))),
  );
  return tool === undefined ? undefined : `slots cannot be contained without util-linux's ${tool}`;
}

/** Why slots cannot be contained on this machine, or undefined when they can. */
export function containmentUnavailable(cgroupRoot = '/sys/fs/cgroup'): string | undefined {
  if (process.getuid?.() !== 0) return 'slots are contained only when metastatic dev runs as root';
  const tools = rootlessUnavailable();
  if (tools !== undefined) return tools;
  const writable = ['', 'memory', 'unified'].some((sub) => {
    try {
      accessSync(join(cgroupRoot, sub), constants.W_OK);
      return existsSync(join(cgroupRoot, sub, 'cgroup.procs'));
    } catch {
      return false;
    }
  });
  return writable
    ? undefined
    : `slots cannot be contained without a writable cgroup hierarchy at ${cgroupRoot}`;
}

/** FNV-1a of the backing node's id: where its slot uids start. */
function nodeIndex(backingNodeId: string): number {
  let hash = 0x811c9dc5;
  for (const byte of Buffer.from(backingNodeId, 'utf8')) hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  return hash % NODES;
}

/** The uid (and gid) of slot N of a backing node, when contained. */
export function slotUid(backingNodeId: string, slot: number): number {
  if (!Number.isInteger(slot) || slot < 0 || slot >= UIDS_PER_NODE) {
    throw new RangeError(`a contained backing node has at most ${UIDS_PER_NODE} slots`);
  }
  return UID_BASE + nodeIndex(backingNodeId) * UIDS_PER_NODE + slot;
}

/** The cgroup name of slot N of a backing node (under `metastatic/` in each hierarchy). */
export function slotGroup(backingNodeId: string, slot: number): string {
  return `${backingNodeId.replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 100)}-${slotUser(slot)}`;
}

export class SlotIsolation {
  private constructor(
    private readonly program: string,
    private readonly backingNodeId: string,
    private readonly limits: SlotLimits,
    /** Without root: the directory hidden from the jobs (the pool's state); undefined: as root. */
    private readonly hide?: string,
  ) {}

  /**
   * Writes the slot program to `program` (0700) and returns the isolation of this backing node's slots:
   * as root, or, with `rootless`, without it (the program's run-rootless, `rootless.hide` covered).
   */
  static async install(
    program: string,
    backingNodeId: string,
    limits: SlotLimits,
    rootless?: { readonly hide: string },
  ): Promise<SlotIsolation> {
    await writeFile(program, SLOT_PROGRAM, { mode: 0o700 });
    return new SlotIsolation(program, backingNodeId, limits, rootless?.hide);
  }

  /** Whether the slots are contained without root: no uid of their own, no limits. */
  get rootless(): boolean {
    return this.hide !== undefined;
  }

  /** The uid (and gid) slot N's jobs run as (without root: the backing node's own). */
  uid(slot: number): number {
    return this.hide === undefined ? slotUid(this.backingNodeId, slot) : (process.getuid?.() ?? 0);
  }

  /** Where slot N's home is, as its jobs see it. */
  home(slot: number): string {
    return `/home/${slotUser(slot)}`;
  }

  /** The cgroup name of slot N (unique per backing node). */
  private group(slot: number): string {
    return slotGroup(this.backingNodeId, slot);
  }

  /** Slot N ready for a node: its cgroup with its limits, its directories owned by its uid. */
  async prepare(slot: number, dir: string, tmp: string, link: string): Promise<void> {
    if (this.rootless) return; // no cgroup, and the directories are the backing node's own already
    const { millicores, memoryMiB, pids } = this.limits;
    await this.call(['setup', this.group(slot), String(millicores), String(memoryMiB), String(pids)]);
    const id = this.uid(slot);
    await chown(dir, id, id);
    await chown(tmp, id, id);
    await lchown(link, id, id);
  }

  /** The program and arguments that run `file args` in slot N. */
  wrap(slot: number, dir: string, tmp: string, file: string, args: readonly string[]): [string, string[]] {
    if (this.hide !== undefined) {
      return [this.program, ['run-rootless', dir, tmp, slotUser(slot), this.hide, '--', file, ...args]];
    }
    const id = String(this.uid(slot));
    return [this.program, ['run', this.group(slot), id, id, dir, tmp, slotUser(slot), '--', file, ...args]];
  }

  /**
   * Tries what a slot needs once (the program's `probe`: a cgroup with this node's limits, a mount
   * namespace, another uid): a machine that refuses one (a controller not available, a container
   * without CAP_SYS_ADMIN) is found here, at start, and not at a job's first login. Throws with the
   * slot program's reason.
   */
  async probe(dir: string): Promise<void> {
    if (this.hide !== undefined) {
      await this.call(['run-rootless', dir, dir, 'probe', this.hide, '--', 'true']);
      return;
    }
    const { millicores, memoryMiB, pids } = this.limits;
    const group = `${slotGroup(this.backingNodeId, 0).slice(0, -'slot0'.length)}probe`;
    try {
      await this.call(['probe', group, String(millicores), String(memoryMiB), String(pids)]);
    } finally {
      await this.call(['remove', group]).catch(() => {});
    }
  }

  /** Every process of slot N ends, and its cgroup goes (its next node makes a new one). */
  async remove(slot: number): Promise<void> {
    if (this.rootless) return; // its processes ended with its sessions' PID namespaces
    await this.call(['remove', this.group(slot)]);
  }

  private call(args: readonly string[]): Promise<void> {
    return new Promise((resolve, reject) => {
      execFile(this.program, args, { timeout: 30_000 }, (err, _stdout, stderr) => {
        if (err) reject(new Error(`${args[0]} of a slot failed: ${stderr.trim() || err.message}`));
        else resolve();
      });
    });
  }
}

/** The cgroup hierarchies a slot's cgroups may be in: v2's root, v1's controllers, a hybrid's v2. */
const HIERARCHIES = ['', 'memory', 'cpu', 'cpuacct', 'pids', 'unified'];

/**
 * Ends every process of a backing node's contained slots and removes their cgroups: for a backing node
 * that died without doing it (SIGKILL), once its record is found stale. Nothing where there is none.
 */
export async function removeSlotGroups(backingNodeId: string, cgroupRoot = '/sys/fs/cgroup'): Promise<void> {
  const prefix = slotGroup(backingNodeId, 0).slice(0, -'slot0'.length);
  for (const hierarchy of HIERARCHIES) {
    const parent = join(cgroupRoot, hierarchy, 'metastatic');
    const names = await readdir(parent).catch(() => [] as string[]);
    for (const name of names) {
      if (!name.startsWith(prefix) || !/^slot\d+$/.test(name.slice(prefix.length))) continue;
      await removeGroup(join(parent, name));
    }
    await rmdir(parent).catch(() => {}); // only once no slot of any backing node is left in it
  }
}

async function removeGroup(dir: string): Promise<void> {
  await writeFile(join(dir, 'cgroup.kill'), '1').catch(() => {});
  for (let attempt = 0; attempt < 20; attempt += 1) {
    const procs = await readFile(join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
    for (const pid of procs.split('\n').filter(Boolean)) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone already
      }
    }
    if (
      await rmdir(dir).then(
        () => true,
        () => false,
      )
    )
      return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
