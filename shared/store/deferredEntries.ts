import { ConditionalCheckFailedException } from '@aws-sdk/client-dynamodb';

type Key = { readonly pk: string; readonly sk: string };
/** An ended operation's entry, as the counter holds it (capacityReads.ts `Pending`, less its time). */
type Ended = { readonly op: 'reserve' | 'release'; readonly owner: string };

/** What a counter write adds to remove deferred entries: a REMOVE clause and its conditions. */
export interface Removals {
  readonly remove: string;
  readonly conditions: string[];
  readonly names: Record<string, string>;
  readonly values: Record<string, unknown>;
}

const NONE: Removals = { remove: '', conditions: [], names: {}, values: {} };

/**
 * A capacity set's pending entries whose operation ended (a reserve's place counted, a release's place
 * deleted), whose removal goes with this instance's next count-up or count-down of the set instead of a
 * write of its own (issue 26: one counter write per allocation and per release, not two). Until then the
 * member is in the state a crash after that step leaves (counted/reserve: 1; none/release: 0), which
 * every step handles: a count-down takes a reserve entry over, a reserve clears a finished release's
 * entry, and recover ends what is left after the slot lease. Bounded by this instance's operations in
 * flight, not by the set; lost with the instance, which costs nothing but the entries' bytes until then.
 */
export class DeferredEntries {
  private readonly ended = new Map<string, Map<string, Ended>>();

  add(key: Key, members: readonly string[], entry: Ended): void {
    if (members.length === 0) return;
    const id = idOf(key);
    const set = this.ended.get(id) ?? new Map<string, Ended>();
    for (const m of members) set.set(m, entry);
    this.ended.set(id, set);
  }

  /**
   * Sends a counter write (built by `write` with the extra parts) that also removes the set's deferred
   * entries, each conditioned on still being the entry that ended (its op and owner) or gone already.
   * Members the write itself sets are left out (and forgotten: the write decides their entry). When the
   * write is refused, it is sent again without them (forgotten too: another writer changed an entry, or
   * the write's own condition failed; recover ends what is left), so its answer is its own.
   */
  async sendWith(
    key: Key,
    members: readonly string[],
    write: (extra: Removals) => Promise<void>,
  ): Promise<void> {
    const id = idOf(key);
    const ended = this.ended.get(id);
    this.ended.delete(id);
    for (const m of members) ended?.delete(m);
    if (!ended || ended.size === 0) return write(NONE);
    const names: Record<string, string> = { '#dpending': 'pending', '#dop': 'op', '#downer': 'owner' };
    const values: Record<string, unknown> = {};
    const paths: string[] = [];
    const conditions: string[] = [];
    [...ended].forEach(([m, e], i) => {
      const path = `#dpending.#d${i}`;
      names[`#d${i}`] = m;
      values[`:dop${i}`] = e.op;
      values[`:downer${i}`] = e.owner;
      paths.push(path);
      conditions.push(
        `(attribute_not_exists(${path}) OR (${path}.#dop = :dop${i} AND ${path}.#downer = :downer${i}))`,
      );
    });
    try {
      await write({ remove: ` REMOVE ${paths.join(', ')}`, conditions, names, values });
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      await write(NONE);
    }
  }
}

const idOf = (key: Key) => `${key.pk}\n${key.sk}`;
