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
