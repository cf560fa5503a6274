import type { BackingRecord } from './records.ts';

/**
 * Claimants placing nodes of one (pool, label) at the same time in one process (the embedded pool's
 * consumer, one Lambda invocation's batch): each holds a ticket, the lowest number no other one holds. A
 * claimant alone holds ticket 0. Concurrent claimants read the same candidates (fullest first) and,
 * aiming all at the fullest, all but a few would lose their claim; with tickets they aim at different
 * free slots of the fullest few (ticketTarget). Deliveries in other processes are not seen: they still
 * meet at the fullest, and spread after a loss.
 */
export class Claimants {
  private readonly held = new Map<string, Set<number>>();

  /** A ticket for a claimant of `key` (pool and label): the lowest number not held. */
  take(key: string): number {
    let tickets = this.held.get(key);
    if (!tickets) {
      tickets = new Set();
      this.held.set(key, tickets);
    }
    let t = 0;
    while (tickets.has(t)) t++;
    tickets.add(t);
    return t;
  }

  /** Runs `work` holding a ticket for `key`, given back when it ends. */
  async during<T>(key: string, work: (ticket: number) => Promise<T>): Promise<T> {
    const ticket = this.take(key);
    try {
      return await work(ticket);
    } finally {
      this.give(key, ticket);
    }
  }

  give(key: string, ticket: number): void {
    const tickets = this.held.get(key);
    tickets?.delete(ticket);
    if (tickets?.size === 0) this.held.delete(key);
  }
}

/**
 * Where the claimant holding `ticket` aims first among `candidates` (in the order they are tried,
 * fullest first): their free slots numbered one after the other, ticket t takes the t-th (modulo all of
 * them; a candidate that cannot take a node has none). Concurrent claimants of one process thus take
 * the slots a sequence of lone claimants would have taken, one each, instead of all aiming at the first
 * candidate. Undefined for ticket 0 (a claimant alone keeps the usual order and slot choice) or when no
 * candidate has a free slot.
 */
export function ticketTarget(
  candidates: readonly BackingRecord[],
  ticket: number,
  claimable: (b: BackingRecord) => boolean,
): { readonly index: number; readonly slot: number } | undefined {
  if (ticket === 0) return undefined;
  const free = candidates.map((b) => (claimable(b) ? freeSlots(b) : []));
  const total = free.reduce((n, f) => n + f.length, 0);
  if (total === 0) return undefined;
  let t = ticket % total;
  for (const [index, slots] of free.entries()) {
    const slot = slots[t];
    if (slot !== undefined) return { index, slot };
    t -= slots.length;
  }
  return undefined;
}

function freeSlots(b: Pick<BackingRecord, 'slots' | 'slotMap'>): number[] {
  const out: number[] = [];
  for (let i = 0; i < b.slots; i++) if (b.slotMap[String(i)] === undefined) out.push(i);
  return out;
}
