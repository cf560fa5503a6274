import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { DynamoDBDocumentClient, PutCommand } from '@aws-sdk/lib-dynamodb';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_SERVERS } from '../../shared/config/fields.ts';
import { nodeId, ownerSince, ownerToken } from '../../shared/core/ids.ts';
import { ensureTable, localEngineClientConfig, startDynalite } from '../../shared/runtime/engines.ts';
import { countIdOf, type Pending } from '../../shared/store/capacityReads.ts';
import type { CapacitySets, CapacityStep } from '../../shared/store/capacitySets.ts';
import { CapacitySteps } from '../../shared/store/capacitySteps.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { keys } from '../../shared/store/table.ts';
import { holdPlaces } from '../../testkit/heldPlaces.ts';
import { consumedUnits, whileWatching } from '../../testkit/sdkWatch.ts';

/**
 * Capacity sets whose cost does not grow with the fleet (issue 12), on dynalite: a counter item and one
 * small place item per held member. What is checked: the cap is never exceeded, under concurrency too;
 * a crash after any step of a reserve or a release leaves the count exact, and `recover` finishes what
 * was left part-way; a reserve and a release cost the same write units with 20 or 5,000 places held;
 * and the largest pool the configuration admits (max-servers MAX_SERVERS) is exact at its limit.
 */
let engine: Awaited<ReturnType<typeof startDynalite>>;
let client: DynamoDBClient;
let store: DynamoStore;
let sets: CapacitySets;
let doc: DynamoDBDocumentClient;

/** The longest node id a request can have (requestIdPattern: 128 characters; index up to 4 digits). */
const longest = (i: number) => nodeId(`${'r'.repeat(120)}${String(i).padStart(8, '0')}`, 9000 + (i % 1000));
const owner = (at: number, n: number) => ownerToken(at, { messageId: `m-${n}`, receiveCount: 9 });

beforeAll(async () => {
  engine = await startDynalite();
  client = new DynamoDBClient(localEngineClientConfig(engine.endpoint, 'eu-west-1'));
  await ensureTable(client, 'scale');
  store = new DynamoStore(client, 'scale');
  doc = DynamoDBDocumentClient.from(client);
  sets = store.capacity;
});
afterAll(async () => {
  client?.destroy();
  await engine?.close();
});

/** Runs `work` with the operation crashing right after `step` took effect for `member`. */
async function crashAfter(step: CapacityStep, work: () => Promise<unknown>): Promise<void> {
  sets.afterStep = (s) => {
    if (s === step) throw new Error(`crashed after ${step}`);
  };
  try {
    await expect(work()).rejects.toThrow(`crashed after ${step}`);
  } finally {
    sets.afterStep = undefined;
  }
}

