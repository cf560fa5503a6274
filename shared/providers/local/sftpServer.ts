/**
 * The `sftp` subsystem of a local backing node, over ssh2's SFTP server stream: what OpenSSH's `sftp`
 * and `scp` (which speaks SFTP by default since OpenSSH 9) need to put and get files and list, make and
 * remove directories. Relative paths are the slot's working directory's; absolute paths are taken as
 * they are, with the backing process's own uid: a local node is the user's own machine, so SFTP allows
 * exactly what a command run on the node could do, nothing more (no chroot, no privilege). A slot whose
 * jobs run as their own uid (the backing node then runs as root) is served confined to its directory
 * instead, what SFTP creates owned by the slot's uid (sftpConfined.ts).
 */
import { constants, type Stats } from 'node:fs';
import {
  type FileHandle,
  lstat,
  mkdir,
  open,
  opendir,
  readlink,
  realpath,
  rename,
  rmdir,
  stat,
  symlink,
  unlink,
} from 'node:fs/promises';
import { isAbsolute, resolve } from 'node:path';
import ssh2, { type Attributes, type SFTPWrapper } from 'ssh2';
import { applyAttrs, confinedFiles, SftpError, type SftpFiles } from './sftpConfined.ts';

const { STATUS_CODE, OPEN_MODE } = ssh2.utils.sftp;

/** SFTP open flags as open(2) flags (ssh2's flagsToString knows only the combinations fopen() has). */
function openFlags(flags: number): number | undefined {
  const read = (flags & OPEN_MODE.READ) !== 0;
  const write = (flags & OPEN_MODE.WRITE) !== 0;
  if (!read && !write) return undefined;
  let out = read && write ? constants.O_RDWR : write ? constants.O_WRONLY : constants.O_RDONLY;
  if (flags & OPEN_MODE.APPEND) out |= constants.O_APPEND;
  if (flags & OPEN_MODE.CREAT) out |= constants.O_CREAT;
  if (flags & OPEN_MODE.TRUNC) out |= constants.O_TRUNC;
  if (flags & OPEN_MODE.EXCL) out |= constants.O_EXCL;
  return out;
}

/** Bytes sent for one READ at most (OpenSSH asks for 32 KiB or less; a larger ask gets a short read). */
const MAX_READ = 64 * 1024;
/** Names returned by one READDIR. */
const NAMES_PER_READDIR = 100;
/** Open handles per SFTP session: a client that opens without closing is refused, not fed descriptors. */
const MAX_HANDLES = 256;

type Open =
  | { readonly kind: 'file'; readonly file: FileHandle }
  | { readonly kind: 'dir'; readonly anchor?: FileHandle; names?: string[] };

function statusOf(err: unknown): number {
  if (err instanceof SftpError) return err.status;
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT' || code === 'ENOTDIR') return STATUS_CODE.NO_SUCH_FILE;
  if (code === 'EACCES' || code === 'EPERM') return STATUS_CODE.PERMISSION_DENIED;
  return STATUS_CODE.FAILURE;
}

function attrsOf(s: Stats): Attributes {
  return {
    mode: s.mode,
    uid: s.uid,
    gid: s.gid,
    size: s.size,
    atime: Math.floor(s.atimeMs / 1000),
    mtime: Math.floor(s.mtimeMs / 1000),
  };
}

const PERMS = 'rwxrwxrwx';
/** `ls -l`'s line for an entry, which `sftp`'s `ls -l` prints as it is. */
function longname(name: string, s: Stats): string {
  const type = s.isDirectory() ? 'd' : s.isSymbolicLink() ? 'l' : '-';
  let perms = '';
  for (let i = 0; i < 9; i++) perms += s.mode & (1 << (8 - i)) ? PERMS[i] : '-';
  const date = new Date(s.mtimeMs).toISOString().slice(0, 16).replace('T', ' ');
  return `${type}${perms} ${s.nlink} ${s.uid} ${s.gid} ${s.size} ${date} ${name}`;
}

/** What ssh2 keeps private on a server-side SFTP stream: its channel id and the protocol it sends on. */
interface SftpInternals {
  readonly outgoing?: { readonly id: number; readonly state: string };
  readonly _protocol?: { exitStatus(channel: number, status: number): void };
}

/**
 * Sends `exit-status` on an SFTP session's channel. ssh2 exposes exit() on exec and shell channels
 * only; its SFTP stream keeps the channel to itself, so this uses the same protocol call exit() makes.
 */
function sendExitStatus(sftp: SFTPWrapper, status: number): void {
  const internals = sftp as unknown as SftpInternals;
  if (internals.outgoing?.state !== 'open') return;
  try {
    internals._protocol?.exitStatus(internals.outgoing.id, status);
  } catch {
    // The connection is gone.
  }
}

