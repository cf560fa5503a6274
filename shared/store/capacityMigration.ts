import { type DynamoDBDocumentClient, GetCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { RetryableError } from '../core/errors.ts';
import { isConditionFailure } from './capacityReads.ts';
import type { CapacitySteps, Key } from './capacitySteps.ts';

/** Attempts at the conversion when other writers change the item between its read and its write. */
const CONVERT_ATTEMPTS = 5;
/** Attempts at creating a legacy member's place when other writers create and delete it meanwhile. */
const SETTLE_ATTEMPTS = 3;

/**
 * Moves a capacity set written by an earlier version (one item holding a map `owners` of member -> owner,
 * or a string set `members`, and no counter) to places and a counter. Returns how many members this call
 * gave their place.
 *
 * Run by whoever meets such a set: `metastatic dev` as it starts, a count-up refused because the set is
 * of that form (so the first reservation in a deployed pool migrates it, before it is admitted), and the
 * reaper's recovery. Any number may run at once, beside reservations and releases, with no transaction
 * (dynalite has none) and no lock:
 * 1. convert: one conditional write turns the item into a counter (`used` + the members, `pending`) and a
 *    map `legacy` of those members, conditioned on the old form being as read. From then on the set is
 *    exact: every member counts, in `used`, whether or not it has its place yet;
 * 2. settle, per legacy member, with the steps of a reservation: its place is created `counting`, then
 *    one write moves its count from `legacy` to a pending reserve (1 -> 1), which finishReserve ends.
 *    A settle that comes late (another moved the member first) finds `legacy` without it and drops the
 *    place it created, so no place ever exists that `used` does not count.
 * Idempotent: an interrupted migration is finished by the next.
 */
export async function migrateCapacitySet(
  doc: DynamoDBDocumentClient,
  tableName: string,
  now: () => number,
  steps: CapacitySteps,
  key: Key,
): Promise<number> {
  await convert(doc, tableName, key);
  const { legacy } = await steps.counter(key);
  let moved = 0;
  for (const [member, owner] of Object.entries(legacy)) {
    if (await settle(doc, tableName, now, steps, key, member, owner)) moved++;
  }
  if (Object.keys(legacy).length > 0) await removeEmptyLegacy(doc, tableName, key);
  return moved;
}

/** Step 1: the one-item form becomes a counter counting its members, kept in `legacy` until placed. */
async function convert(doc: DynamoDBDocumentClient, tableName: string, key: Key): Promise<void> {
  for (let attempt = 0; attempt < CONVERT_ATTEMPTS; attempt++) {
    const out = await doc.send(new GetCommand({ TableName: tableName, Key: key, ConsistentRead: true }));
    const item = out.Item;
    if (!item || (item.owners === undefined && item.members === undefined)) return;
    const owners = (item.owners ?? {}) as Record<string, string>;
    const members = item.members instanceof Set ? [...(item.members as Set<string>)] : [];
    const legacy: Record<string, string> = { ...((item.legacy ?? {}) as Record<string, string>) };
    const before = Object.keys(legacy).length;
    for (const m of members) legacy[m] ??= 'migrated';
    for (const [m, o] of Object.entries(owners)) legacy[m] = o;
    const added = Object.keys(legacy).length - before;
    // As read: the same old members, and no member settled meanwhile (the sizes say so).
    const condition = [
      item.owners === undefined ? 'attribute_not_exists(#owners)' : 'size(#owners) = :nOwners',
      item.members === undefined ? 'attribute_not_exists(#members)' : 'size(#members) = :nMembers',
      item.legacy === undefined ? 'attribute_not_exists(#legacy)' : 'size(#legacy) = :nLegacy',
    ].join(' AND ');
    try {
      await doc.send(
        new UpdateCommand({
          TableName: tableName,
          Key: key,
          UpdateExpression:
            'SET #used = if_not_exists(#used, :zero) + :added, #pending = if_not_exists(#pending, :empty), ' +
            '#legacy = :legacy REMOVE #owners, #members',
          ConditionExpression: condition,
          ExpressionAttributeNames: {
            '#used': 'used',
            '#pending': 'pending',
            '#legacy': 'legacy',
            '#owners': 'owners',
            '#members': 'members',
          },
          ExpressionAttributeValues: {
            ':zero': 0,
            ':added': added,
            ':empty': {},
            ':legacy': legacy,
            ...(item.owners === undefined ? {} : { ':nOwners': Object.keys(owners).length }),
            ...(item.members === undefined ? {} : { ':nMembers': members.length }),
            ...(item.legacy === undefined ? {} : { ':nLegacy': before }),
          },
        }),
      );
      return;
    } catch (err) {
      if (!isConditionFailure(err)) throw err; // changed since read: read again
    }
  }
  throw new RetryableError(`capacity set ${key.pk}: could not convert it from an earlier version's form`);
}

/**
 * Step 2 for one member: true when this call gave it its place. A member that has a counted place
 * already only loses its legacy count; one another settle is moving is left to it.
 */
async function settle(
  doc: DynamoDBDocumentClient,
  tableName: string,
  now: () => number,
  steps: CapacitySteps,
  key: Key,
  member: string,
  owner: string,
): Promise<boolean> {
  let placed = false;
  for (let attempt = 0; attempt < SETTLE_ATTEMPTS && !placed; attempt++) {
    if (await steps.createPlace(key, member, owner)) {
      placed = true;
      break;
    }
    const place = await steps.place(key, member);
    if (!place) continue; // deleted meanwhile: create it again
    if (place.owner === owner && place.phase === 'counting') {
      placed = true; // our holder's, not counted yet: left by a settle that stopped, or one running now
      break;
    }
    const pending = (await steps.counter(key)).pending[member];
    if (place.phase === 'counting' && pending?.op !== 'reserve') {
      // Another owner's reservation of the member, not counted: no count-up passes while `legacy` has
      // members, so its owner drops it (or recover does, once it is stale); the next migration settles
      // the member then. Deleting it here would let that owner count it up after all, a second time.
      return false;
    }
    // Counted by a place of its own already (a reservation made before this fix): its legacy count goes.
    await dropLegacy(doc, tableName, key, member);
    return false;
  }
  if (!placed) return false; // contended: the next migration
  try {
    await doc.send(
      new UpdateCommand({
        TableName: tableName,
        Key: key,
        UpdateExpression: 'REMOVE #legacy.#m SET #pending.#m = :e',
        ConditionExpression: 'attribute_exists(#legacy.#m) AND attribute_not_exists(#pending.#m)',
        ExpressionAttributeNames: { '#legacy': 'legacy', '#pending': 'pending', '#m': member },
        ExpressionAttributeValues: { ':e': { op: 'reserve', owner, at: now() } },
      }),
    );
  } catch (err) {
    if (!isConditionFailure(err)) throw err;
    // Moved by another settle (or an operation on the member is in flight): our place, if still
    // uncounted, goes, so that no place is left that `used` does not count.
    await steps.dropUncounted(key, [member], owner);
    return false;
  }
  await steps.finishReserve(key, member, owner);
  return true;
}

/** A legacy member whose place another holder has counted: its second count goes (1 -> 0). */
async function dropLegacy(doc: DynamoDBDocumentClient, tableName: string, key: Key, member: string) {
  try {
    await doc.send(
      new UpdateCommand({
        TableName: tableName,
        Key: key,
        UpdateExpression: 'REMOVE #legacy.#m SET #used = #used - :one',
        ConditionExpression: 'attribute_exists(#legacy.#m)',
        ExpressionAttributeNames: { '#legacy': 'legacy', '#used': 'used', '#m': member },
        ExpressionAttributeValues: { ':one': 1 },
      }),
    );
  } catch (err) {
    if (!isConditionFailure(err)) throw err;
  }
}

async function removeEmptyLegacy(doc: DynamoDBDocumentClient, tableName: string, key: Key) {
  try {
    await doc.send(
      new UpdateCommand({
        TableName: tableName,
        Key: key,
        UpdateExpression: 'REMOVE #legacy',
        ConditionExpression: 'size(#legacy) = :zero',
        ExpressionAttributeNames: { '#legacy': 'legacy' },
        ExpressionAttributeValues: { ':zero': 0 },
      }),
    );
  } catch (err) {
    if (!isConditionFailure(err)) throw err; // members left (a settle gave up): the next migration
  }
}