describe('a crash after any step', () => {
  // A reserve's last step, its entry's removal, goes with the next counter write (issue 26), as does a
  // release's: their crash is that of the step before ("place counted", "place deleted").
  const reserveSteps: CapacityStep[] = ['place created', 'counted up', 'place counted'];
  const releaseSteps: CapacityStep[] = ['place releasing', 'counted down', 'place deleted'];

  it.each(reserveSteps)(
    'of a reserve (after "%s") leaves the count exact, and recover finishes it',
    async (step) => {
      const set = keys.poolNodes(`crash/reserve/${step}`);
      expect(await sets.reserve(set, ['held/0'], 3, 'a')).toEqual({ kind: 'reserved' });
      await crashAfter(step, () => sets.reserve(set, ['r/0', 'r/1'], 3, 'dead'));
      // Counted up or not: never more than the cap, and a third member fits only if the crash came first.
      const counted = step === 'place created' ? 1 : 3;
      expect(await sets.used(set)).toBe(counted);
      // The places that count, by the protocol's table, are what the counter counts (a place created and
      // never counted up is in the set, holding nothing).
      expect((await sets.audit(set)).counting).toBe(counted);
      expect(await sets.reserve(set, ['late/0'], 3, 'b')).toEqual({
        kind: counted === 3 ? 'full' : 'reserved',
      });
      // The dead delivery's redelivery takes its places over and finishes the reservation...
      if (counted === 3) {
        for (const m of ['r/0', 'r/1'])
          expect(await sets.takeOverReservation(set, m, 'dead', 'redelivery')).toBe(true);
        expect(await sets.reserve(set, ['r/0', 'r/1'], 3, 'redelivery')).toEqual({ kind: 'reserved' });
        expect(await sets.used(set)).toBe(3);
      }
      // ...or, had it not come, the reaper's recover does: the leftovers are gone, the count unchanged.
      expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBeGreaterThanOrEqual(0);
      const members = await sets.members(set);
      expect(await sets.used(set)).toBe(members.size);
      expect(members.size).toBe(counted === 3 ? 3 : 2);
    },
  );

  it.each(releaseSteps)(
    'of a release (after "%s") leaves the count exact, and recover finishes it',
    async (step) => {
      const set = keys.poolNodes(`crash/release/${step}`);
      expect(await sets.reserve(set, ['n/0', 'n/1'], 2, 'a')).toEqual({ kind: 'reserved' });
      await crashAfter(step, () => sets.unreserve(set, ['n/0']));
      // Counted down from the second step on: room for one more exactly then.
      const down = step !== 'place releasing';
      expect(await sets.used(set)).toBe(down ? 1 : 2);
      expect((await sets.audit(set)).counting).toBe(down ? 1 : 2);
      // A redelivered release leaves a release in flight to its releaser: never counted down twice.
      await sets.unreserve(set, ['n/0']);
      expect(await sets.used(set)).toBe(down ? 1 : 2);
      // The releaser is dead: the reaper's recover carries the release to its end.
      await sets.recover(set, Number.POSITIVE_INFINITY);
      expect(await sets.used(set)).toBe(1);
      expect([...(await sets.members(set))]).toEqual(['n/1']);
      expect(await sets.reserve(set, ['m/0'], 2, 'b')).toEqual({ kind: 'reserved' });
      expect(await sets.reserve(set, ['m/1'], 2, 'b')).toEqual({ kind: 'full' });
    },
  );

  it('of nothing, but a superseded delivery finishing its reserve after a takeover, counts once', async () => {
    const set = keys.poolNodes('takeover/finish');
    await crashAfter('counted up', () => sets.reserve(set, ['t/0'], 5, 'A'));
    // A later receive of the message supersedes A and takes the place over at once...
    expect(await sets.takeOverReservation(set, 't/0', 'A', 'B')).toBe(true);
    // ...while A still runs and finishes its reserve (the step a crash stopped above): the place is B's
    // now, so A must leave the counted-up entry to B, or B would count the place a second time.
    await new CapacitySteps(DynamoDBDocumentClient.from(client), 'scale', Date.now).finishReserve(
      set,
      't/0',
      'A',
    );
    expect(await sets.reserve(set, ['t/0'], 5, 'B')).toEqual({ kind: 'reserved' });
    expect(await sets.used(set)).toBe(1);
    await sets.unreserve(set, ['t/0']);
    expect(await sets.used(set)).toBe(0);
  });

  it.each(['counted down', 'place deleted'] as const)(
    'of the release of a whole set (after "%s" of its first member) leaves the count exact, and recover finishes it',
    async (step) => {
      const set = keys.poolNodes(`crash/release-set/${step}`);
      await sets.reserve(set, ['s/0', 's/1', 's/2'], 3, 'a');
      await crashAfter(step, () => sets.unreserve(set, ['s/0', 's/1', 's/2']));
      // The set is counted down in one write: all of it or none of it.
      expect(await sets.used(set)).toBe(0);
      await sets.unreserve(set, ['s/0', 's/1', 's/2']); // a redelivered release: nothing counted twice
      expect(await sets.used(set)).toBe(0);
      expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBeGreaterThan(0);
      expect(await sets.used(set)).toBe(0);
      expect((await sets.members(set)).size).toBe(0);
      expect(await sets.reserve(set, ['t/0', 't/1', 't/2'], 3, 'b')).toEqual({ kind: 'reserved' });
    },
  );

  it('of a release that no one redelivers is finished by recover alone', async () => {
    const set = keys.poolNodes('crash/release/alone');
    await sets.reserve(set, ['n/0'], 1, 'a');
    await crashAfter('counted down', () => sets.unreserve(set, ['n/0']));
    expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBe(1);
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
  });
});