/** The file system as the backing process sees it, relative paths `cwd`'s (what SFTP always did). */
function plainFiles(cwd: string): SftpFiles {
  const at = (name: string): string => (isAbsolute(name) ? resolve(name) : resolve(cwd, name || '.'));
  return {
    async open(name, flags, mode) {
      const path = at(name);
      return { file: await open(path, flags, mode), path };
    },
    async opendir(name) {
      const path = at(name);
      if (!(await stat(path)).isDirectory()) {
        throw new SftpError(STATUS_CODE.FAILURE, `${name}: not a directory`);
      }
      return { path };
    },
    entry: (dirPath, filename) => resolve(dirPath, filename),
    stat: (name) => stat(at(name)),
    lstat: (name) => lstat(at(name)),
    setstat: (name, attrs) => applyAttrs(at(name), attrs),
    fsetstat: (path, attrs) => applyAttrs(path, attrs),
    async remove(name) {
      const target = at(name);
      if ((await lstat(target)).isDirectory()) {
        throw new SftpError(STATUS_CODE.FAILURE, `${name}: is a directory`);
      }
      await unlink(target);
    },
    async rmdir(name) {
      const target = at(name);
      if (!(await lstat(target)).isDirectory()) {
        throw new SftpError(STATUS_CODE.FAILURE, `${name}: not a directory`);
      }
      await rmdir(target);
    },
    mkdir: (name, mode) => mkdir(at(name), { mode }).then(() => {}),
    // A path that does not exist yet (the target of a put) is normalized, not refused.
    realpath: (name) => realpath(at(name)).catch(() => at(name)),
    rename: (from, to) => rename(at(from), at(to)),
    readlink: (name) => readlink(at(name)),
    symlink: (target, link) => symlink(target, at(link)),
  };
}

/**
 * Serves one SFTP session, paths relative to `cwd`; every handle still open is closed when it ends. With
 * `confine`, every path must resolve inside `cwd`, and what SFTP creates is owned by `confine`'s uid
 * and gid (sftpConfined.ts).
 */
