import { chmod, lstat, mkdir, readdir } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * The embedded pool's state dir holds the table (LevelDB), the queue endpoints (dev.json), pool events
 * and the local backing nodes' records and private host keys: readable by its owner only. The dir is
 * made (or tightened) 0700 and what is in it 0600 / 0700.
 */
export async function makePrivateDir(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await tighten(dir);
}

async function tighten(path: string): Promise<void> {
  const stat = await lstat(path);
  if (stat.isSymbolicLink()) return; // chmod would follow it out of the state dir
  if ((stat.mode & 0o077) !== 0) await chmod(path, stat.mode & 0o700);
  if (!stat.isDirectory()) return;
  for (const entry of await readdir(path)) await tighten(join(path, entry));
}

let holders = 0;
let saved: number | undefined;

/**
 * While a stack runs, files this process (and the backing processes it starts) creates are private:
 * LevelDB creates its files itself, with the process's umask, so an explicit mode per file cannot cover
 * them. Counted, so stacks that overlap in one process (tests) restore the umask only when the last stops.
 * Returns the release function.
 */
export function holdPrivateUmask(): () => void {
  if (holders === 0) saved = process.umask(0o077);
  holders++;
  let released = false;
  return () => {
    if (released) return;
    released = true;
    holders--;
    if (holders === 0 && saved !== undefined) {
      process.umask(saved);
      saved = undefined;
    }
  };
}