describe('entries left for the next counter write (issue 26)', () => {
  it('keep the count exact when another instance, which does not know them, works the same members', async () => {
    const set = keys.poolNodes('deferred/instances');
    // Two request functions' stores (two Lambda containers): each knows only its own deferred entries.
    const a = new DynamoStore(client, 'scale').capacity;
    const b = new DynamoStore(client, 'scale').capacity;
    const pending = async () => (await new CapacitySteps(doc, 'scale', Date.now).counter(set)).pending;
    expect(await a.reserve(set, ['m/0'], 2, 'A')).toEqual({ kind: 'reserved' });
    expect((await pending())['m/0']?.op).toBe('reserve');
    // B releases A's member: its count-down takes A's reserve entry over (counted once, down once).
    await b.unreserve(set, ['m/0']);
    expect(await b.used(set)).toBe(0);
    expect((await pending())['m/0']?.op).toBe('release');
    // A's next write would remove its reserve entry, which is B's release entry now: refused, sent
    // without it; the count is the write's own.
    expect(await a.reserve(set, ['m/1'], 2, 'A')).toEqual({ kind: 'reserved' });
    expect(await a.used(set)).toBe(1);
    expect((await pending())['m/0']?.op).toBe('release');
    // A member given back and taken again at once by another instance (a request's redelivery): the
    // release entry B left is cleared by the reserve, not waited for.
    expect(await a.reserve(set, ['m/0'], 2, 'C')).toEqual({ kind: 'reserved' });
    expect(await a.used(set)).toBe(2);
    expect(await a.reserve(set, ['m/2'], 2, 'C')).toEqual({ kind: 'full' });
    // B's next write would remove its release entry, now C's reserve entry: refused, sent without it.
    await b.unreserve(set, ['m/1']);
    expect(await b.used(set)).toBe(1);
    await a.unreserve(set, ['m/0']);
    expect(await a.used(set)).toBe(0);
    expect((await a.members(set)).size).toBe(0);
    await a.recover(set, Number.POSITIVE_INFINITY);
    expect(await a.used(set)).toBe(0);
    expect(await pending()).toEqual({});
  });
});

describe('an ended release whose entry is still there', () => {
  it('does not keep a later reserve of the member from dropping its uncounted place', async () => {
    const set = keys.poolNodes('deferred/dropped');
    const a = new DynamoStore(client, 'scale').capacity;
    const b = new DynamoStore(client, 'scale').capacity;
    const steps = new CapacitySteps(doc, 'scale', Date.now);
    expect(await a.reserve(set, ['m/0', 'x/0'], 2, 'A')).toEqual({ kind: 'reserved' });
    await a.unreserve(set, ['m/0']); // its release entry stays with A's next counter write
    expect((await steps.counter(set)).pending['m/0']?.op).toBe('release');
    // B asks for m/0 with x/0, which A holds: held, and the place B created for m/0 goes again.
    expect((await b.reserve(set, ['m/0', 'x/0'], 2, 'B')).kind).toBe('held');
    expect([...(await b.members(set))]).toEqual(['x/0']);
    // A place left uncounted beside such an entry (a crash after its creation) is dropped by recover,
    // never counted as if it were.
    b.afterStep = (step) => {
      if (step === 'place created') throw new Error('crashed after place created');
    };
    await expect(b.reserve(set, ['m/0'], 2, 'B')).rejects.toThrow('crashed after place created');
    b.afterStep = undefined;
    expect((await steps.place(set, 'm/0'))?.phase).toBe('counting');
    await b.recover(set, Number.POSITIVE_INFINITY);
    expect([...(await b.members(set))]).toEqual(['x/0']);
    expect(await b.used(set)).toBe(1);
    expect(await b.reserve(set, ['y/0'], 2, 'C')).toEqual({ kind: 'reserved' });
    expect(await b.reserve(set, ['z/0'], 2, 'C')).toEqual({ kind: 'full' });
  });
});

