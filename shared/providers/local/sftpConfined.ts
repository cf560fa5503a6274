/**
 * SFTP confined to a slot's directory, for a backing node that runs as root and each slot's
 * jobs as their own unprivileged uid: SFTP runs in the backing node's process, so without this it would
 * read and write anything as root.
 *
 * Every path a client names must resolve inside the slot's directory: relative paths are the
 * directory's, absolute ones are taken as the backing machine's paths and refused unless they lead into
 * it. The job's own view of the file system is its slot (its namespaces may show other paths at `/`), so
 * an absolute path outside the slot's directory names nothing SFTP may touch; REALPATH of `.` answers the
 * directory's real path, and paths built on that are accepted. A symbolic link may point anywhere (its
 * text is only text, and READLINK answers it), but following it out of the slot is refused.
 *
 * How, free of races with a job that swaps a component for a symlink meanwhile: a path is opened
 * O_PATH (which reads nothing, and opens a FIFO without blocking) and what was opened is checked, by the
 * kernel's own name for it, readlink(/proc/self/fd/N), to be the directory or under it. The operation
 * then goes through /proc/self/fd/N, which is that very inode: the object itself (stat, setstat, OPEN
 * of an existing file), or, for what creates, removes or renames a name, its parent directory, the name
 * being one component that is not followed (O_NOFOLLOW | O_EXCL when creating a file). What SFTP creates
 * is chowned to the slot's uid and gid through an O_PATH descriptor of the new object, so a swap after
 * creation can at most hand the slot something already in its directory.
 *
 * OPEN takes regular files and directories only (opening a FIFO would hold one of libuv's threads until
 * a writer came). A refusal does not tell whether something exists outside: outside by name, or through
 * a symbolic link (dangling or not), is PERMISSION_DENIED either way.
 *
 * Residual risks:
 * - A directory checked inside can be renamed out of the slot before the operation that follows; the
 *   job can only move it where its own uid may write, so what SFTP then does there the job could do.
 * - A hard link inside the slot to a file elsewhere is indistinguishable from that file's other names;
 *   fs.protected_hardlinks (on by default) keeps the slot's uid from linking files it does not own, and
 *   a non-directory with more than one link that the slot does not own is refused here too.
 * - Inside the slot SFTP acts as root: modes do not stop it reading or writing what is in the
 *   directory. Nothing the slot must not touch belongs in its directory. Changing the mode or owner of
 *   what the slot does not own is refused (a root-owned file made setuid would be root's), and modes
 *   given at creation lose setuid, setgid and sticky bits, which SETSTAT can set afterwards.
 * - READDIR of the slot directory lists `..` with its parent's attributes (mode, owner, times):
 *   metadata only, never its names or contents.
 * - Linux only: it needs /proc and O_PATH (0o10000000 on x86 and arm; node:fs does not export it).
 */
import { constants, type Stats } from 'node:fs';
import {
  chmod,
  chown,
  type FileHandle,
  lstat,
  mkdir,
  open,
  readlink,
  realpath,
  rename,
  rmdir,
  stat,
  symlink,
  truncate,
  unlink,
  utimes,
} from 'node:fs/promises';
import { basename, dirname, isAbsolute, resolve } from 'node:path';
import ssh2, { type Attributes } from 'ssh2';

const { STATUS_CODE } = ssh2.utils.sftp;

/** An answer with its own status and message (a thrown error otherwise answers by its errno). */
export class SftpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** What one SFTP session does to files, named as the client names them. */
export interface SftpFiles {
  /** An open file, and the path FSETSTAT changes it through. */
  open(name: string, flags: number, mode: number): Promise<{ file: FileHandle; path: string }>;
  /** A directory to list: the path its entries are under, and what to close when it is closed. */
  opendir(name: string): Promise<{ path: string; anchor?: FileHandle }>;
  /** The path of entry `filename` of a directory opendir() answered. */
  entry(dirPath: string, filename: string): string;
  stat(name: string): Promise<Stats>;
  lstat(name: string): Promise<Stats>;
  setstat(name: string, attrs: Attributes | undefined): Promise<void>;
  /** SETSTAT through a path open() answered. */
  fsetstat(path: string, attrs: Attributes | undefined): Promise<void>;
  remove(name: string): Promise<void>;
  rmdir(name: string): Promise<void>;
  mkdir(name: string, mode: number): Promise<void>;
  realpath(name: string): Promise<string>;
  rename(from: string, to: string): Promise<void>;
  readlink(name: string): Promise<string>;
  /** Makes `link`, a symbolic link whose text is `target`. */
  symlink(target: string, link: string): Promise<void>;
}

