import {
  link,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  readFile,
  realpath,
  rename,
  rm,
  stat,
  symlink,
  unlink,
  writeFile,
} from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import ssh2, { type SFTPWrapper } from 'ssh2';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { newEd25519PrivateKey } from '../../shared/providers/local/hostKey.ts';
import { serveSftp } from '../../shared/providers/local/sftpServer.ts';

/**
 * The SFTP subsystem of a local backing node confined to a slot's directory, as a slot whose jobs run as
 * their own uid gets it: driven through a real ssh2 SFTP session against an in-process ssh2 server whose
 * `sftp` subsystem is serveSftp(dir, { uid, gid }). Every path must resolve inside the slot's directory,
 * following a symlink out of it is refused, and what SFTP creates belongs to the slot's uid (the tests
 * run as root, so the chown is real). Without `confine`, SFTP is what it always was.
 */
const SLOT = { uid: 12345, gid: 12345 };
const PERMISSION_DENIED = ssh2.utils.sftp.STATUS_CODE.PERMISSION_DENIED;
const asRoot = process.getuid?.() === 0;

interface Session {
  sftp: SFTPWrapper;
  close(): Promise<void>;
}

/** An ssh2 server on 127.0.0.1 serving SFTP in `dir` (confined or not) and a client's SFTP session to it. */
async function session(dir: string, confine?: { uid: number; gid: number }): Promise<Session> {
  // An OpenSSH identification, so that the ssh2 client sends SYMLINK's arguments in OpenSSH's order.
  const server = new ssh2.Server({ hostKeys: [newEd25519PrivateKey()], ident: 'OpenSSH_9.9' }, (client) => {
    client.on('error', () => {});
    client.on('authentication', (ctx) => ctx.accept());
    client.on('session', (accept) => {
      accept().on('sftp', (acceptSftp) => {
        serveSftp(acceptSftp(), dir, confine);
      });
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address() as AddressInfo;
  const client = new ssh2.Client();
  await new Promise<void>((done, fail) => {
    client.on('ready', done).on('error', fail);
    client.connect({ host: '127.0.0.1', port, username: 'job' });
  });
  const sftp = await new Promise<SFTPWrapper>((done, fail) =>
    client.sftp((err, s) => (err ? fail(err) : done(s))),
  );
  return {
    sftp,
    close: async () => {
      client.end();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}

/** The SFTP status an operation failed with (or `ok` when it did not fail). */
async function statusOf(op: Promise<unknown>): Promise<number | 'ok'> {
  try {
    await op;
    return 'ok';
  } catch (err) {
    return (err as { code: number }).code;
  }
}

describe.skipIf(!asRoot || process.platform !== 'linux')('SFTP confined to a slot directory', () => {
  let top: string;
  let dir: string;
  let s: Session;
  let sftp: {
    writeFile(path: string, data: string): Promise<void>;
    readFile(path: string): Promise<Buffer>;
    mkdir(path: string): Promise<void>;
    stat(path: string): Promise<ssh2.Stats>;
    readdir(path: string): Promise<ssh2.FileEntry[]>;
    symlink(target: string, path: string): Promise<void>;
    readlink(path: string): Promise<string>;
    realpath(path: string): Promise<string>;
    rename(from: string, to: string): Promise<void>;
    setstat(path: string, attrs: ssh2.InputAttributes): Promise<void>;
    unlink(path: string): Promise<void>;
    rmdir(path: string): Promise<void>;
  };

  beforeAll(async () => {
    top = await realpath(await mkdtemp(join(tmpdir(), 'sftp-confined-')));
  });
  afterAll(async () => {
    await rm(top, { recursive: true, force: true });
  });
  beforeEach(async () => {
    dir = await mkdtemp(join(top, 'slot-'));
    await writeFile(join(top, 'outside.txt'), 'outside');
    s = await session(dir, SLOT);
    const w = s.sftp;
    sftp = {
      writeFile: promisify(w.writeFile.bind(w)) as (path: string, data: string) => Promise<void>,
      readFile: promisify(w.readFile.bind(w)) as (path: string) => Promise<Buffer>,
      mkdir: promisify(w.mkdir.bind(w)) as (path: string) => Promise<void>,
      stat: promisify(w.stat.bind(w)),
      readdir: promisify(w.readdir.bind(w)) as (path: string) => Promise<ssh2.FileEntry[]>,
      symlink: promisify(w.symlink.bind(w)),
      readlink: promisify(w.readlink.bind(w)),
      realpath: promisify(w.realpath.bind(w)),
      rename: promisify(w.rename.bind(w)),
      setstat: promisify(w.setstat.bind(w)),
      unlink: promisify(w.unlink.bind(w)),
      rmdir: promisify(w.rmdir.bind(w)),
    };
  });
  afterEach(async () => {
    await s.close();
  });

  it('puts a file the slot uid owns, by a relative or an absolute path inside the slot', async () => {
    await sftp.writeFile('put.txt', 'hello');
    const put = await stat(join(dir, 'put.txt'));
    expect([put.uid, put.gid]).toEqual([SLOT.uid, SLOT.gid]);
    expect(await readFile(join(dir, 'put.txt'), 'utf8')).toBe('hello');
    expect((await sftp.readFile('put.txt')).toString()).toBe('hello');

    await sftp.writeFile(join(dir, 'absolute.txt'), 'there');
    expect((await stat(join(dir, 'absolute.txt'))).uid).toBe(SLOT.uid);
    // Overwriting an existing file keeps it (and its owner).
    await sftp.writeFile('put.txt', 'again');
    expect(await readFile(join(dir, 'put.txt'), 'utf8')).toBe('again');
  });

  it('makes directories the slot uid owns, and lists and removes inside the slot', async () => {
    await sftp.mkdir('sub');
    await sftp.mkdir('sub/inner');
    for (const d of ['sub', 'sub/inner']) {
      const made = await stat(join(dir, d));
      expect(made.isDirectory()).toBe(true);
      expect([made.uid, made.gid]).toEqual([SLOT.uid, SLOT.gid]);
    }
    await sftp.writeFile('sub/inner/f', 'x');
    expect((await sftp.readdir('sub/inner')).map((e) => e.filename)).toEqual(['f']);
    expect((await sftp.stat('sub')).isDirectory()).toBe(true);
    await sftp.unlink('sub/inner/f');
    await sftp.rmdir('sub/inner');
    expect(await statusOf(stat(join(dir, 'sub', 'inner')))).not.toBe('ok');
  });

  it('answers the slot directory as the real path of `.`', async () => {
    expect(await sftp.realpath('.')).toBe(await realpath(dir));
    expect(await sftp.realpath('')).toBe(await realpath(dir));
    expect(await sftp.realpath('not-yet.txt')).toBe(join(await realpath(dir), 'not-yet.txt'));
    expect(await statusOf(sftp.realpath('..'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.realpath('/etc'))).toBe(PERMISSION_DENIED);
  });

  it('refuses absolute paths outside the slot', async () => {
    expect(await statusOf(sftp.readFile('/etc/hostname'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.stat('/etc/hostname'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.readdir('/etc'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.writeFile(join(top, 'planted.txt'), 'x'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(stat(join(top, 'planted.txt')))).not.toBe('ok');
    expect(await statusOf(sftp.mkdir(join(top, 'planted')))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.unlink(join(top, 'outside.txt')))).toBe(PERMISSION_DENIED);
    expect(await readFile(join(top, 'outside.txt'), 'utf8')).toBe('outside');
  });

  it('refuses `..` escapes out of the slot', async () => {
    expect(await statusOf(sftp.readFile('../outside.txt'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.readFile('sub/../../outside.txt'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.readdir('..'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.writeFile('../planted.txt', 'x'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(stat(join(top, 'planted.txt')))).not.toBe('ok');
    expect(await statusOf(sftp.mkdir('../planted'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.symlink('/etc', '../planted-link'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(lstat(join(top, 'planted-link')))).not.toBe('ok');
    // The slot directory itself cannot be removed or renamed away through SFTP.
    expect(await statusOf(sftp.rmdir('.'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.rename('.', 'elsewhere'))).toBe(PERMISSION_DENIED);
  });

  it('makes a symlink out of the slot (the slot uid owns it) but refuses to follow it', async () => {
    await sftp.symlink('/etc', 'etc-link');
    const made = await lstat(join(dir, 'etc-link'));
    expect(made.isSymbolicLink()).toBe(true);
    expect([made.uid, made.gid]).toEqual([SLOT.uid, SLOT.gid]);
    // Its text is harmless to read; what it points to is out of reach.
    expect(await sftp.readlink('etc-link')).toBe('/etc');
    expect(await statusOf(sftp.readFile('etc-link/hostname'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.stat('etc-link'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.readdir('etc-link'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.writeFile('etc-link/planted', 'x'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.mkdir('etc-link/planted'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.setstat('etc-link', { mode: 0o777 }))).toBe(PERMISSION_DENIED);

    // A link to a file outside, and a dangling one whose target would be created outside.
    await symlink(join(top, 'outside.txt'), join(dir, 'file-link'));
    expect(await statusOf(sftp.readFile('file-link'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.writeFile('file-link', 'x'))).toBe(PERMISSION_DENIED);
    expect(await readFile(join(top, 'outside.txt'), 'utf8')).toBe('outside');
    await symlink(join(top, 'dangling.txt'), join(dir, 'dangling-link'));
    expect(await statusOf(sftp.writeFile('dangling-link', 'x'))).not.toBe('ok');
    expect(await statusOf(stat(join(top, 'dangling.txt')))).not.toBe('ok');

    // A link that stays inside the slot is followed as usual.
    await sftp.writeFile('real.txt', 'inside');
    await sftp.symlink('real.txt', 'inside-link');
    expect((await sftp.readFile('inside-link')).toString()).toBe('inside');
    // The login directory's `~slot<N>` -> `.` (nodeSlots.ts) leads back into the slot.
    await symlink('.', join(dir, '~slot0'));
    await sftp.writeFile('~slot0/tilde.txt', 'home');
    expect(await readFile(join(dir, 'tilde.txt'), 'utf8')).toBe('home');
    expect(await sftp.realpath('~slot0')).toBe(await realpath(dir));
    // Removing or renaming the link itself is fine: neither follows it.
    await sftp.rename('etc-link', 'etc-link-2');
    await sftp.unlink('etc-link-2');
    expect(await statusOf(stat('/etc/hostname'))).toBe('ok');
  });

  it('refuses to rename into or out of the slot', async () => {
    await sftp.writeFile('moving.txt', 'm');
    expect(await statusOf(sftp.rename('moving.txt', '../moved.txt'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.rename('moving.txt', join(top, 'moved.txt')))).toBe(PERMISSION_DENIED);
    expect(await statusOf(stat(join(top, 'moved.txt')))).not.toBe('ok');
    expect(await statusOf(sftp.rename('../outside.txt', 'stolen.txt'))).toBe(PERMISSION_DENIED);
    expect(await readFile(join(top, 'outside.txt'), 'utf8')).toBe('outside');
    await sftp.mkdir('into');
    await sftp.rename('moving.txt', 'into/moved.txt');
    expect(await readFile(join(dir, 'into', 'moved.txt'), 'utf8')).toBe('m');
  });

  it('sets modes and times inside the slot but refuses to give a file to another owner', async () => {
    await sftp.writeFile('mine.txt', 'x');
    await sftp.setstat('mine.txt', { mode: 0o600 });
    expect((await stat(join(dir, 'mine.txt'))).mode & 0o777).toBe(0o600);
    await sftp.setstat('mine.txt', { atime: 1_000_000, mtime: 2_000_000 });
    expect((await stat(join(dir, 'mine.txt'))).mtimeMs).toBe(2_000_000_000);
    expect(await statusOf(sftp.setstat('mine.txt', { uid: 0, gid: 0 }))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.setstat('mine.txt', { uid: SLOT.uid, gid: 0 }))).toBe(PERMISSION_DENIED);
    const after = await stat(join(dir, 'mine.txt'));
    expect([after.uid, after.gid]).toEqual([SLOT.uid, SLOT.gid]);
    // The slot's own uid and gid are fine (what `chgrp` sends for a file the slot owns).
    await sftp.setstat('mine.txt', { uid: SLOT.uid, gid: SLOT.gid });
    expect(await statusOf(sftp.setstat('/etc/hostname', { mode: 0o777 }))).toBe(PERMISSION_DENIED);
  });

  it('does not tell whether something exists outside the slot', async () => {
    await symlink(top, join(dir, 'top-link'));
    for (const name of [join(top, 'outside.txt'), join(top, 'nothing.txt'), '../nothing.txt']) {
      expect(await statusOf(sftp.stat(name))).toBe(PERMISSION_DENIED);
    }
    for (const name of ['top-link/outside.txt', 'top-link/nothing.txt', 'top-link/nothing/deeper']) {
      expect(await statusOf(sftp.stat(name))).toBe(PERMISSION_DENIED);
    }
    // What does not exist inside is still just missing.
    expect(await statusOf(sftp.stat('nothing.txt'))).toBe(ssh2.utils.sftp.STATUS_CODE.NO_SUCH_FILE);
  });

  it('writes nothing outside while a job swaps a directory for a symlink out of the slot', async () => {
    const sub = join(dir, 'sub');
    const aside = join(dir, 'aside');
    await mkdir(sub);
    let swapping = true;
    // The job's side: `sub` is a directory, then a symlink to the parent of the slot, again and again.
    const job = (async () => {
      while (swapping) {
        await rename(sub, aside).catch(() => {});
        await symlink(top, sub).catch(() => {});
        await new Promise((done) => setImmediate(done));
        await unlink(sub).catch(() => {});
        await rename(aside, sub).catch(() => {});
        await new Promise((done) => setImmediate(done));
      }
    })();
    try {
      for (let i = 0; i < 150; i++) {
        await statusOf(sftp.writeFile(`sub/raced-${i}.txt`, 'x'));
        await statusOf(sftp.mkdir(`sub/raced-dir-${i}`));
        await statusOf(sftp.setstat('sub/../sub', { mode: 0o751 }));
      }
    } finally {
      swapping = false;
      await job;
    }
    expect((await readdir(top)).filter((n) => n.startsWith('raced'))).toEqual([]);
    expect((await stat(top)).mode & 0o777).toBe(0o700);
  });

  it('refuses a hard link to a file the slot does not own', async () => {
    await writeFile(join(top, 'secret.txt'), 'secret');
    await link(join(top, 'secret.txt'), join(dir, 'hard.txt'));
    expect(await statusOf(sftp.readFile('hard.txt'))).toBe(PERMISSION_DENIED);
    expect(await statusOf(sftp.setstat('hard.txt', { uid: SLOT.uid, gid: SLOT.gid }))).toBe(
      PERMISSION_DENIED,
    );
    expect((await stat(join(top, 'secret.txt'))).uid).toBe(0);
  });
});

describe.skipIf(process.platform !== 'linux')('SFTP without confinement', () => {
  it('takes absolute paths as they are, with the backing process uid', async () => {
    const top = await realpath(await mkdtemp(join(tmpdir(), 'sftp-plain-')));
    const dir = join(top, 'slot');
    await mkdir(dir);
    await writeFile(join(top, 'outside.txt'), 'outside');
    const s = await session(dir);
    try {
      const readFileP = promisify(s.sftp.readFile.bind(s.sftp)) as (path: string) => Promise<Buffer>;
      const writeFileP = promisify(s.sftp.writeFile.bind(s.sftp)) as (p: string, d: string) => Promise<void>;
      const realpathP = promisify(s.sftp.realpath.bind(s.sftp));
      expect((await readFileP(join(top, 'outside.txt'))).toString()).toBe('outside');
      expect((await readFileP('../outside.txt')).toString()).toBe('outside');
      await writeFileP('../written.txt', 'w');
      expect((await stat(join(top, 'written.txt'))).uid).toBe(process.getuid?.());
      expect(await realpathP('.')).toBe(dir);
      expect(await realpathP('..')).toBe(top);
    } finally {
      await s.close();
      await rm(top, { recursive: true, force: true });
    }
  });
});
