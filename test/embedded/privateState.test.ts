import { chmod, lstat, mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { smallOnLarge } from '../../testkit/configs.ts';

/** Every path under `dir` whose mode lets its group or others in, with the mode. */
async function looseModes(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (path: string): Promise<void> => {
    // The running pool writes some files atomically (a temporary renamed over the file): one listed a
    // moment ago may be gone when it is looked at (seen in CI: `<id>.live.<pid>.tmp`); the rest is checked.
    const stat = await lstat(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return undefined;
      throw err;
    });
    if (!stat || stat.isSymbolicLink()) return;
    if ((stat.mode & 0o077) !== 0)
      out.push(`${relative(dir, path) || '.'} ${(stat.mode & 0o777).toString(8)}`);
    if (stat.isDirectory()) for (const e of await readdir(path)) await walk(join(path, e));
  };
  await walk(dir);
  return out;
}

async function countFiles(dir: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(dir, { withFileTypes: true })) {
    n += e.isDirectory() ? await countFiles(join(dir, e.name)) : 1;
  }
  return n;
}

const yaml = smallOnLarge();

describe.runIf(process.platform !== 'win32')('state files', () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it('are readable by their owner only: the dir 0700, the table, dev.json, events, records and keys 0600', async () => {
    const parent = await mkdtemp(join(tmpdir(), 'metastatic-modes-'));
    dirs.push(parent);
    const stateDir = join(parent, 'state');
    // An existing state dir made before, world-readable, with a world-readable file in it: tightened.
    await mkdir(stateDir, { mode: 0o755 });
    await chmod(stateDir, 0o755);
    await writeFile(join(stateDir, 'old.json'), '{}', { mode: 0o644 });
    await chmod(join(stateDir, 'old.json'), 0o644);
    const umask = process.umask();

    const stack = await EmbeddedPool.start({
      config: parseConfigOrThrow(yaml, 'modes.yaml'),
      stateDir,
      reaperInterval: 3600,
      log: silentLog,
    });
    try {
      await stack.sqs.send(
        new SendMessageCommand({
          QueueUrl: stack.info.requestQueueUrl,
          MessageBody: JSON.stringify({ kind: 'request', id: 'modes-1', labels: ['small'] }),
        }),
      );
      const deadline = Date.now() + 45_000;
      while ((await stack.context.store.getRequest('modes-1'))?.state !== 'fulfilled') {
        if (Date.now() > deadline) throw new Error('request not fulfilled in 45 s');
        await new Promise((r) => setTimeout(r, 100));
      }
      // While it runs: dev.json, the LevelDB files, the backing node's record and host key exist.
      expect(await looseModes(stateDir)).toEqual([]);
    } finally {
      await stack.stop();
    }
    expect(await looseModes(stateDir)).toEqual([]);
    expect(await countFiles(stateDir)).toBeGreaterThan(5);
    // The umask held while the stack ran is given back.
    expect(process.umask()).toBe(umask);
  });
});