/** Applies the attributes a client set (SETSTAT, FSETSTAT) but the owner, which SFTP never changed. */
export async function applyAttrs(path: string, attrs: Attributes | undefined): Promise<void> {
  if (!attrs) return;
  if (typeof attrs.size === 'number') await truncate(path, attrs.size);
  if (typeof attrs.mode === 'number') await chmod(path, attrs.mode & 0o7777);
  if (typeof attrs.atime === 'number' && typeof attrs.mtime === 'number') {
    await utimes(path, attrs.atime, attrs.mtime);
  }
}

/** open(2)'s O_PATH on Linux. */
const O_PATH = 0o10000000;
const { O_CREAT, O_EXCL, O_NOFOLLOW } = constants;
/** The path of an open descriptor's own inode. */
const fdPath = (h: FileHandle): string => `/proc/self/fd/${h.fd}`;
/** `path` is `root` or under it (both absolute and normalized). */
const within = (path: string, root: string): boolean =>
  path === root || path.startsWith(root.endsWith('/') ? root : `${root}/`);
const errno = (err: unknown): string | undefined => (err as NodeJS.ErrnoException).code;

/** A path opened O_PATH and checked inside the slot: its descriptor, its real path, its stat. */
interface Anchor {
  readonly h: FileHandle;
  readonly real: string;
  readonly s: Stats;
}

