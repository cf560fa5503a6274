import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { formatLiveSlots } from '../../shared/providers/local/liveSlots.ts';
import { type Login, Slots } from '../../shared/providers/local/nodeSlots.ts';

/**
 * A backing node's view of its live slots (nodeSlots.ts): only a file that says which slots are live may
 * end a login or clear a slot's directory. A file that cannot be read (too many open files under a
 * connection flood, a directory in its place) or that is not a live-slots file says nothing, and changes
 * nothing.
 */
describe('a backing node reading its live slots', () => {
  let dir: string;
  let liveFile: string;
  let workDir: string;
  let slots: Slots;
  let ended: string[];

  const login = (slot: number, nodeId: string): Login => ({
    slot,
    nodeId,
    dir: join(workDir, `slot${slot}`),
    home: join(workDir, `slot${slot}`),
    groups: new Set(),
    end: () => ended.push(nodeId),
  });

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'metastatic-slots-'));
    liveFile = join(dir, 'node.live');
    workDir = join(dir, 'node.work');
    slots = new Slots(liveFile, workDir);
    ended = [];
    await writeFile(liveFile, formatLiveSlots({ 0: 'n-0', 1: 'n-1' }));
    await slots.reload();
    await slots.dirOf(0);
    await writeFile(join(workDir, 'slot0', 'job-output'), 'kept');
    slots.logins.add(login(0, 'n-0'));
    slots.logins.add(login(1, 'n-1'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('keeps every login and directory when the file cannot be read', async () => {
    // EISDIR stands for every read error but ENOENT (EMFILE, EACCES, EIO): the state is unknown, not empty.
    await rm(liveFile);
    await mkdir(liveFile);
    await slots.reload();
    expect(ended).toEqual([]);
    expect(slots.nodeOn(0)).toBe('n-0');
    expect(await readdir(join(workDir, 'slot0'))).toContain('job-output');
  });

  it('keeps every login and directory when the file is not a live-slots file', async () => {
    await writeFile(liveFile, '{"slots": ');
    await slots.reload();
    await writeFile(liveFile, '[1, 2]');
    await slots.reload();
    expect(ended).toEqual([]);
    expect(slots.nodeOn(1)).toBe('n-1');
  });

  it('ends the logins of a slot the file no longer names, and only those', async () => {
    await writeFile(liveFile, formatLiveSlots({ 1: 'n-1' }));
    await slots.reload();
    expect(ended).toEqual(['n-0']);
    expect(slots.nodeOn(0)).toBeUndefined();
    expect(await readdir(workDir)).not.toContain('slot0');
  });

  it('takes a removed file for no live slot (the pool removes it with the backing node)', async () => {
    await rm(liveFile);
    await slots.reload();
    expect(ended.sort()).toEqual(['n-0', 'n-1']);
  });
});
