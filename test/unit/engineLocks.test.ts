import { describe, expect, it } from 'vitest';
import { EngineLocks, GroupLock, ReadWriteLock } from '../../shared/runtime/engineLocks.ts';

/** A task that records when it starts and ends, and ends when released. */
function task(log: string[], name: string) {
  let release = () => {};
  const done = new Promise<void>((r) => {
    release = r;
  });
  return {
    run: async () => {
      log.push(`${name} in`);
      await done;
      log.push(`${name} out`);
    },
    release: () => release(),
  };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('the locks of a local engine', () => {
  it('run transactions on different items side by side, and on one item one after the other', async () => {
    const locks = new EngineLocks();
    const log: string[] = [];
    const a = task(log, 'a');
    const b = task(log, 'b');
    const c = task(log, 'c');
    const ra = locks.transaction(['x', 'y'], a.run);
    const rb = locks.transaction(['z'], b.run);
    const rc = locks.transaction(['y'], c.run);
    await tick();
    expect(log).toEqual(['a in', 'b in']); // c shares y with a: it waits
    a.release();
    await ra;
    await tick();
    expect(log).toContain('c in');
    b.release();
    c.release();
    await Promise.all([rb, rc]);
  });

  it('keep a single-item request off an item a transaction holds, not off others', async () => {
    const locks = new EngineLocks();
    const log: string[] = [];
    const t = task(log, 't');
    const held = locks.transaction(['x'], t.run);
    const other = locks.item('y', async () => void log.push('y'));
    const same = locks.item('x', async () => void log.push('x'));
    await other;
    await tick();
    expect(log).toEqual(['t in', 'y']);
    t.release();
    await Promise.all([held, same]);
    expect(log).toEqual(['t in', 'y', 't out', 'x']);
  });

  it('never run a read of many items beside a transaction (it would see one half-applied)', async () => {
    const locks = new EngineLocks();
    const log: string[] = [];
    const t = task(log, 't');
    const q = task(log, 'q');
    const held = locks.transaction(['x'], t.run);
    const query = locks.manyItems(q.run);
    const second = locks.manyItems(async () => void log.push('q2'));
    await tick();
    expect(log).toEqual(['t in']);
    t.release();
    await held;
    await tick();
    // Both reads run together once the transaction is out.
    expect(log).toEqual(['t in', 't out', 'q in', 'q2']);
    q.release();
    await Promise.all([query, second]);
  });

  it('forget the lock of an item nobody uses', async () => {
    const locks = new EngineLocks();
    for (let i = 0; i < 1000; i++) await locks.item(`item-${i}`, async () => undefined);
    expect((locks as unknown as { items: Map<string, unknown> }).items.size).toBe(0);
  });
});

describe('a group lock', () => {
  it('lets one class in at a time, first come first served, so neither starves', async () => {
    const lock = new GroupLock();
    const log: string[] = [];
    const a1 = task(log, 'a1');
    const r1 = lock.run('a', a1.run);
    const rb = lock.run('b', async () => void log.push('b'));
    const r2 = lock.run('a', async () => void log.push('a2')); // behind b, though a holds the lock
    await tick();
    expect(log).toEqual(['a1 in']);
    a1.release();
    await Promise.all([r1, rb, r2]);
    expect(log).toEqual(['a1 in', 'a1 out', 'b', 'a2']);
  });
});

describe('a readers-writer lock', () => {
  it('lets readers in together and a writer alone, readers after a waiting writer behind it', async () => {
    const lock = new ReadWriteLock();
    const log: string[] = [];
    const r1 = task(log, 'r1');
    const first = lock.read(r1.run);
    const writer = lock.write(async () => void log.push('w'));
    const late = lock.read(async () => void log.push('r2'));
    await tick();
    expect(log).toEqual(['r1 in']);
    r1.release();
    await Promise.all([first, writer, late]);
    expect(log).toEqual(['r1 in', 'r1 out', 'w', 'r2']);
  });
});
