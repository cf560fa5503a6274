import { z } from 'zod';
import { BackingContract } from './contract.ts';
import { BackingState, NodeState, RequestState } from './states.ts';

/**
 * The records the core reasons about. The store persists them as items (adding keys and index
 * attributes, see shared/store/table.ts) and parses what it reads back with these schemas.
 */

const values = <T extends Record<string, string>>(o: T) => Object.values(o) as [T[keyof T], ...T[keyof T][]];

export const Attributes = z.record(z.string(), z.unknown());
export type Attributes = z.infer<typeof Attributes>;

/**
 * Who claimed a slot and when. `by` is the owner token of the delivery (one handling of a message)
 * that claimed it: only that delivery gives the claim back or builds on it, so two deliveries of one
 * message never undo each other's work (see shared/usecases/place/placement.ts).
 */
export const Claim = z.union([
  z.object({ at: z.number(), by: z.string() }),
  // Written before claims had owners (a claim time alone): read as an owner known to be gone.
  z.number().transform((at) => ({ at, by: 'unowned' })),
]);
export type Claim = z.output<typeof Claim>;

export const BackingRecord = z.object({
  id: z.string(),
  /** The metastatic pool (`provider/pool`) and label this backing node serves. */
  poolKey: z.string(),
  label: z.string(),
  /** The backing pool and label it was launched from. */
  backingPoolKey: z.string(),
  backingLabel: z.string(),
  state: z.enum(values(BackingState)),
  slots: z.number().int().positive(),
  used: z.number().int().nonnegative(),
  /** slot index (as a string) -> node id */
  slotMap: z.record(z.string(), z.string()),
  /** Optimistic-concurrency version: every write requires the version it read and increments it. */
  version: z.number().int().nonnegative(),
  attempt: z.number().int().positive(),
  resourceId: z.string().optional(),
  /**
   * When `resourceId` was recorded. An eventually consistent provider's "not found" for it means gone only
   * RESOURCE_NOT_FOUND_GRACE_MS after this (records from before it existed fall back to `launchedAt`).
   */
  resourceRecordedAt: z.number().optional(),
  host: z.string().optional(),
  port: z.number().int().optional(),
  attributes: Attributes.optional(),
  /** Epoch milliseconds. */
  launchedAt: z.number(),
  readyAt: z.number().optional(),
  lastUsedAt: z.number(),
  retiredAt: z.number().optional(),
  stoppedAt: z.number().optional(),
  /** After this instant the backing node takes no new nodes (max-age); undefined = never. */
  noNewNodesAfter: z.number().optional(),
  /** Takes no new nodes (operator drain, or max-age noticed); goes as soon as it is empty. */
  drained: z.boolean().optional(),
  /** When the provider first reported it running; boot-timeout counts from here. */
  runningAt: z.number().optional(),
  /**
   * slot -> the claim, for claims not yet confirmed by a recorded node. A claim whose handler crashed
   * before recording its node is given back by the reaper after the slot lease.
   */
  claims: z.record(z.string(), Claim).optional(),
  /**
   * slot -> when its node is expected to be released (epoch ms), for nodes whose request gave an
   * expected duration: duration-aware placement (core/backing.ts, compareByExpectedEnd).
   */
  ends: z.record(z.string(), z.number()).optional(),
  reason: z.string().optional(),
  /**
   * What its nodes carry besides host and port (username, connection type, python-path, shell-type),
   * from its backing label as configured when it was launched (core/contract.ts). Absent on records
   * written before it existed (LEGACY_CONTRACT stands in).
   */
  contract: BackingContract.optional(),
});
export type BackingRecord = z.infer<typeof BackingRecord>;