describe('a count-first reserve (issue 26: the request path, two writes a place)', () => {
  const first = { countFirst: true } as const;
  const steps = () => new CapacitySteps(doc, 'scale', Date.now);

  it('counts, then creates the place counted, naming its count-up; never a counting place', async () => {
    const set = keys.poolNodes('first/plain');
    const before: string[] = [];
    sets.afterStep = (step, m) => void before.push(`${step} ${m}`);
    try {
      expect(await sets.reserve(set, ['a/0', 'a/1'], 3, 'A', false, first)).toEqual({ kind: 'reserved' });
    } finally {
      sets.afterStep = undefined;
    }
    expect(before).toEqual(['counted up a/0', 'counted up a/1', 'place created a/0', 'place created a/1']);
    const entry = (await steps().counter(set)).pending['a/0'];
    expect(entry).toMatchObject({ op: 'reserve', owner: 'A', first: true });
    expect(await steps().place(set, 'a/0')).toMatchObject({
      phase: 'counted',
      countedBy: `A@${entry?.at}`,
    });
    expect(await sets.used(set)).toBe(2);
    // Full is full: refused by the count-up, and the place-first reserve answers (nothing left behind).
    expect(await sets.reserve(set, ['b/0', 'b/1'], 3, 'B', false, first)).toEqual({ kind: 'full' });
    expect([...(await sets.members(set))].sort()).toEqual(['a/0', 'a/1']);
    // A release takes the place's own entry over: counted down once.
    await sets.unreserve(set, ['a/0', 'a/1']);
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
  });

  it('crashed after its count-up: the count stays until recover undoes it (no place, nothing recorded)', async () => {
    const set = keys.poolNodes('first/crash');
    await crashAfter('counted up', () => sets.reserve(set, ['c/0'], 2, 'dead', false, first));
    expect(await sets.used(set)).toBe(1);
    expect((await sets.members(set)).size).toBe(0);
    // A young entry is its owner's: recover leaves it; a stale one goes with its count.
    expect(await sets.recover(set, 0)).toBe(0);
    expect(await sets.used(set)).toBe(1);
    expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBe(1);
    expect(await sets.used(set)).toBe(0);
    expect(await sets.reserve(set, ['c/0', 'd/0'], 2, 'B', false, first)).toEqual({ kind: 'reserved' });
  });

  it('finding the member placed already undoes its count at once and answers as the place-first reserve', async () => {
    const set = keys.poolNodes('first/held');
    expect(await sets.reserve(set, ['h/0'], 3, 'A')).toEqual({ kind: 'reserved' }); // place-first
    await sets.recover(set, Number.POSITIVE_INFINITY); // A's entry gone: the count-up below passes
    expect((await steps().counter(set)).pending).toEqual({});
    const result = await sets.reserve(set, ['h/0'], 3, 'B', false, first);
    expect(result.kind).toBe('held');
    expect(await sets.used(set)).toBe(1);
    expect((await steps().counter(set)).pending).toEqual({});
  });

  it("a stray count (its owner died before undoing it) is never taken for the place's own, and recover ends it", async () => {
    const set = keys.poolNodes('first/stray');
    expect(await sets.reserve(set, ['s/0'], 3, 'A')).toEqual({ kind: 'reserved' });
    await sets.recover(set, Number.POSITIVE_INFINITY);
    // B's count-first reserve counted s/0 up and died before it could undo it (its place was A's).
    expect(await steps().countUpFirst(set, ['s/0'], 3, 'B')).toBeDefined();
    expect(await sets.used(set)).toBe(2); // A's place, and B's stray count
    // Another reserve of the member sees an operation in flight, not a count of its own.
    expect((await sets.reserve(set, ['s/0'], 3, 'C')).kind).toBe('held');
    // A release of A's place counts down its place only, leaving the stray to recover.
    await sets.unreserve(set, ['s/0']);
    expect(await sets.used(set)).toBe(2);
    expect((await steps().place(set, 's/0'))?.phase).toBe('releasing');
    expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBe(2);
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
    expect((await steps().counter(set)).pending['s/0']?.op).not.toBe('reserve');
  });

  it("adopts a dead delivery's count-up cut before its place, once, and never one that ended meanwhile", async () => {
    const set = keys.poolNodes('first/adopted');
    // O counted a/0 up and died before it created the place.
    expect(await steps().countUpFirst(set, ['a/0'], 3, 'O')).toBeDefined();
    // Only O's entry is O's to give, and only within a bound (recover's, once stale).
    expect(await sets.takeOverReservation(set, 'a/0', 'C', 'X', 0)).toBe(false);
    expect(await sets.takeOverReservation(set, 'a/0', 'O', 'X')).toBe(false);
    // Y, another delivery of the request in another instance, reads the entry; before Y writes, X adopts
    // it, is placed, and gives the node back. Y must not bring that count-up back to life.
    const other = new DynamoDBClient(localEngineClientConfig(engine.endpoint, 'eu-west-1'));
    const y = new DynamoStore(other, 'scale').capacity;
    let readCounter = false;
    const seen: Array<[string, number, number]> = [];
    other.middlewareStack.add(
      (next) => async (args) => {
        const input = args.input as { Key?: { pk?: string; sk?: string }; UpdateExpression?: string };
        if (readCounter) {
          readCounter = false;
          expect(await sets.takeOverReservation(set, 'a/0', 'O', 'X', 0)).toBe(true);
          const place = await steps().place(set, 'a/0');
          seen.push([
            place?.owner ?? '',
            await sets.used(set),
            Object.keys((await steps().counter(set)).pending).length,
          ]);
          expect(place?.countedBy).toBe(countIdOf((await steps().counter(set)).pending['a/0'] as Pending));
          expect(await sets.reserve(set, ['a/0'], 3, 'X')).toEqual({ kind: 'reserved' }); // X finishes it
          await sets.unreserve(set, ['a/0'], 'X');
        } else if (input.Key?.pk === set.pk && input.Key.sk === set.sk && !input.UpdateExpression) {
          readCounter = true;
        }
        return next(args);
      },
      { step: 'initialize', name: 'adoptWhileYReads' },
    );
    try {
      expect(await y.takeOverReservation(set, 'a/0', 'O', 'Y', 0)).toBe(false);
    } finally {
      other.destroy();
    }
    // X held it, counted once (O's count-up, now X's); then it went, and Y created nothing.
    expect(seen).toEqual([['X', 1, 1]]);
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
    expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBe(0);
  });

  it("finishes, never adopts, a dead delivery's count-up whose place it made and another took over", async () => {
    const set = keys.poolNodes('first/placed');
    // O counted b/0 up and created its place counted, naming that count-up, then died before removing
    // the entry; P, a later receive, took the place over. The entry is the place's own count.
    const at = (await steps().countUpFirst(set, ['b/0'], 3, 'O')) as number;
    expect(await steps().createCountedPlace(set, 'b/0', 'O', countIdOf({ owner: 'O', at }))).toBe(true);
    expect(await steps().takeOver(set, 'b/0', 'O', 'P')).toBe(true);
    expect(await sets.used(set)).toBe(1);
    // Z, a delivery after P, finds O's entry: adopting it would undo the place's count (the seed-1 chaos
    // schedule found two places counted without their count). It is finished instead: the count stays.
    expect(await sets.takeOverReservation(set, 'b/0', 'O', 'Z', 0)).toBe(false);
    expect(await sets.used(set)).toBe(1);
    expect((await steps().counter(set)).pending['b/0']).toBeUndefined();
    expect((await sets.audit(set)).counting).toBe(1);
    // ...and the place is then Z's to take over from P at once.
    expect(await sets.takeOverReservation(set, 'b/0', 'P', 'Z', 0)).toBe(true);
    expect(await steps().place(set, 'b/0')).toMatchObject({ owner: 'Z', phase: 'counted' });
    await sets.unreserve(set, ['b/0'], 'Z');
    expect(await sets.used(set)).toBe(0);
    expect(await sets.recover(set, Number.POSITIVE_INFINITY)).toBe(0);
  });

  it('refused, answers from the counter without creating a place: full, or held by a delivery between its count-up and its place', async () => {
    const set = keys.poolNodes('first/refused');
    const created: string[] = [];
    expect(await sets.reserve(set, ['r/0'], 2, 'A', false, first)).toEqual({ kind: 'reserved' });
    // C counted d/0 up and has not created its place yet.
    expect(await steps().countUpFirst(set, ['d/0'], 2, 'C')).toBeDefined();
    sets.afterStep = (step, m) => {
      if (step === 'place created') created.push(m);
    };
    try {
      expect(await sets.reserve(set, ['f/0'], 2, 'B', false, first)).toEqual({ kind: 'full' });
      const held = await sets.reserve(set, ['d/0'], 3, 'B', false, first);
      expect(held).toEqual({ kind: 'held', holders: new Map([['d/0', 'C']]) });
    } finally {
      sets.afterStep = undefined;
    }
    // No place was created to be dropped again: C's own creation is not refused.
    expect(created).toEqual([]);
    expect(await steps().createCountedPlace(set, 'd/0', 'C', 'C@0')).toBe(true);
  });

  it('some members placed already: takes none of them (all or none), counted exactly', async () => {
    const set = keys.poolNodes('first/partial');
    expect(await sets.reserve(set, ['p/1'], 4, 'A')).toEqual({ kind: 'reserved' });
    await sets.recover(set, Number.POSITIVE_INFINITY);
    expect((await sets.reserve(set, ['p/0', 'p/1', 'p/2'], 4, 'B', false, first)).kind).toBe('held');
    expect([...(await sets.members(set))]).toEqual(['p/1']);
    expect(await sets.used(set)).toBe(1);
    await sets.recover(set, Number.POSITIVE_INFINITY);
    expect(await sets.used(set)).toBe(1);
  });
});

