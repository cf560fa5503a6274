import type { BackingExpectation } from '../core/poolStore.ts';
import type { BackingRecord, Claim } from '../core/records.ts';
import { backingIndexAttributes, leasePartition, leaseSortKey, TTL_ATTRIBUTE } from './table.ts';

/**
 * The conditions and update expressions of the store's conditional writes, named and built here as
 * plain data (no client), so each rule is read in one place: the item modules (requestItems.ts,
 * backingItems.ts, resourcePointers.ts, reaperCursor.ts, labelItems.ts) send them and turn a failed
 * condition into a ConflictError or a domain answer.
 */

/** A resource pointer may be written (or removed) only while it is absent or names this backing node. */
export const pointsTo = '(attribute_not_exists(pk) OR backingNodeId = :backingNodeId)';
export const conditions = {
  itemDoesNotExist: 'attribute_not_exists(pk)',
  itemExists: 'attribute_exists(pk)',
  versionUnchanged: '#version = :expectedVersion',
  stateIsOneOf: (n: number) =>
    `#state IN (${Array.from({ length: n }, (_, i) => `:expectedState${i}`).join(', ')})`,
  usedIs: '#used = :expectedUsed',
} as const;

type Expression = {
  UpdateExpression?: string;
  ConditionExpression: string;
  ExpressionAttributeNames: Record<string, string>;
  ExpressionAttributeValues?: Record<string, unknown>;
};

/**
 * Marks one node of a request released: the node must still be pending or ready, in a placed request;
 * a held node only by a forced (operator) release.
 */
