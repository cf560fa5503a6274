import { type DynamoDBDocumentClient, GetCommand, PutCommand, UpdateCommand } from '@aws-sdk/lib-dynamodb';
import { type CapacitySteps, isConditionFailure, type Key, placeKey } from './capacitySteps.ts';

/**
 * Moves a capacity set written by an earlier version (one item holding a map `owners` of member -> owner,
 * or a string set `members`) to places and a counter: every member becomes a counted place of its owner.
 * Returns how many members it moved (0 when the set is in the current form). For a state directory of
 * `metastatic dev` started by a newer version; run before anything else uses the table. Idempotent: an
 * interrupted migration is finished by the next.
 */
export async function migrateCapacitySet(
  doc: DynamoDBDocumentClient,
  tableName: string,
  now: () => number,
  steps: CapacitySteps,
  key: Key,
): Promise<number> {
  const out = await doc.send(new GetCommand({ TableName: tableName, Key: key, ConsistentRead: true }));
  const item = out.Item;
  if (!item || (item.owners === undefined && item.members === undefined)) return 0;
  const owners: Record<string, string> = {};
  if (item.owners && typeof item.owners === 'object') Object.assign(owners, item.owners);
  if (item.members instanceof Set) for (const m of item.members as Set<string>) owners[m] ??= 'migrated';
  const entries = Object.entries(owners);
  for (const [member, owner] of entries) {
    try {
      await doc.send(
        new PutCommand({
          TableName: tableName,
          Item: { ...placeKey(key, member), type: 'place', member, owner, phase: 'counted', at: now() },
          ConditionExpression: 'attribute_not_exists(pk)',
        }),
      );
    } catch (err) {
      if (!isConditionFailure(err)) throw err; // moved by an earlier, interrupted migration
    }
  }
  const held = (await steps.places(key)).filter((p) => p.phase !== 'counting').length;
  await doc.send(
    new UpdateCommand({
      TableName: tableName,
      Key: key,
      UpdateExpression:
        'SET #used = :held, #pending = if_not_exists(#pending, :empty) REMOVE #owners, #members',
      ExpressionAttributeNames: {
        '#used': 'used',
        '#pending': 'pending',
        '#owners': 'owners',
        '#members': 'members',
      },
      ExpressionAttributeValues: { ':held': held, ':empty': {} },
    }),
  );
  return entries.length;
}