export const NodeRecord = z.object({
  id: z.string(),
  label: z.string(),
  state: z.enum(values(NodeState)),
  backingNodeId: z.string().optional(),
  slot: z.number().int().nonnegative().optional(),
  host: z.string().optional(),
  port: z.number().int().optional(),
  attributes: Attributes.optional(),
  readyAt: z.number().optional(),
  releasedAt: z.number().optional(),
  /** SSH host keys (`type base64`), scanned when host-key-checking is on, else the backing node's. */
  hostKeys: z.array(z.string()).optional(),
  /**
   * The node contract (core/contract.ts), copied from its backing node when it becomes ready: whom to
   * log in as (per slot with per-slot users), how (`ssh`), Nodepool's python-path and shell-type
   * (absent: sh).
   */
  username: z.string().optional(),
  connectionType: z.string().optional(),
  pythonPath: z.string().optional(),
  shellType: z.string().optional(),
  /** Backing nodes this node has been placed on so far (launch-retries bounds it). */
  attempts: z.number().int().positive().optional(),
  /** Kept by an operator: only an explicit (forced) release frees it. */
  held: z.boolean().optional(),
  reason: z.string().optional(),
  /**
   * On a node that took a spare (core/minReady.ts): that node's id. Its slot and its place in
   * max-servers stay the spare's; releasing or failing this node ends the spare too.
   */
  spare: z.string().optional(),
  /** On a spare: the node that took it, and the delivery (owner token) that did, when. */
  takenBy: z.object({ node: z.string(), by: z.string(), at: z.number() }).optional(),
  /**
   * On a spare just moved onto a fuller backing node (usecases/ready/minReady.ts moveSpare): the slot
   * it held before, until that slot is given back (the move's last step; a move cut short there is
   * finished by the next upkeep, or when the node ends).
   */
  movedFrom: z.object({ backingNodeId: z.string(), slot: z.number().int().nonnegative() }).optional(),
});
export type NodeRecord = z.infer<typeof NodeRecord>;

export const RequestRecord = z.object({
  id: z.string(),
  labels: z.array(z.string()),
  requestor: z.string().optional(),
  priority: z.number().optional(),
  /**
   * The requestor's `priority-ceiling`, when it is worse (higher) than the priority the message claimed
   * (`priority`, kept as sent: it is part of the body): the request is served at it (core/priority.ts,
   * priorityOf, trustedPriority). Absent when no ceiling bound it.
   */
  priorityCeiling: z.number().optional(),
  /** The requestor's expected duration, seconds (`expected-duration`): placement uses it. */
  expectedDuration: z.number().optional(),
  /**
   * A request by shape: what each node asked for, as written (core/shapes.ts). `labels` holds the label
   * the pool chose for each (empty when none fits: the request failed).
   */
  shapes: z
    .array(
      z.object({ cores: z.number().optional(), memory: z.string().optional(), disk: z.string().optional() }),
    )
    .optional(),
  /** Hash of the message body, to tell a redelivery from a reuse of the id with another body. */
  bodyHash: z.string(),
  state: z.enum(values(RequestState)),
  reason: z.string().optional(),
  poolKey: z.string().optional(),
  /**
   * While `requested`: the owner token of the delivery that recorded it, or that made itself the placer
   * to take over an earlier receive's claims (Recording.fence): a delivery of an earlier receive of the
   * same message that finds it records nothing more.
   */
  placer: z.string().optional(),
  createdAt: z.number(),
  updatedAt: z.number(),
  /**
   * When it was placed (left `requested`): a pending request's deadline counts from here (core/pools.ts
   * pendingTimeoutOf). Absent on records placed before it existed (their updatedAt stands in).
   */
  placedAt: z.number().optional(),
  /** The client lease, seconds (core/leases.ts): the message's, else its labels' default-lease. */
  lease: z.number().optional(),
  /** When the lease lapses unless renewed (epoch ms); the reaper releases the nodes after it. */
  leaseExpiresAt: z.number().optional(),
  /** When the reaper found the lease lapsed: no renewal is accepted after it. */
  leaseLapsedAt: z.number().optional(),
  version: z.number().int().nonnegative(),
  nodes: z.array(NodeRecord),
});
export type RequestRecord = z.infer<typeof RequestRecord>;