describe('concurrent reservations', () => {
  it('never take more places than the cap, and the count matches the places', async () => {
    const set = keys.poolNodes('race');
    const results = await Promise.all(
      Array.from({ length: 40 }, (_, i) => sets.reserve(set, [`q${i}/0`, `q${i}/1`], 25, `o${i}`)),
    );
    const reserved = results.filter((r) => r.kind === 'reserved').length;
    expect(reserved).toBeGreaterThan(0);
    expect(reserved * 2).toBeLessThanOrEqual(25);
    expect(await sets.used(set)).toBe(reserved * 2);
    expect((await sets.members(set)).size).toBe(reserved * 2);
    // Releases racing each other (a message delivered twice) give each place back once.
    const held = [...(await sets.members(set))];
    await Promise.all([...held, ...held].map((m) => sets.unreserve(set, [m])));
    expect(await sets.used(set)).toBe(0);
    expect((await sets.members(set)).size).toBe(0);
  });
});

/** Write units a call consumed, as DynamoDB bills them. */
const writeUnits = (work: () => Promise<unknown>) => consumedUnits(client, /Put|Update|Delete/, work);

describe('the cost of a place', () => {
  it('is the same with 20 or 5,000 places held (it grew with the set when a set was one item)', async () => {
    const costs: Record<number, { reserve: number; release: number }> = {};
    for (const held of [20, 5_000]) {
      const set = keys.poolNodes(`cost/${held}`);
      const members = Array.from({ length: held }, (_, i) => longest(i));
      await holdPlaces(doc, 'scale', sets, set, members, (_, i) => owner(1_000_000_000, Math.floor(i / 50)));
      expect(await sets.used(set)).toBe(held);
      expect((await sets.members(set)).size).toBe(held);
      const reserve = await writeUnits(() =>
        sets.reserve(set, ['one/0'], MAX_SERVERS, owner(2_000_000_000, 1)),
      );
      const release = await writeUnits(() => sets.unreserve(set, ['one/0']));
      costs[held] = { reserve, release };
    }
    expect(costs[5_000]).toEqual(costs[20]);
    // A reserve is three writes of small items (place, counter, place), a release three: each one's
    // removal of its pending entry goes with the next counter write (four and four before issue 26).
    expect(costs[20]).toEqual({ reserve: 3, release: 3 });
  });
});