export function releaseNodeUpdate(
  index: number,
  now: number,
  force: boolean,
  reason?: string,
  /**
   * Set when the request is known to have this one node: the update also gives it its purge time
   * (TTL_ATTRIBUTE), conditioned on the request having one node (the release then ends it).
   */
  expiresAt?: number,
): Expression {
  const why = reason === undefined ? '' : `, #nodes[${index}].reason = :reason`;
  const purge = expiresAt === undefined ? '' : ', #expiresAt = :expiresAt';
  return {
    UpdateExpression: `SET #nodes[${index}].#state = :released, #nodes[${index}].releasedAt = :now${why}, updatedAt = :now${purge} ADD #version :one`,
    // A held node is released only by a forced (operator) release.
    ConditionExpression: `#nodes[${index}].#state IN (:pending, :ready) AND #rstate IN (:pending, :fulfilled)${
      force ? '' : ` AND attribute_not_exists(#nodes[${index}].held)`
    } AND attribute_not_exists(#nodes[${index}].takenBy)${expiresAt === undefined ? '' : ' AND size(#nodes) = :one'}`,
    ExpressionAttributeNames: {
      '#nodes': 'nodes',
      '#state': 'state',
      '#rstate': 'state',
      '#version': 'version',
      ...(expiresAt === undefined ? {} : { '#expiresAt': TTL_ATTRIBUTE }),
    },
    ExpressionAttributeValues: {
      ':released': 'released',
      ':now': now,
      ':one': 1,
      ':pending': 'pending',
      ':ready': 'ready',
      ':fulfilled': 'fulfilled',
      ...(reason === undefined ? {} : { ':reason': reason }),
      ...(expiresAt === undefined ? {} : { ':expiresAt': expiresAt }),
    },
  };
}

/**
 * Takes the free node of a min-ready request (core/minReady.ts takenSpare, as one update): `takenBy` set
 * on node 0 if it is ready, untaken and not held, in `poolKey`; a new version, so every version-checked
 * put of the request (a move, an end) sees it. No index attribute follows `takenBy`.
 */
export function takeSpareUpdate(
  poolKey: string,
  takenBy: { readonly node: string; readonly by: string; readonly at: number },
): Expression {
  return {
    UpdateExpression: 'SET #nodes[0].#takenBy = :takenBy, updatedAt = :at ADD #version :one',
    ConditionExpression:
      '#poolKey = :pool AND #nodes[0].#state = :ready AND attribute_exists(#nodes[0].backingNodeId) AND attribute_not_exists(#nodes[0].#takenBy) AND (attribute_not_exists(#nodes[0].held) OR #nodes[0].held = :no)',
    ExpressionAttributeNames: {
      '#nodes': 'nodes',
      '#state': 'state',
      '#takenBy': 'takenBy',
      '#poolKey': 'poolKey',
      '#version': 'version',
    },
    ExpressionAttributeValues: {
      ':takenBy': takenBy,
      ':at': takenBy.at,
      ':one': 1,
      ':pool': poolKey,
      ':ready': 'ready',
      ':no': false,
    },
  };
}

/**
 * Gives an ended request its purge time (DynamoDB's TTL attribute, table.ts TTL_ATTRIBUTE), keeping one
 * already set; only while the item exists (a deleted one is not written back).
 */
export function expiresAtUpdate(expiresAt: number): Expression {
  return {
    UpdateExpression: 'SET #expiresAt = if_not_exists(#expiresAt, :expiresAt)',
    ConditionExpression: 'attribute_exists(pk)',
    ExpressionAttributeNames: { '#expiresAt': TTL_ATTRIBUTE },
    ExpressionAttributeValues: { ':expiresAt': expiresAt },
  };
}

/**
 * The lease conditions (docs/table.md, "Leases"). Renewal and the reaper's lapse are both conditioned on
 * the expiry their writer read, so of a renewal and a lapse that race exactly one wins: the renewal moves
 * the expiry (the lapse then fails), or the lapse marks it (the renewal then fails).
 */
export const leaseConditions = {
  expiryIsAsRead: 'leaseExpiresAt = :readExpiry',
  notLapsed: 'attribute_not_exists(leaseLapsedAt)',
  inLeasePartition: 'fpk = :leasePartition',
} as const;

/** Renews a lease as read: new length and expiry, its LEASE sort key moved; every whole-item writer sees the version. */
export function renewLeaseUpdate(
  requestId: string,
  readExpiry: number,
  seconds: number,
  expiresAt: number,
  now: number,
): Expression {
  return {
    UpdateExpression:
      'SET lease = :seconds, leaseExpiresAt = :expiresAt, fsk = :fsk, updatedAt = :now ADD #version :one',
    ConditionExpression: [
      leaseConditions.expiryIsAsRead,
      leaseConditions.notLapsed,
      leaseConditions.inLeasePartition,
    ].join(' AND '),
    ExpressionAttributeNames: { '#version': 'version' },
    ExpressionAttributeValues: {
      ':seconds': seconds,
      ':expiresAt': expiresAt,
      ':fsk': leaseSortKey(expiresAt, requestId),
      ':now': now,
      ':one': 1,
      ':readExpiry': readExpiry,
      ':leasePartition': leasePartition(requestId),
    },
  };
}

/** The reaper's mark of a lapsed lease, as read: after it no renewal is accepted. */
export function lapseLeaseUpdate(readExpiry: number, now: number): Expression {
  return {
    UpdateExpression: 'SET leaseLapsedAt = :now, updatedAt = :now ADD #version :one',
    ConditionExpression: `${leaseConditions.expiryIsAsRead} AND ${leaseConditions.notLapsed}`,
    ExpressionAttributeNames: { '#version': 'version' },
    ExpressionAttributeValues: { ':now': now, ':one': 1, ':readExpiry': readExpiry },
  };
}

/**
 * Takes a request out of LEASE once it holds nothing more the lease could release, as read (its sort key
 * unchanged: no renewal since). The version is left alone: the item's record does not change.
 */
export function dropLeaseUpdate(requestId: string, readExpiry: number): Expression {
  return {
    UpdateExpression: 'REMOVE #fpk, #fsk',
    ConditionExpression: '#fsk = :readSortKey',
    ExpressionAttributeNames: { '#fpk': 'fpk', '#fsk': 'fsk' },
    ExpressionAttributeValues: { ':readSortKey': leaseSortKey(readExpiry, requestId) },
  };
}

/** A backing node put only as read: same version and, optionally, state among `states` and `used` slots. */
export function backingExpected(expect: BackingExpectation): Expression {
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
  return {
    ConditionExpression: parts.join(' AND '),
    ExpressionAttributeNames: names,
    ExpressionAttributeValues: values,
  };
}

/**
 * Claims `slot` for `nodeId`: the slot is free, the backing node still takes nodes (state as read, room,
 * not drained, within max-age). A claim that takes the last free slot (by what was read) also takes the
 * item out of the free index, conditioned on `used` being what was read.
 */
export function claimSlotUpdate(
  read: BackingRecord,
  slot: number,
  nodeId: string,
  claim: Claim,
  end?: number,
): Expression {
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
  // The node's expected end, where the item has the map (items from before it existed do not).
  if (end !== undefined && read.ends !== undefined) {
    set.push('#ends.#slot = :end');
    names['#ends'] = 'ends';
    values[':end'] = end;
  }
  let remove = '';
  if (filling) {
    condition.push('#used = :readUsed');
    values[':readUsed'] = read.used;
    remove = ' REMOVE fpk, fsk';
  } else {
    set.push('fsk = :fsk'); // fullest first, as of this claim (a concurrent one may be newer)
    values[':fsk'] = after.fsk;
  }
  return {
    UpdateExpression: `SET ${set.join(', ')}${remove}`,
    ConditionExpression: condition.join(' AND '),
    ExpressionAttributeNames: names,
    ExpressionAttributeValues: values,
  };
}

// ---- the github function's items (githubItems.ts) ------------------------------------------------------

/**
 * Claims a job's runner start for one handling: the job was seen queued (not completed), and no runner
 * is claimed, or the claim is stale (older than `stale`) and started nothing.
 */
export function claimRunnerUpdate(by: string, now: number, stale: number): Expression {
  return {
    UpdateExpression: 'SET runner = :runner',
    ConditionExpression: `${conditions.itemExists} AND #state = :queued AND (attribute_not_exists(runner) OR (attribute_not_exists(runner.commandId) AND runner.#at < :stale))`,
    ExpressionAttributeNames: { '#state': 'state', '#at': 'at' },
    ExpressionAttributeValues: { ':queued': 'queued', ':runner': { by, at: now }, ':stale': stale },
  };
}

/** Gives back a claim of `by` that started nothing. */
export function dropClaimUpdate(by: string): Expression {
  return {
    UpdateExpression: 'REMOVE runner',
    ConditionExpression: 'runner.#by = :by AND attribute_not_exists(runner.commandId)',
    ExpressionAttributeNames: { '#by': 'by' },
    ExpressionAttributeValues: { ':by': by },
  };
}

/** Records the runner a claim of `by` started, beside the claim. */
export function runnerStartedUpdate(
  by: string,
  runner: { readonly name: string; readonly instanceId: string; readonly commandId: string },
): Expression {
  return {
    UpdateExpression: 'SET runner.#name = :name, runner.instanceId = :instance, runner.commandId = :command',
    ConditionExpression: 'runner.#by = :by',
    ExpressionAttributeNames: { '#name': 'name', '#by': 'by' },
    ExpressionAttributeValues: {
      ':name': runner.name,
      ':instance': runner.instanceId,
      ':command': runner.commandId,
      ':by': by,
    },
  };
}

/** Stamps the end of a job's runner, if it has one. */
export function runnerEndedUpdate(now: number): Expression {
  return {
    UpdateExpression: 'SET runner.endedAt = :now',
    ConditionExpression: 'attribute_exists(runner)',
    ExpressionAttributeNames: {},
    ExpressionAttributeValues: { ':now': now },
  };
}

/** Claims a scan of GitHub's queued jobs: none recorded since `due`. */
export function claimScanUpdate(now: number, due: number): Expression {
  return {
    UpdateExpression: 'SET #at = :now',
    ConditionExpression: 'attribute_not_exists(#at) OR #at <= :due',
    ExpressionAttributeNames: { '#at': 'at' },
    ExpressionAttributeValues: { ':now': now, ':due': due },
  };
}
