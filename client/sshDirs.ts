import { lstat, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * The private temporary directories `runSsh` writes a call's known_hosts into:
 * `<tmpdir>/metastatic-ssh-<pid>-XXXXXX`, named after the process that made it. A process killed with
 * kill -9 cannot remove its own; the next one that logs in to a node does (removeStaleSshDirs).
 */
const PREFIX = 'metastatic-ssh-';
const NAME = /^metastatic-ssh-(\d{1,10})-[A-Za-z0-9]{6}$/;

/** How old a dead process's directory must be before it is removed (see removeStaleSshDirs). */
const STALE_AFTER_MS = 10 * 60_000;

/** A new private directory (0700) for one ssh call, named after this process. */
export function makeSshDir(): Promise<string> {
  return mkdtemp(join(tmpdir(), `${PREFIX}${process.pid}-`));
}

/**
 * Removes the ssh directories left by processes that died without removing theirs, and returns them:
 * only a real directory (not a link) owned by this user, named after a pid no process has now, last
 * written more than `minAgeMs` ago (a process of another pid namespace sharing /tmp looks dead from here:
 * its directory is left while it may still be in use). Never someone else's; errors are ignored, as
 * another process may be removing the same directory.
 */
export async function removeStaleSshDirs(
  opts: { readonly dir?: string; readonly minAgeMs?: number } = {},
): Promise<string[]> {
  const uid = process.getuid?.();
  if (uid === undefined) return [];
  const dir = opts.dir ?? tmpdir();
  const oldest = Date.now() - (opts.minAgeMs ?? STALE_AFTER_MS);
  const removed: string[] = [];
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const pid = Number(NAME.exec(name)?.[1] ?? Number.NaN);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || alive(pid)) continue;
    const path = join(dir, name);
    const s = await lstat(path).catch(() => undefined);
    if (!s?.isDirectory() || s.uid !== uid || s.mtimeMs > oldest) continue;
    try {
      await rm(path, { recursive: true, force: true });
      removed.push(path);
    } catch {
      // gone meanwhile, or not ours to remove after all
    }
  }
  return removed;
}

/** The temporary directories this process has swept, by path: one sweep each is enough. */
const swept = new Map<string, Promise<unknown>>();

/** removeStaleSshDirs in the temporary directory, once per process (runSsh runs many times in a `run`). */
export function sweepStaleSshDirsOnce(): Promise<unknown> {
  const dir = tmpdir();
  let sweep = swept.get(dir);
  if (!sweep) {
    sweep = removeStaleSshDirs({ dir }).catch(() => []);
    swept.set(dir, sweep);
  }
  return sweep;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