/** Writes (PutItem, UpdateItem, DeleteItem) sent to one item while `work` runs, failed conditions included. */
async function writesTo(key: { pk: string; sk: string }, work: () => Promise<unknown>): Promise<number> {
  let writes = 0;
  await whileWatching(
    client,
    (command, input, send) => {
      const target = (input.Key ?? input.Item) as Record<string, unknown> | undefined;
      if (/Put|Update|Delete/.test(command) && target?.pk === key.pk && target?.sk === key.sk) writes++;
      return send();
    },
    work,
  );
  return writes;
}

describe('a node set of 64 (issue 24, defect 5)', () => {
  it('writes the counter twice to take its places and twice to give them back, not once per member', async () => {
    const set = keys.poolNodes('set/64');
    const members = Array.from({ length: 64 }, (_, i) => longest(i));
    const steps = new CapacitySteps(doc, 'scale', Date.now);
    await sets.reserve(set, ['other/0'], MAX_SERVERS, owner(1_000_000_000, 1));

    const reserve = await writesTo(set, () =>
      sets.reserve(set, members, MAX_SERVERS, owner(2_000_000_000, 2)),
    );
    expect(await sets.used(set)).toBe(65);
    // Their entries are left for the next counter write: counted places with a reserve entry count 1.
    const reserved = (await steps.counter(set)).pending;
    expect(Object.keys(reserved).sort()).toEqual([...members].sort());
    expect(Object.values(reserved).every((e) => e.op === 'reserve')).toBe(true);
    expect((await steps.places(set)).filter((p) => p.phase !== 'counted')).toEqual([]);

    // The count-down takes the reserve entries over in the same write.
    const release = await writesTo(set, () => sets.unreserve(set, members));
    expect(await sets.used(set)).toBe(1);
    expect(Object.values((await steps.counter(set)).pending).every((e) => e.op === 'release')).toBe(true);
    expect([...(await sets.members(set))]).toEqual(['other/0']);
    // The next counter write removes the release entries with its own change.
    await sets.reserve(set, ['after/0'], MAX_SERVERS, owner(3_000_000_000, 3));
    expect(await sets.used(set)).toBe(2);
    expect(Object.keys((await steps.counter(set)).pending)).toEqual(['after/0']);
    // Count up; count down (65 and 128 writes of one item before issue 24, 2 and 2 before issue 26).
    expect({ reserve, release }).toEqual({ reserve: 1, release: 1 });
  });
});

