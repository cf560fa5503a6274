/**
 * A small seeded PRNG for the chaos suite (mulberry32): the same seed gives the same sequence of
 * choices. Independent streams (`fork`) keep one kind of choice from shifting another's sequence.
 */
export class Random {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** A uniform float in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** A uniform integer in [lo, hi] (both included). */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error('pick from an empty list');
    return items[Math.floor(this.next() * items.length)] as T;
  }

  /** A new stream derived from this seed and a name; does not advance this one. */
  fork(name: string): Random {
    let h = this.state ^ 0x9e3779b9;
    for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193);
    return new Random(h >>> 0);
  }
}

/** A seed from CHAOS_SEED (a number, or any string, hashed), else a fresh one. */
export function parseSeed(text: string | undefined): number {
  if (text === undefined || text.trim() === '') return Math.floor(Math.random() * 2 ** 31);
  const trimmed = text.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) >>> 0;
  let h = 0x811c9dc5;
  for (let i = 0; i < trimmed.length; i++) h = Math.imul(h ^ trimmed.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