export function serveSftp(
  sftp: SFTPWrapper,
  cwd: string,
  confine?: { uid: number; gid: number; view?: string },
): void {
  const files = confine ? confinedFiles(cwd, confine) : plainFiles(cwd);
  const handles = new Map<number, Open & { readonly path: string }>();
  let nextHandle = 0;
  const handleOf = (buf: Buffer) => (buf.length === 4 ? handles.get(buf.readUInt32BE(0)) : undefined);
  const newHandle = (entry: Open & { readonly path: string }): Buffer | undefined => {
    if (handles.size >= MAX_HANDLES) return undefined;
    const id = nextHandle++ >>> 0;
    handles.set(id, entry);
    const buf = Buffer.alloc(4);
    buf.writeUInt32BE(id);
    return buf;
  };
  /**
   * Runs a request after the ones before it, in the order they came; a thrown error answers with its
   * status and message. One at a time: run concurrently, the answers went out in the order the file
   * system finished them, and under load (3 CPU hogs on 2 cores) one download in three through OpenSSH's
   * scp came back different from the file, with exit 0; answered in order, six in six were exact. Why the
   * client took the reordered answers wrong is not established. A session is one user's copy on loopback:
   * order matters more than overlap.
   */
  let queue: Promise<void> = Promise.resolve();
  const serve = (reqid: number, work: () => Promise<void>): void => {
    queue = queue.then(work).catch((err: unknown) => {
      try {
        sftp.status(reqid, statusOf(err), (err as Error).message);
      } catch {
        // The session is gone.
      }
    });
  };
  const ok = (reqid: number) => sftp.status(reqid, STATUS_CODE.OK);

  sftp.on('error', () => {});
  // The client's EOF ends the subsystem: exit status 0 (as sshd reports sftp-server's; scp exits 1
  // without one), then close the channel, or scp waits for it forever.
  sftp.on('end', () => {
    sendExitStatus(sftp, 0);
    sftp.end();
  });
  const closeEntry = (entry: Open): Promise<void> | undefined =>
    entry.kind === 'file' ? entry.file.close() : entry.anchor?.close();
  sftp.on('close', () => {
    for (const entry of handles.values()) void closeEntry(entry)?.catch(() => {});
    handles.clear();
  });

  sftp.on('OPEN', (reqid, filename, flags, attrs) =>
    serve(reqid, async () => {
      const mode = openFlags(flags);
      if (mode === undefined)
        return void sftp.status(reqid, STATUS_CODE.FAILURE, 'open for neither read nor write');
      const perm = typeof attrs?.mode === 'number' ? attrs.mode & 0o7777 : 0o666;
      const { file, path } = await files.open(filename, mode, perm);
      const handle = newHandle({ kind: 'file', file, path });
      if (!handle) {
        await file.close();
        return void sftp.status(reqid, STATUS_CODE.FAILURE, 'too many open handles');
      }
      sftp.handle(reqid, handle);
    }),
  );
  sftp.on('READ', (reqid, handle, offset, length) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (entry?.kind !== 'file') return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      const buffer = Buffer.alloc(Math.min(length, MAX_READ));
      const { bytesRead } = await entry.file.read(buffer, 0, buffer.length, offset);
      if (bytesRead === 0) return void sftp.status(reqid, STATUS_CODE.EOF);
      sftp.data(reqid, buffer.subarray(0, bytesRead));
    }),
  );
  sftp.on('WRITE', (reqid, handle, offset, data) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (entry?.kind !== 'file') return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      let written = 0;
      while (written < data.length) {
        const { bytesWritten } = await entry.file.write(
          data,
          written,
          data.length - written,
          offset + written,
        );
        written += bytesWritten;
      }
      ok(reqid);
    }),
  );
  sftp.on('FSTAT', (reqid, handle) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (!entry) return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      sftp.attrs(reqid, attrsOf(entry.kind === 'file' ? await entry.file.stat() : await stat(entry.path)));
    }),
  );
  sftp.on('FSETSTAT', (reqid, handle, attrs) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (!entry) return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      await files.fsetstat(entry.path, attrs);
      ok(reqid);
    }),
  );
  sftp.on('CLOSE', (reqid, handle) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (!entry) return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      handles.delete(handle.readUInt32BE(0));
      await closeEntry(entry);
      ok(reqid);
    }),
  );
  sftp.on('OPENDIR', (reqid, path) =>
    serve(reqid, async () => {
      const dir = await files.opendir(path);
      const handle = newHandle({ kind: 'dir', ...dir });
      if (!handle) {
        await dir.anchor?.close();
        return void sftp.status(reqid, STATUS_CODE.FAILURE, 'too many open handles');
      }
      sftp.handle(reqid, handle);
    }),
  );
  sftp.on('READDIR', (reqid, handle) =>
    serve(reqid, async () => {
      const entry = handleOf(handle);
      if (entry?.kind !== 'dir') return void sftp.status(reqid, STATUS_CODE.FAILURE, 'bad handle');
      if (!entry.names) {
        entry.names = ['.', '..'];
        for await (const d of await opendir(entry.path)) entry.names.push(d.name);
      }
      const batch = entry.names.splice(0, NAMES_PER_READDIR);
      if (batch.length === 0) return void sftp.status(reqid, STATUS_CODE.EOF);
      const names = [];
      for (const filename of batch) {
        const s = await lstat(files.entry(entry.path, filename)).catch(() => undefined);
        if (s) names.push({ filename, longname: longname(filename, s), attrs: attrsOf(s) });
      }
      sftp.name(reqid, names);
    }),
  );
  sftp.on('STAT', (reqid, path) =>
    serve(reqid, async () => sftp.attrs(reqid, attrsOf(await files.stat(path)))),
  );
  sftp.on('LSTAT', (reqid, path) =>
    serve(reqid, async () => sftp.attrs(reqid, attrsOf(await files.lstat(path)))),
  );
  sftp.on('SETSTAT', (reqid, path, attrs) =>
    serve(reqid, async () => {
      await files.setstat(path, attrs);
      ok(reqid);
    }),
  );
  sftp.on('REMOVE', (reqid, path) =>
    serve(reqid, async () => {
      await files.remove(path);
      ok(reqid);
    }),
  );
  sftp.on('RMDIR', (reqid, path) =>
    serve(reqid, async () => {
      await files.rmdir(path);
      ok(reqid);
    }),
  );
  sftp.on('MKDIR', (reqid, path, attrs) =>
    serve(reqid, async () => {
      await files.mkdir(path, typeof attrs?.mode === 'number' ? attrs.mode & 0o7777 : 0o777);
      ok(reqid);
    }),
  );
  sftp.on('REALPATH', (reqid, path) =>
    serve(reqid, async () => {
      const real = await files.realpath(path);
      sftp.name(reqid, [{ filename: real, longname: real, attrs: {} as Attributes }]);
    }),
  );
  sftp.on('RENAME', (reqid, oldPath, newPath) =>
    serve(reqid, async () => {
      await files.rename(oldPath, newPath);
      ok(reqid);
    }),
  );
  sftp.on('READLINK', (reqid, path) =>
    serve(reqid, async () => {
      const target = await files.readlink(path);
      sftp.name(reqid, [{ filename: target, longname: target, attrs: {} as Attributes }]);
    }),
  );
  sftp.on('SYMLINK', (reqid, linkPath, targetPath) =>
    serve(reqid, async () => {
      // OpenSSH's sftp-server swaps the two (a long-standing bug clients now expect): targetPath is the link.
      await files.symlink(linkPath, targetPath);
      ok(reqid);
    }),
  );
}
