/**
 * A local backing node's slots as the live file names them, the logins on them and each slot's working
 * directory and environment. Used by backingNode.ts and nodeSshServer.ts.
 */
import { chmod, mkdir, readFile, rename, rm, symlink } from 'node:fs/promises';
import { join } from 'node:path';
import { parseLiveSlots, slotUser } from './liveSlots.ts';
import { KILL_GRACE_MS } from './slotProcess.ts';

/** A logged-in connection: the slot and node it is for, and the process groups its sessions started. */
export interface Login {
  readonly slot: number;
  readonly nodeId: string;
  readonly dir: string;
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

  constructor(
    private readonly liveFile: string,
    private readonly workDir: string,
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
    return dir;
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

/** The environment of a slot's processes: the backing process's own, without the pool's variables. */
export function slotEnv(login: Login, extra: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith('METASTATIC_')) env[key] = value;
  }
  return {
    ...env,
    ...extra,
    HOME: login.dir,
    PWD: login.dir,
    METASTATIC_NODE_ID: login.nodeId,
    METASTATIC_SLOT: String(login.slot),
  };
}
