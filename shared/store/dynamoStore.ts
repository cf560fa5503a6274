import {
  type AttributeValue,
  ConditionalCheckFailedException,
  type DynamoDBClient,
} from '@aws-sdk/client-dynamodb';
import {
  DeleteCommand,
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  QueryCommand,
  type QueryCommandInput,
  ScanCommand,
  type ScanCommandInput,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import { unmarshall } from '@aws-sdk/util-dynamodb';
import { ConflictError, ItemTooLargeError } from '../core/errors.ts';
import { BackingRecord, type Claim, RequestRecord } from '../core/records.ts';
import type { BackingState } from '../core/states.ts';
import {
  backingIndexAttributes,
  backingItem,
  FREE_INDEX,
  freePartition,
  keys,
  REAP_INDEX,
  reapPartition,
  requestItem,
  resourceItem,
  waitingSortKey,
} from './table.ts';

/**
 * The DynamoDB adapter. Every write that could race is conditional, built from the named fragments
 * below; a failed condition becomes a ConflictError (or a domain answer), anything else is re-thrown.
 * No transactions anywhere: each write touches one item.
 */
const pointsTo = '(attribute_not_exists(pk) OR backingNodeId = :backingNodeId)';
const conditions = {
  itemDoesNotExist: 'attribute_not_exists(pk)',
  versionUnchanged: '#version = :expectedVersion',
  stateIsOneOf: (n: number) =>
    `#state IN (${Array.from({ length: n }, (_, i) => `:expectedState${i}`).join(', ')})`,
  usedIs: '#used = :expectedUsed',
  roomInMap: '(attribute_not_exists(#owners) OR size(#owners) <= :room)',
} as const;

/** DynamoDB's answer to a put or update whose item would exceed 400 KB (dynalite answers alike). */
function isItemTooLarge(err: unknown): boolean {
  return (
    err instanceof Error && err.name === 'ValidationException' && /item size.*exceeded/i.test(err.message)
  );
}

export interface BackingExpectation {
  readonly version: number;
  readonly states?: readonly BackingState[];
  readonly used?: number;
}

export type Reservation =
  | { readonly kind: 'reserved' }
  | { readonly kind: 'full' }
  /** Some members are held by other owners: a concurrent (or dead) delivery of the same message. */
  | { readonly kind: 'held'; readonly holders: ReadonlyMap<string, string> };

export class DynamoStore {
  private readonly doc: DynamoDBDocumentClient;

  constructor(
    client: DynamoDBClient,
    readonly tableName: string,
  ) {
    this.doc = DynamoDBDocumentClient.from(client, { marshallOptions: { removeUndefinedValues: true } });
    // An item over DynamoDB's size limit fails the same way every time: a permanent error, not a
    // transient one retried until the message's receives run out.
    this.doc.middlewareStack.add(
      (next) => async (args) => {
        try {
          return await next(args);
        } catch (err) {
          if (isItemTooLarge(err)) {
            throw new ItemTooLargeError(`DynamoDB refused the item: ${(err as Error).message}`, {
              cause: err,
            });
          }
          throw err;
        }
      },
      // The document client shares the client's stack: a second store on one client replaces it.
      { step: 'initialize', name: 'metastaticItemTooLarge', override: true },
    );
  }

  // ---- requests -------------------------------------------------------------------------------

  /** Records a new request; returns the existing one instead when the id is taken. */
  async createRequest(r: RequestRecord): Promise<RequestRecord | undefined> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: requestItem(r),
          ConditionExpression: conditions.itemDoesNotExist,
        }),
      );
      return undefined;
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      const existing = await this.getRequest(r.id);
      if (!existing) throw new ConflictError(`request ${r.id} exists but could not be read`, { cause: err });
      return existing;
    }
  }

  async getRequest(id: string): Promise<RequestRecord | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.request(id), ConsistentRead: true }),
    );
    return out.Item ? RequestRecord.parse(out.Item) : undefined;
  }

  /** Replaces a request if its stored version is still `expectedVersion`. */
  async putRequest(next: RequestRecord, expectedVersion: number): Promise<void> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: requestItem(next),
          ConditionExpression: conditions.versionUnchanged,
          ExpressionAttributeNames: { '#version': 'version' },
          ExpressionAttributeValues: { ':expectedVersion': expectedVersion },
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new ConflictError(`request ${next.id} changed since version ${expectedVersion}`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * Marks one node of a request released in a single conditional update: the node must still be
   * pending or ready, in a placed request. Returns the updated request, or undefined when the
   * condition failed (unknown, not placed yet, already released or failed: the caller reads and decides).
   */
  async releaseNodeEntry(
    requestId: string,
    index: number,
    now: number,
    force = false,
  ): Promise<RequestRecord | undefined> {
    try {
      const out = await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.request(requestId),
          UpdateExpression: `SET #nodes[${index}].#state = :released, #nodes[${index}].releasedAt = :now, updatedAt = :now ADD #version :one`,
          // A held node is released only by a forced (operator) release.
          ConditionExpression: `#nodes[${index}].#state IN (:pending, :ready) AND #rstate IN (:pending, :fulfilled)${
            force ? '' : ` AND attribute_not_exists(#nodes[${index}].held)`
          }`,
          ExpressionAttributeNames: {
            '#nodes': 'nodes',
            '#state': 'state',
            '#rstate': 'state',
            '#version': 'version',
          },
          ExpressionAttributeValues: {
            ':released': 'released',
            ':now': now,
            ':one': 1,
            ':pending': 'pending',
            ':ready': 'ready',
            ':fulfilled': 'fulfilled',
          },
          ReturnValues: 'ALL_NEW',
        }),
      );
      return RequestRecord.parse(out.Attributes);
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return undefined;
      throw err;
    }
  }

  // ---- backing nodes --------------------------------------------------------------------------

  async getBacking(id: string): Promise<BackingRecord | undefined> {
    const item = await this.getBackingItem(id);
    return item ? BackingRecord.parse(item) : undefined;
  }

  private async getBackingItem(id: string): Promise<Record<string, unknown> | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.backing(id), ConsistentRead: true }),
    );
    return out.Item;
  }

  /** Writes a new backing record (the intent, before the launch); returns the existing one if the id is taken. */
  async createBacking(b: BackingRecord): Promise<BackingRecord | undefined> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: backingItem(b),
          ConditionExpression: conditions.itemDoesNotExist,
        }),
      );
      return undefined;
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      const existing = await this.getBacking(b.id);
      if (!existing)
        throw new ConflictError(`backing node ${b.id} exists but could not be read`, { cause: err });
      return existing;
    }
  }

  /**
   * Replaces a backing record if it is unchanged since it was read (same version) and, optionally,
   * still in one of the expected states with the expected number of used slots.
   */
  async putBacking(next: BackingRecord, expect: BackingExpectation): Promise<void> {
    const parts: string[] = [conditions.versionUnchanged];
    const names: Record<string, string> = { '#version': 'version' };
    const values: Record<string, unknown> = { ':expectedVersion': expect.version };
    if (expect.states) {
      parts.push(conditions.stateIsOneOf(expect.states.length));
      names['#state'] = 'state';
      expect.states.forEach((s, i) => {
        values[`:expectedState${i}`] = s;
      });
    }
    if (expect.used !== undefined) {
      parts.push(conditions.usedIs);
      names['#used'] = 'used';
      values[':expectedUsed'] = expect.used;
    }
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: backingItem(next),
          ConditionExpression: parts.join(' AND '),
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new ConflictError(`backing node ${next.id} changed since version ${expect.version}`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * Claims one slot of a backing node in a single conditional UpdateItem. The condition is on the slot
   * (free), the state (as read), room (used < slots), no drain and no max-age, not on the item's
   * version: claims of different slots on one backing node never conflict with each other. The version
   * is still bumped, so every whole-item writer (retire, fail, release) sees the claim. The claim that
   * takes the last free slot (by what was read) also takes the item out of the free index, conditioned
   * on `used` being what was read. Returns the record after the claim; on a failed condition, the item
   * as it is now (ReturnValuesOnConditionCheckFailure, no extra read) to choose again from.
   */
  async claimSlot(
    read: BackingRecord,
    slot: number,
    nodeId: string,
    claim: Claim,
  ): Promise<{ claimed: true; record: BackingRecord } | { claimed: false; current?: BackingRecord }> {
    const filling = read.used + 1 >= read.slots;
    const after = backingIndexAttributes({ ...read, used: read.used + 1 });
    const names: Record<string, string> = {
      '#slotMap': 'slotMap',
      '#claims': 'claims',
      '#slot': String(slot),
      '#used': 'used',
      '#version': 'version',
      '#state': 'state',
    };
    const values: Record<string, unknown> = {
      ':node': nodeId,
      ':claim': claim,
      ':one': 1,
      ':state': read.state,
      ':slots': read.slots,
      ':now': claim.at,
      ':true': true,
      ':rpk': after.rpk,
      ':rsk': after.rsk,
    };
    const set = [
      '#slotMap.#slot = :node',
      '#claims.#slot = :claim',
      '#used = #used + :one',
      '#version = #version + :one',
      'rpk = :rpk',
      'rsk = :rsk',
    ];
    const condition = [
      'attribute_not_exists(#slotMap.#slot)',
      '#state = :state',
      '#used < :slots',
      '(attribute_not_exists(drained) OR drained <> :true)',
      '(attribute_not_exists(noNewNodesAfter) OR noNewNodesAfter > :now)',
    ];
    let remove = '';
    if (filling) {
      condition.push('#used = :readUsed');
      values[':readUsed'] = read.used;
      remove = ' REMOVE fpk, fsk';
    } else {
      set.push('fsk = :fsk'); // fullest first, as of this claim (a concurrent one may be newer)
      values[':fsk'] = after.fsk;
    }
    try {
      const out = await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.backing(read.id),
          UpdateExpression: `SET ${set.join(', ')}${remove}`,
          ConditionExpression: condition.join(' AND '),
          ExpressionAttributeNames: names,
          ExpressionAttributeValues: values,
          ReturnValues: 'ALL_NEW',
          ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
        }),
      );
      const record = BackingRecord.parse(out.Attributes);
      // Concurrent claims filled it, none of them by what it read: take it out of the free index.
      if (record.used >= record.slots && out.Attributes?.fpk !== undefined)
        await this.leaveFreeIndex(read.id);
      return { claimed: true, record };
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
      // DynamoDB returns the item with the failure; an engine that does not (dynalite) costs a read.
      const returned = (err as { Item?: Record<string, AttributeValue> }).Item;
      const item = returned ? unmarshall(returned) : await this.getBackingItem(read.id);
      if (!item) return { claimed: false };
      const current = BackingRecord.parse(item);
      if (current.used >= current.slots && item.fpk !== undefined) await this.leaveFreeIndex(read.id);
      return { claimed: false, current };
    }
  }

  /** Takes a full backing node out of the free index (repairs what concurrent claims left behind). */
  private async leaveFreeIndex(id: string): Promise<void> {
    await this.doc
      .send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: keys.backing(id),
          UpdateExpression: 'REMOVE fpk, fsk',
          ConditionExpression: '#used >= slots',
          ExpressionAttributeNames: { '#used': 'used' },
        }),
      )
      .catch((err: unknown) => {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // freed meanwhile: it stays
      });
  }

  /**
   * Backing nodes of a pool's label that can take a node, fullest first then oldest: one Query of
   * `limit` items; pass the returned cursor to read the next page (rarely needed: the first claimable
   * candidate almost always wins).
   */
  async findCandidates(
    poolKey: string,
    label: string,
    limit: number,
    cursor?: Record<string, unknown>,
  ): Promise<{ items: BackingRecord[]; cursor?: Record<string, unknown> }> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: FREE_INDEX,
        KeyConditionExpression: 'fpk = :p',
        ExpressionAttributeValues: { ':p': freePartition(poolKey, label) },
        Limit: limit,
        ExclusiveStartKey: cursor,
      }),
    );
    return { items: (out.Items ?? []).map((i) => BackingRecord.parse(i)), cursor: out.LastEvaluatedKey };
  }

  /** Every backing node in a partition of the reap index, optionally only those sorted before `before`. */
  async queryReap(partition: string, before?: string): Promise<BackingRecord[]> {
    const input: QueryCommandInput = {
      TableName: this.tableName,
      IndexName: REAP_INDEX,
      KeyConditionExpression: before === undefined ? 'rpk = :p' : 'rpk = :p AND rsk < :b',
      ExpressionAttributeValues:
        before === undefined ? { ':p': partition } : { ':p': partition, ':b': before },
    };
    const items: BackingRecord[] = [];
    do {
      const out = await this.doc.send(new QueryCommand(input));
      for (const i of out.Items ?? []) items.push(BackingRecord.parse(i));
      input.ExclusiveStartKey = out.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return items;
  }

  /**
   * One page of the requests still waiting to be placed (WAITING partition of the reap index) that were
   * created before `createdBefore` (epoch ms), oldest first; pass the returned cursor for the next page.
   */
  async waitingRequests(
    createdBefore: number,
    cursor?: Record<string, unknown>,
  ): Promise<{ items: RequestRecord[]; cursor?: Record<string, unknown> }> {
    const out = await this.doc.send(
      new QueryCommand({
        TableName: this.tableName,
        IndexName: REAP_INDEX,
        KeyConditionExpression: 'rpk = :p AND rsk < :b',
        ExpressionAttributeValues: { ':p': reapPartition.waiting, ':b': waitingSortKey(createdBefore) },
        ExclusiveStartKey: cursor,
      }),
    );
    return { items: (out.Items ?? []).map((i) => RequestRecord.parse(i)), cursor: out.LastEvaluatedKey };
  }

  // ---- resource pointers ------------------------------------------------------------------------

  /**
   * Records which backing node a provider resource belongs to (written before the resource id is recorded
   * on the backing node, so every recorded id has its pointer). Idempotent for the same backing node; a
   * resource id another backing node claims is a ConflictError.
   */
  async pointToBacking(resourceId: string, backingNodeId: string, recordedAt: number): Promise<void> {
    try {
      await this.doc.send(
        new PutCommand({
          TableName: this.tableName,
          Item: resourceItem(resourceId, backingNodeId, recordedAt),
          ConditionExpression: pointsTo,
          ExpressionAttributeValues: { ':backingNodeId': backingNodeId },
        }),
      );
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) {
        throw new ConflictError(`resource ${resourceId} is already recorded by another backing node`, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /** The backing node that records a provider resource, or undefined when none does (one GetItem). */
  async backingIdOfResource(resourceId: string): Promise<string | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: keys.resource(resourceId), ConsistentRead: true }),
    );
    const id = out.Item?.backingNodeId;
    return typeof id === 'string' ? id : undefined;
  }

  /** Removes a resource's pointer while it still names this backing node (idempotent). */
  async forgetResource(resourceId: string, backingNodeId: string): Promise<void> {
    try {
      await this.doc.send(
        new DeleteCommand({
          TableName: this.tableName,
          Key: keys.resource(resourceId),
          ConditionExpression: pointsTo,
          ExpressionAttributeValues: { ':backingNodeId': backingNodeId },
        }),
      );
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err; // another's: left alone
    }
  }

  // ---- capacity sets (max-servers) --------------------------------------------------------------

  /**
   * Adds members to a capacity set, held by `owner`, if the set stays within `limit`. A capacity set
   * is a map member -> owner token on one item, so a delivery can tell its own reservations from a
   * concurrent delivery's of the same ids, and gives back only its own. Members this owner already
   * holds count as reserved even when the set is full; members another owner holds are reported.
   */
  async reserve(
    key: { pk: string; sk: string },
    members: readonly string[],
    limit: number,
    owner: string,
  ): Promise<Reservation> {
    const names: Record<string, string> = { '#owners': 'owners' };
    const set: string[] = [];
    const free: string[] = [];
    members.forEach((m, i) => {
      names[`#m${i}`] = m;
      set.push(`#owners.#m${i} = :owner`);
      free.push(`attribute_not_exists(#owners.#m${i})`);
    });
    const update = new UpdateCommand({
      TableName: this.tableName,
      Key: key,
      UpdateExpression: `SET ${set.join(', ')}`,
      ConditionExpression: [conditions.roomInMap, ...free].join(' AND '),
      ExpressionAttributeNames: names,
      ExpressionAttributeValues: { ':owner': owner, ':room': limit - members.length },
    });
    try {
      await this.sendCreatingMap(key, update);
      return { kind: 'reserved' };
    } catch (err) {
      if (!(err instanceof ConditionalCheckFailedException)) throw err;
    }
    const held = await this.reservations(key);
    const holders = new Map<string, string>();
    for (const m of members) {
      const by = held.get(m);
      if (by !== undefined && by !== owner) holders.set(m, by);
    }
    if (holders.size > 0) return { kind: 'held', holders };
    const missing = members.filter((m) => held.get(m) !== owner);
    if (missing.length === 0) return { kind: 'reserved' };
    // Some were ours already (a retry within this delivery): ask again for the rest alone.
    return missing.length < members.length ? this.reserve(key, missing, limit, owner) : { kind: 'full' };
  }

  /** Hands a reservation over from an owner known to be dead; false when it is no longer theirs. */
  async takeOverReservation(
    key: { pk: string; sk: string },
    member: string,
    from: string,
    to: string,
  ): Promise<boolean> {
    try {
      await this.doc.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: key,
          UpdateExpression: 'SET #owners.#m = :to',
          ConditionExpression: '#owners.#m = :from',
          ExpressionAttributeNames: { '#owners': 'owners', '#m': member },
          ExpressionAttributeValues: { ':from': from, ':to': to },
        }),
      );
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }

  /**
   * Removes members from a capacity set (idempotent). With `owner`, only the members that owner
   * still holds: a delivery undoing its own work never removes a concurrent delivery's reservation.
   */
  async unreserve(
    key: { pk: string; sk: string },
    members: readonly string[],
    owner?: string,
  ): Promise<void> {
    if (members.length === 0) return;
    if (owner === undefined) {
      const names: Record<string, string> = { '#owners': 'owners' };
      members.forEach((m, i) => {
        names[`#m${i}`] = m;
      });
      try {
        await this.doc.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: `REMOVE ${members.map((_, i) => `#owners.#m${i}`).join(', ')}`,
            ConditionExpression: 'attribute_exists(#owners)',
            ExpressionAttributeNames: names,
          }),
        );
      } catch (err) {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // no set: nothing to remove
      }
      return;
    }
    for (const m of members) {
      try {
        await this.doc.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: key,
            UpdateExpression: 'REMOVE #owners.#m',
            ConditionExpression: '#owners.#m = :owner',
            ExpressionAttributeNames: { '#owners': 'owners', '#m': m },
            ExpressionAttributeValues: { ':owner': owner },
          }),
        );
      } catch (err) {
        if (!(err instanceof ConditionalCheckFailedException)) throw err; // not (or no longer) ours
      }
    }
  }

  /** Who holds each member of a capacity set (member -> owner token). */
  async reservations(key: { pk: string; sk: string }): Promise<Map<string, string>> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.tableName, Key: key, ConsistentRead: true }),
    );
    const owners = out.Item?.owners as Record<string, unknown> | undefined;
    return new Map(Object.entries(owners ?? {}).map(([m, by]) => [m, String(by)]));
  }

  async members(key: { pk: string; sk: string }): Promise<Set<string>> {
    return new Set((await this.reservations(key)).keys());
  }

  /** Sends an update that sets map entries, creating the map first when the item has none yet. */
  private async sendCreatingMap(key: { pk: string; sk: string }, update: UpdateCommand): Promise<void> {
    try {
      await this.doc.send(update);
      return;
    } catch (err) {
      // DynamoDB cannot SET a path inside a map that does not exist yet.
      if (!(err instanceof Error && err.name === 'ValidationException' && /document path/i.test(err.message)))
        throw err;
    }
    await this.doc.send(
      new UpdateCommand({
        TableName: this.tableName,
        Key: key,
        UpdateExpression: 'SET #owners = if_not_exists(#owners, :empty)',
        ExpressionAttributeNames: { '#owners': 'owners' },
        ExpressionAttributeValues: { ':empty': {} },
      }),
    );
    await this.doc.send(update);
  }

  // ---- admin listings (Scan is for operators only, never on a request path) -------------------

  async listRequests(): Promise<RequestRecord[]> {
    return (await this.scanType('request')).map((i) => RequestRecord.parse(i));
  }

  async listBacking(): Promise<BackingRecord[]> {
    return (await this.scanType('backing')).map((i) => BackingRecord.parse(i));
  }

  private async scanType(type: string): Promise<Record<string, unknown>[]> {
    const input: ScanCommandInput = {
      TableName: this.tableName,
      FilterExpression: '#type = :t',
      ExpressionAttributeNames: { '#type': 'type' },
      ExpressionAttributeValues: { ':t': type },
    };
    const items: Record<string, unknown>[] = [];
    do {
      const out = await this.doc.send(new ScanCommand(input));
      items.push(...(out.Items ?? []));
      input.ExclusiveStartKey = out.LastEvaluatedKey;
    } while (input.ExclusiveStartKey);
    return items;
  }
}
