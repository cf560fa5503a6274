/**
 * The locks that give a local engine (dynalite) DynamoDB's isolation for transactions
 * (localTransactions.ts), one set per engine:
 * - each item has a readers-writer lock: a single-item request takes it shared (the engine orders those),
 *   a transaction takes each of its items' exclusively, in one order (no two transactions wait on each
 *   other in a circle);
 * - a gate between transactions and the reads of many items (Query, Scan, BatchGetItem): any number of
 *   either at once, never both, so such a read sees no transaction half-applied (DynamoDB's are
 *   read-committed) and transactions on other items run beside each other.
 */
/**
 * A readers-writer lock, writers first: a writer waits for the readers in, and readers arriving after
 * a waiting writer wait for it (a stream of reads never starves a transaction).
 */
export class ReadWriteLock {
  private readers = 0;
  private writing = false;
  private readonly queue: Array<{ readonly writer: boolean; readonly go: () => void }> = [];

  async read<T>(fn: () => Promise<T>): Promise<T> {
    if (this.writing || this.queue.length > 0) await this.wait(false);
    else this.readers++;
    try {
      return await fn();
    } finally {
      this.readers--;
      this.next();
    }
  }

  async write<T>(fn: () => Promise<T>): Promise<T> {
    if (this.writing || this.readers > 0 || this.queue.length > 0) await this.wait(true);
    else this.writing = true;
    try {
      return await fn();
    } finally {
      this.writing = false;
      this.next();
    }
  }

  private wait(writer: boolean): Promise<void> {
    return new Promise((go) => this.queue.push({ writer, go }));
  }

  /** Lets in the next writer once no one is in, or every reader queued before the next writer. */
  private next(): void {
    if (this.writing) return;
    const head = this.queue[0];
    if (!head) return;
    if (head.writer) {
      if (this.readers > 0) return;
      this.queue.shift();
      this.writing = true;
      head.go();
      return;
    }
    while (this.queue[0] && !this.queue[0].writer) {
      this.readers++;
      (this.queue.shift() as { go: () => void }).go();
    }
  }
}

/**
 * A lock of two or more classes: holders of one class share it, a class waits for the other's holders to
 * leave; first come, first served between classes (a stream of one class never starves the other).
 */
export class GroupLock {
  private holding: string | undefined;
  private count = 0;
  private readonly queue: Array<{ readonly group: string; readonly go: () => void }> = [];

  async run<T>(group: string, fn: () => Promise<T>): Promise<T> {
    if ((this.count === 0 || this.holding === group) && this.queue.length === 0) {
      this.holding = group;
      this.count++;
    } else {
      await new Promise<void>((go) => this.queue.push({ group, go }));
    }
    try {
      return await fn();
    } finally {
      this.count--;
      this.next();
    }
  }

  /** Once no one holds it: lets in every waiter of the class at the head of the queue, in a row. */
  private next(): void {
    if (this.count > 0) return;
    this.holding = this.queue[0]?.group;
    while (this.queue[0] && this.queue[0].group === this.holding) {
      this.count++;
      (this.queue.shift() as { go: () => void }).go();
    }
  }
}

/** The locks of one engine. */
export class EngineLocks {
  private readonly items = new Map<string, { lock: ReadWriteLock; users: number }>();
  private readonly gate = new GroupLock();

  /** A single-item request on item `id`. */
  item<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.withItems([id], 'read', fn);
  }

  /** A write of several items, each on its own (BatchWriteItem). */
  itemsApart<T>(ids: readonly string[], fn: () => Promise<T>): Promise<T> {
    return this.withItems(ids, 'read', fn);
  }

  /** A read of many items (Query, Scan, BatchGetItem): never beside a transaction. */
  manyItems<T>(fn: () => Promise<T>): Promise<T> {
    return this.gate.run('reads', fn);
  }

  /** A transaction on items `ids`: alone on each of them, never beside a read of many items. */
  transaction<T>(ids: readonly string[], fn: () => Promise<T>): Promise<T> {
    return this.gate.run('transactions', () => this.withItems(ids, 'write', fn));
  }

  /** A recovery of what a crash left: beside no transaction and no read of many items. */
  recovery<T>(fn: () => Promise<T>): Promise<T> {
    return this.gate.run('recovery', fn);
  }

  private async withItems<T>(
    ids: readonly string[],
    mode: 'read' | 'write',
    fn: () => Promise<T>,
  ): Promise<T> {
    const sorted = [...new Set(ids)].sort();
    const entries = sorted.map((id) => {
      let entry = this.items.get(id);
      if (!entry) {
        entry = { lock: new ReadWriteLock(), users: 0 };
        this.items.set(id, entry);
      }
      entry.users++;
      return [id, entry] as const;
    });
    const hold = (i: number): Promise<T> => {
      const entry = entries[i];
      if (!entry) return fn();
      const next = () => hold(i + 1);
      return mode === 'read' ? entry[1].lock.read(next) : entry[1].lock.write(next);
    };
    try {
      return await hold(0);
    } finally {
      for (const [id, entry] of entries) if (--entry.users === 0) this.items.delete(id);
    }
  }
}
