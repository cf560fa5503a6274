/**
 * A binary min-heap of timed events, ordered by (time, rank, insertion order): the simulators take
 * events from it in a deterministic order, so a run is the same every time.
 */
export interface Timed<T> {
  readonly at: number;
  readonly rank: number;
  readonly seq: number;
  readonly event: T;
}

export class EventQueue<T> {
  private readonly heap: Timed<T>[] = [];
  private seq = 0;

  constructor(private readonly rankOf: (event: T) => number) {}

  get size(): number {
    return this.heap.length;
  }

  push(at: number, event: T): void {
    const h = this.heap;
    h.push({ at, rank: this.rankOf(event), seq: this.seq++, event });
    let i = h.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!before(h[i] as Timed<T>, h[parent] as Timed<T>)) break;
      [h[i], h[parent]] = [h[parent] as Timed<T>, h[i] as Timed<T>];
      i = parent;
    }
  }

  pop(): Timed<T> | undefined {
    const h = this.heap;
    const top = h[0];
    const last = h.pop();
    if (h.length > 0 && last) {
      h[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < h.length && before(h[l] as Timed<T>, h[m] as Timed<T>)) m = l;
        if (r < h.length && before(h[r] as Timed<T>, h[m] as Timed<T>)) m = r;
        if (m === i) break;
        [h[i], h[m]] = [h[m] as Timed<T>, h[i] as Timed<T>];
        i = m;
      }
    }
    return top;
  }
}

function before<T>(a: Timed<T>, b: Timed<T>): boolean {
  return (a.at - b.at || a.rank - b.rank || a.seq - b.seq) < 0;
}