/** SFTP in `dir` and nothing outside it, what it creates owned by `owner` (the slot's uid and gid). */
export function confinedFiles(dir: string, owner: { uid: number; gid: number; view?: string }): SftpFiles {
  const home = resolve(dir);
  let real: Promise<string> | undefined;
  const root = () => {
    real ??= realpath(home);
    return real;
  };
  // The slot's jobs know the directory by another name (`/home/slot<N>` in their mount namespace): an
  // absolute path under it is the same path in the directory, and answers are given under it.
  const view = owner.view === undefined ? undefined : resolve(owner.view);
  const fromView = (name: string): string | undefined =>
    view !== undefined && (name === view || name.startsWith(`${view}/`))
      ? resolve(home, `.${name.slice(view.length)}`)
      : undefined;
  const toView = async (path: string): Promise<string> => {
    if (view === undefined) return path;
    const base = await root();
    return path === base || path.startsWith(`${base}/`) ? `${view}${path.slice(base.length)}` : path;
  };
  const at = (name: string): string =>
    isAbsolute(name) ? (fromView(resolve(name)) ?? resolve(name)) : resolve(home, name || '.');
  const denied = (name: string, why = 'outside the slot directory') =>
    new SftpError(STATUS_CODE.PERMISSION_DENIED, `${name}: ${why}`);

  /**
   * Why `path` could not be opened, told only of what is inside: outside (by name, or through a symbolic
   * link, dangling or not) is refused, rather than saying whether something exists there.
   */
  const refusal = async (name: string, path: string, err: unknown): Promise<unknown> => {
    if (err instanceof SftpError) return err;
    const rootPath = await root();
    if (!within(path, home) && !within(path, rootPath)) return denied(name);
    if (path === home || path === rootPath) return err;
    let parent: Anchor;
    try {
      parent = await anchor(name, dirname(path), true);
    } catch (parentErr) {
      return parentErr;
    }
    try {
      const s = await lstat(`${fdPath(parent.h)}/${basename(path)}`).catch(() => undefined);
      return s?.isSymbolicLink() ? denied(name) : err;
    } finally {
      await parent.h.close();
    }
  };

  /** Opens `path` O_PATH (following a last symbolic link or not), refusing what is not inside. */
  const anchor = async (name: string, path: string, follow: boolean): Promise<Anchor> => {
    let h: FileHandle;
    try {
      h = await open(path, O_PATH | (follow ? 0 : O_NOFOLLOW));
    } catch (err) {
      throw await refusal(name, path, err);
    }
    try {
      const real = await readlink(fdPath(h));
      if (!within(real, await root())) throw denied(name);
      const s = await h.stat();
      if (!s.isDirectory() && s.nlink > 1 && s.uid !== owner.uid) {
        throw denied(name, 'a hard link to a file the slot does not own');
      }
      return { h, real, s };
    } catch (err) {
      await h.close();
      throw err;
    }
  };
  const withAnchor = async <T>(name: string, follow: boolean, work: (a: Anchor) => Promise<T>) => {
    const a = await anchor(name, at(name), follow);
    try {
      return await work(a);
    } finally {
      await a.h.close();
    }
  };
  /** Runs `work` on the last component of `name` in its checked parent: `path` goes through the parent. */
  const inParent = async <T>(name: string, work: (path: string, parentReal: string) => Promise<T>) => {
    const path = at(name);
    const base = basename(path);
    // The slot directory's own name is in a parent outside: it is neither removed nor renamed.
    if (!base || dirname(path) === path) throw denied(name);
    const parent = await anchor(name, dirname(path), true);
    try {
      return await work(`${fdPath(parent.h)}/${base}`, parent.real);
    } finally {
      await parent.h.close();
    }
  };
  /** Gives what SFTP just made at `path` to the slot, if it is still what was made there. */
  const own = async (name: string, path: string, made: (s: Stats) => boolean): Promise<void> => {
    const h = await open(path, O_PATH | O_NOFOLLOW);
    try {
      const s = await h.stat();
      if (!made(s) || (!s.isDirectory() && s.nlink > 1)) throw denied(name, 'replaced while being made');
      await chown(fdPath(h), owner.uid, owner.gid);
    } finally {
      await h.close();
    }
  };
  /** A mode or an owner changes only on what the slot owns, and the owner only to the slot's. */
  const setAttrs = async (name: string, path: string, s: Stats, attrs: Attributes | undefined) => {
    const owning = typeof attrs?.uid === 'number' || typeof attrs?.gid === 'number';
    if ((attrs?.uid ?? owner.uid) !== owner.uid || (attrs?.gid ?? owner.gid) !== owner.gid) {
      throw denied(name, 'the slot cannot give it to another owner');
    }
    if ((owning || typeof attrs?.mode === 'number') && s.uid !== owner.uid) {
      throw denied(name, 'not owned by the slot');
    }
    await applyAttrs(path, attrs);
    if (owning) await chown(path, owner.uid, owner.gid);
  };

  return {
    async open(name, flags, mode) {
      // Open what is there; else create it in its checked parent, exclusively and not through a symbolic
      // link, and open what is there if something came in between.
      for (let attempt = 0; attempt < 3; attempt++) {
        let existing: Anchor | undefined;
        try {
          existing = await anchor(name, at(name), true);
        } catch (err) {
          if (errno(err) !== 'ENOENT' || !(flags & O_CREAT)) throw err;
        }
        if (existing) {
          const { h, s } = existing;
          try {
            if (flags & O_CREAT && flags & O_EXCL)
              throw new SftpError(STATUS_CODE.FAILURE, `${name}: exists`);
            if (!s.isFile() && !s.isDirectory()) {
              throw new SftpError(STATUS_CODE.FAILURE, `${name}: not a regular file`);
            }
            const file = await open(fdPath(h), flags & ~(O_CREAT | O_EXCL));
            return { file, path: fdPath(file) };
          } finally {
            await h.close();
          }
        }
        const created = await inParent(name, async (path) => {
          try {
            return await open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW, mode & 0o777);
          } catch (err) {
            if (errno(err) === 'EEXIST' && !(flags & O_EXCL)) return undefined;
            throw err;
          }
        });
        if (created) {
          try {
            await created.chown(owner.uid, owner.gid);
          } catch (err) {
            await created.close();
            throw err;
          }
          return { file: created, path: fdPath(created) };
        }
      }
      throw new SftpError(STATUS_CODE.FAILURE, `${name}: changing while being opened`);
    },
    async opendir(name) {
      const a = await anchor(name, at(name), true);
      if (!a.s.isDirectory()) {
        await a.h.close();
        throw new SftpError(STATUS_CODE.FAILURE, `${name}: not a directory`);
      }
      return { path: fdPath(a.h), anchor: a.h };
    },
    entry: (dirPath, filename) => `${dirPath}/${filename}`,
    stat: (name) => withAnchor(name, true, async ({ s }) => s),
    lstat: (name) => withAnchor(name, false, async ({ s }) => s),
    setstat: (name, attrs) => withAnchor(name, true, ({ h, s }) => setAttrs(name, fdPath(h), s, attrs)),
    fsetstat: async (path, attrs) => setAttrs('the open file', path, await stat(path), attrs),
    remove: (name) =>
      inParent(name, async (path) => {
        if ((await lstat(path)).isDirectory()) {
          throw new SftpError(STATUS_CODE.FAILURE, `${name}: is a directory`);
        }
        await unlink(path);
      }),
    rmdir: (name) =>
      inParent(name, async (path) => {
        if (!(await lstat(path)).isDirectory()) {
          throw new SftpError(STATUS_CODE.FAILURE, `${name}: not a directory`);
        }
        await rmdir(path);
      }),
    mkdir: (name, mode) =>
      inParent(name, async (path) => {
        await mkdir(path, { mode: mode & 0o777 });
        await own(name, path, (s) => s.isDirectory());
      }),
    async realpath(name) {
      try {
        return await toView(await withAnchor(name, true, async (a) => a.real));
      } catch (err) {
        if (errno(err) !== 'ENOENT') throw err;
        // A path that does not exist yet (the target of a put), in a directory that does.
        return toView(
          await inParent(name, async (_path, parentReal) => resolve(parentReal, basename(at(name)))),
        );
      }
    },
    rename: (from, to) => inParent(from, (a) => inParent(to, (b) => rename(a, b))),
    readlink: (name) => inParent(name, (path) => readlink(path)),
    symlink: (target, link) =>
      inParent(link, async (path) => {
        await symlink(target, path);
        await own(link, path, (s) => s.isSymbolicLink());
      }),
  };
}
