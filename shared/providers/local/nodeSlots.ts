/**
 * A local backing node's slots as the live file names them, the logins on them and each slot's working
 * directory and environment. Used by backingNode.ts and nodeSshServer.ts.
 */
import { chmod, mkdir, readFile, rename, rm, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { parseLiveSlots, slotUser } from './liveSlots.ts';
import type { SlotIsolation } from './slotIsolation.ts';
import { KILL_GRACE_MS } from './slotProcess.ts';

/** A logged-in connection: the slot and node it is for, and the process groups its sessions started. */
export interface Login {
  readonly slot: number;
  readonly nodeId: string;
  /** The slot's working directory, as this process reaches it. */
  readonly dir: string;
  /** The same directory as the slot's jobs see it (its HOME): `dir`, or /home/slot<N> when contained. */
  readonly home: string;
  readonly end: () => void;
  readonly groups: Set<number>;
}

/** How long a login waits for its slot to be live (the pool writes the file just after the node is ready). */
const LOGIN_WAIT_MS = 2_000;
const LOGIN_POLL_MS = 100;
/** How often an unreadable live file is warned about (it is re-read every second). */
const WARN_EVERY_MS = 10_000;
/** Environment variables a client may set (as sshd's default AcceptEnv). */
export const ACCEPTED_ENV = /^(LANG|LC_[A-Z]+)$/;

/**
 * The slots as the live file says, re-read on demand; when a slot's node changes, every login for the old
 * node ends and its working directory is moved aside and removed, so the next node starts empty.
 */
export class Slots {
  private slots: Readonly<Record<string, string>> = {};
  private reading: Promise<void> | undefined;
  private warnedAt = Number.NEGATIVE_INFINITY;
  readonly logins = new Set<Login>();

  /** The slots whose cgroup was made (contained slots), to remove when their node goes or we stop. */
  private readonly prepared = new Set<number>();

  constructor(
    private readonly liveFile: string,
    private readonly workDir: string,
    /** Set when this backing node contains its slots (slotIsolation.ts). */
    readonly isolation?: SlotIsolation,
  ) {}

  nodeOn(slot: number): string | undefined {
    return this.slots[String(slot)];
  }

  /**
   * Re-reads the live file, one read at a time. Only what the file says changes anything: a missing file
   * means no live slot (none written yet, or the pool removed it with the backing node); a file that cannot
   * be read (EMFILE under a connection flood, EACCES, EIO) or is not a live-slots file says nothing, and
   * every login and slot directory stays as it is until a read succeeds.
   */
  reload(): Promise<void> {
    this.reading ??= this.read().finally(() => {
      this.reading = undefined;
    });
    return this.reading;
  }

  /** The node on `slot`, waiting up to LOGIN_WAIT_MS for the pool to name one. */
  async waitFor(slot: number): Promise<string | undefined> {
    const deadline = Date.now() + LOGIN_WAIT_MS;
    for (;;) {
      await this.reload();
      const node = this.nodeOn(slot);
      if (node !== undefined || Date.now() >= deadline) return node;
      await new Promise((resolve) => setTimeout(resolve, LOGIN_POLL_MS));
    }
  }

  /**
   * The slot's working directory, made private (0700) if it is not there yet, with its `~slot<N>` link
   * (homeLink) in place.
   */
  async dirOf(slot: number): Promise<string> {
    const dir = join(this.workDir, slotUser(slot));
    await mkdir(this.workDir, { recursive: true, mode: 0o700 });
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await chmod(dir, 0o700);
    await homeLink(dir, slotUser(slot));
    // Once per node on the slot (clear() forgets it): its cgroup and its directories' owner.
    if (this.isolation && !this.prepared.has(slot)) {
      const tmp = this.tmpOf(slot);
      await mkdir(tmp, { recursive: true, mode: 0o700 });
      await this.isolation.prepare(slot, dir, tmp, join(dir, `~${slotUser(slot)}`));
      this.prepared.add(slot);
    }
    return dir;
  }

  /** A contained slot's /tmp (and /var/tmp), new for each node as its directory is. */
  tmpOf(slot: number): string {
    return join(this.workDir, `.tmp-${slotUser(slot)}`);
  }

  /** The slot's home as its jobs see it. */
  homeOf(slot: number, dir: string): string {
    return this.isolation ? this.isolation.home(slot) : dir;
  }

  /** How a command is started in the slot: through the slot program when contained, else as it is. */
  wrapperOf(
    slot: number,
    dir: string,
  ): ((file: string, args: readonly string[]) => [string, string[]]) | undefined {
    const isolation = this.isolation;
    if (!isolation) return undefined;
    return (file, args) => isolation.wrap(slot, dir, this.tmpOf(slot), file, args);
  }

  /** Whose a contained slot's SFTP acts as (sftpServer.ts), or undefined when slots are not contained. */
  confineOf(slot: number): { uid: number; gid: number; view: string } | undefined {
    if (!this.isolation) return undefined;
    const id = this.isolation.uid(slot);
    return { uid: id, gid: id, view: this.isolation.home(slot) };
  }

  /** Every contained slot's processes end and its cgroup goes (the backing node stops). */
  async removeAll(): Promise<void> {
    const isolation = this.isolation;
    if (!isolation) return;
    await Promise.all([...this.prepared].map((slot) => isolation.remove(slot).catch(() => {})));
    this.prepared.clear();
  }

  private async read(): Promise<void> {
    const next = await this.readFile();
    if (next === undefined) return;
    const before = this.slots;
    this.slots = next;
    for (const login of this.logins) {
      if (next[String(login.slot)] !== login.nodeId) login.end();
    }
    for (const [slot, node] of Object.entries(before)) {
      if (next[slot] !== node) await this.clear(Number(slot));
    }
  }

  /** The file's slots; {} when there is no file; undefined (with a warning) when it cannot be known. */
  private async readFile(): Promise<Readonly<Record<string, string>> | undefined> {
    let text: string;
    try {
      text = await readFile(this.liveFile, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
      return this.unknown(`cannot read ${this.liveFile}: ${(err as NodeJS.ErrnoException).code ?? err}`);
    }
    return parseLiveSlots(text)?.slots ?? this.unknown(`${this.liveFile} is not a live-slots file`);
  }

  /** Says (at most once per WARN_EVERY_MS) why the live slots are unknown; they are kept as they were. */
  private unknown(why: string): undefined {
    const now = Date.now();
    if (now - this.warnedAt >= WARN_EVERY_MS) {
      this.warnedAt = now;
      process.stderr.write(`backing node: ${why}; every slot is kept as it was\n`);
    }
    return undefined;
  }

  /** Moves a slot's directory aside (its next node gets a fresh one at once) and removes it in the background. */
  private async clear(slot: number): Promise<void> {
    if (this.isolation && this.prepared.delete(slot)) {
      // Every process of the slot ends, wherever it went (setsid included): its cgroup is killed.
      await this.isolation.remove(slot).catch((err: unknown) => {
        process.stderr.write(`backing node: cannot end slot ${slot}'s processes: ${String(err)}\n`);
      });
      const tmp = this.tmpOf(slot);
      const tmpGone = join(this.workDir, `.gone-tmp-${slotUser(slot)}-${Date.now()}-${process.pid}`);
      if (
        await rename(tmp, tmpGone).then(
          () => true,
          () => false,
        )
      ) {
        setTimeout(
          () => void rm(tmpGone, { recursive: true, force: true }).catch(() => {}),
          KILL_GRACE_MS + 200,
        );
      }
    }
    const dir = join(this.workDir, slotUser(slot));
    const gone = join(this.workDir, `.gone-${slotUser(slot)}-${Date.now()}-${process.pid}`);
    try {
      await rename(dir, gone);
    } catch {
      return; // Never logged into: nothing to clear.
    }
    // After the old node's processes had their SIGKILL, so none writes into it while it goes.
    setTimeout(() => void rm(gone, { recursive: true, force: true }).catch(() => {}), KILL_GRACE_MS + 200);
  }
}

/**
 * `<dir>/~<user>` -> `.`, so that the word `~slot<N>` names the slot's directory from it. A client that
 * asks the node for a user's home does it the POSIX way, `echo ~slot<N>` (Ansible, for its remote_tmp
 * and every `~/` path a task names), and a shell expands `~name` only for a name the system's user
 * database knows. `slot<N>` is not a system user (a local node runs as you, without root), so POSIX
 * leaves the word as it is: `~slot0`, a relative path, which Ansible then uses from the login directory.
 * Without the link it made a directory literally named `~slot0` there, and `dest: ~/f` wrote
 * `~slot0/f`; with it both land where `HOME` is. Recreated at every login, so removing it is harmless.
 */
async function homeLink(dir: string, user: string): Promise<void> {
  try {
    await symlink('.', join(dir, `~${user}`));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
}

/**
 * The PATH of a job: OpenSSH's default user path (`/usr/local/bin:/usr/bin:/bin`) with the sbin
 * directories after it, as RHEL's sshd and Ubuntu's pam_env give a login; not the backing process's.
 */
export const SLOT_PATH = '/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin';

/**
 * The environment of a slot's processes, built from nothing as sshd builds a login's: HOME and PWD (the
 * slot's directory), USER and LOGNAME (`slot<N>`), SHELL, PATH (SLOT_PATH), METASTATIC_NODE_ID and
 * METASTATIC_SLOT, and what the client sent of ACCEPTED_ENV (`extra`); a pty adds TERM
 * (slotProcess.ts). Nothing of the backing process's own (`metastatic dev`'s: its PATH, npm_*, AWS_*,
 * SSH_AUTH_SOCK, TMUX) reaches a job.
 */
export function slotEnv(login: Login, extra: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  const sent = Object.entries(extra).filter(([key]) => ACCEPTED_ENV.test(key));
  return {
    ...Object.fromEntries(sent),
    HOME: login.home,
    PWD: login.home,
    USER: slotUser(login.slot),
    LOGNAME: slotUser(login.slot),
    SHELL: '/bin/sh',
    PATH: SLOT_PATH,
    METASTATIC_NODE_ID: login.nodeId,
    METASTATIC_SLOT: String(login.slot),
  };
}