describe('the largest pool: max-servers at its maximum', () => {
  it('keeps allocation, release, takeover and giving back exact with thousands of places held', async () => {
    const set = keys.poolNodes('meta/largest');
    const max = MAX_SERVERS;
    // 3,000 places held in node sets of 50, the first 10 sets by dead deliveries.
    const held = 3_000;
    const members = Array.from({ length: held }, (_, i) => longest(i));
    await holdPlaces(doc, 'scale', sets, set, members, (_, i) => {
      const d = Math.floor(i / 50);
      return owner(d < 10 ? 1_000 : 1_000_000_000, d);
    });
    expect(await sets.used(set)).toBe(held);
    // Still room below the cap, reserved through the store as any request's places are.
    expect(await sets.reserve(set, ['next/0', 'next/1'], max, owner(1_500_000_000, 1))).toEqual({
      kind: 'reserved',
    });
    await sets.unreserve(set, ['next/0', 'next/1']);
    expect(await sets.used(set)).toBe(held);
    // The cap holds at this size as at any: a set that would pass it is refused whole.
    expect(await sets.reserve(set, ['late/0', 'late/1'], held + 1, owner(1_600_000_000, 1))).toEqual({
      kind: 'full',
    });
    expect(await sets.reserve(set, ['late/0'], held + 1, owner(1_600_000_000, 1))).toEqual({
      kind: 'reserved',
    });
    await sets.unreserve(set, ['late/0']);
    // A redelivery takes a dead delivery's place over; the dead one can no longer give it back.
    const first = longest(0);
    const redelivery = owner(1_700_000_000, 2);
    const holder = (await store.nodePlaces('meta/largest')).get(first) as string;
    expect(await sets.takeOverReservation(set, first, holder, redelivery)).toBe(true);
    await sets.unreserve(set, [first], holder);
    expect((await store.nodePlaces('meta/largest')).get(first)).toBe(redelivery);
    // What the reaper's reconciliation does: read the holders, give back the dead ones' places.
    const holders = await store.nodePlaces('meta/largest');
    expect(holders.size).toBe(held);
    const dead = [...holders].filter(([, by]) => ownerSince(by) === 1_000);
    expect(dead.length).toBe(499);
    for (const [m, by] of dead) await sets.unreserve(set, [m], by);
    expect(await sets.used(set)).toBe(held - 499);
    expect((await sets.members(set)).size).toBe(held - 499);
    // Nothing was left part-way: what recover finds is the last release's entries, whose removal waits
    // for the next counter write; it removes them without changing the count.
    await sets.recover(set, Number.POSITIVE_INFINITY);
    expect(await sets.used(set)).toBe(held - 499);
    expect((await new CapacitySteps(doc, 'scale', Date.now).counter(set)).pending).toEqual({});
  }, 300_000);
});

describe('a state dir of an earlier version', () => {
  it('has its one-item capacity sets moved to places at start, once, with their owners', async () => {
    await doc.send(
      new PutCommand({
        TableName: 'scale',
        Item: { ...keys.poolNodes('meta/old'), owners: { 'a/0': 'o1', 'a/1': 'o1', 'b/0': 'o2' } },
      }),
    );
    await doc.send(
      new PutCommand({
        TableName: 'scale',
        Item: { ...keys.backingPool('local/old'), members: new Set(['bn-1']) },
      }),
    );
    const moved = await store.migrateCapacitySets(['meta/old'], ['local/old']);
    expect(Object.fromEntries(moved)).toEqual({ 'POOL#meta/old': 3, 'BACKINGPOOL#local/old': 1 });
    expect(Object.fromEntries(await store.nodePlaces('meta/old'))).toEqual({
      'a/0': 'o1',
      'a/1': 'o1',
      'b/0': 'o2',
    });
    expect(await sets.used(keys.poolNodes('meta/old'))).toBe(3);
    expect(await sets.used(keys.backingPool('local/old'))).toBe(1);
    // They work as any other: a full set refuses, a release makes room.
    expect(await store.reserveNodePlaces('meta/old', ['c/0'], 3, 'o3')).toEqual({ kind: 'full' });
    await store.freeNodePlaces('meta/old', ['b/0']);
    expect(await store.reserveNodePlaces('meta/old', ['c/0'], 3, 'o3')).toEqual({ kind: 'reserved' });
    expect((await store.migrateCapacitySets(['meta/old'], ['local/old'])).size).toBe(0);
  });
});
