/**
 * The bad-input catalogue (issue 5): every kind of bad input a user can send, each with the exact error
 * the user sees, that the rest of its batch goes on, and that nothing is retried forever.
 *
 * Queue cases run one bad body in one batch with a known-good request (or, on the fulfil queue, a good
 * event) against one embedded pool; configuration cases run through the loader.
 */

import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { formatConfigErrors, parseConfig } from '../../shared/config/load.ts';
import { LEASE_RULE } from '../../shared/core/leases.ts';
import type { Log } from '../../shared/core/log.ts';
import { MAX_NODE_SET, type RequestMessage } from '../../shared/core/messages.ts';
import type { BackingRecord, RequestRecord } from '../../shared/core/records.ts';
import { requestBodyHash } from '../../shared/core/request.ts';
import {
  SpotInterruptionDetailType,
  StateChangeDetailType,
  stateChangeEvent,
} from '../../shared/core/stateChanges.ts';
import { NAME_RULE } from '../../shared/fields/fields.ts';
import { makeDeadLetterHandler } from '../../shared/handlers/requestHandler.ts';
import { LOCAL_EVENT_SOURCE } from '../../shared/providers/local/localEvents.ts';
import { DynamoStore } from '../../shared/store/dynamoStore.ts';
import { endRequestOf } from '../../shared/usecases/place/requests.ts';
import { holdNode } from '../../shared/usecases/reap/operator.ts';
import { largeNode, poolConfig, type Settings, smallNode } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

// ---- inputs -------------------------------------------------------------------------------------------

/**
 * Four metastatic pools on one local backing label (boot-delay 0): `main` takes every good request (128
 * slots, so they all pack onto one backing node), `side` offers another label, `capped` allows two nodes,
 * `off` is disabled.
 */
const poolOf = (name: string, label: string, settings: Settings = {}): Settings => ({
  name,
  ...settings,
  labels: [smallNode({ name: label, 'max-parallel-jobs': 128, 'grace-time': 60 })],
});
const POOL_CONFIG = poolConfig({
  backing: { labels: [largeNode({ 'boot-delay': 0 })] },
  meta: {
    labels: [smallNode({ 'max-parallel-jobs': 128, 'grace-time': 60 })],
    morePools: [
      poolOf('side', 'side-node'),
      poolOf('capped', 'capped-node', { 'max-servers': 2, 'max-lease': 3600 }),
      poolOf('off', 'off-node', { 'max-servers': 0 }),
    ],
  },
});

const MAX_RECEIVES = 3;
const CONFIGURED = '(configured: capped-node, off-node, side-node, small-node)';
const ID_RULE = 'must be 1-128 characters of A-Z a-z 0-9 . _ : - starting with a letter or digit';
const PRIORITY_RULE = 'must be an integer from -1000000 to 1000000 (lower is served first)';
const SPARE_ID_RULE = 'must not start with "min-ready:": those are the pool\'s own min-ready requests';

const json = (value: unknown): string => JSON.stringify(value);
const request = (id: unknown, labels: unknown = ['small-node'], extra: Record<string, unknown> = {}) =>
  json({ kind: 'request', id, labels, ...extra });
const release = (nodeId: unknown, extra: Record<string, unknown> = {}) =>
  json({ kind: 'release', nodeId, ...extra });

/** What JSON.parse says about a body on this Node version (V8's wording differs between releases). */
function jsonError(body: string): string {
  try {
    JSON.parse(body);
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error(`${body} is valid JSON`);
}

// ---- log capture --------------------------------------------------------------------------------------

interface LogEntry {
  readonly level: keyof Log;
  readonly message: string;
  readonly fields: Record<string, unknown>;
}

function capturingLog(into: LogEntry[]): Log {
  const at =
    (level: keyof Log) =>
    (message: string, ...extra: Record<string, unknown>[]): void => {
      into.push({ level, message, fields: Object.assign({}, ...extra) });
    };
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') };
}

// ---- the catalogue: request queue ---------------------------------------------------------------------

/** A body the request function refuses: consumed at once, with a reason. */
interface RejectedCase {
  readonly name: string;
  readonly body: string;
  /** The exact reason. */
  readonly reason: string;
  /** Logged as `rejected message` (what an operator sees when the body names no usable request id). */
  readonly logged: boolean;
  /** Recorded as a failed request under this id (what the requestor sees). */
  readonly recordedAs?: string;
  /** Further checks: e.g. that the request whose id the body reuses is untouched. */
  readonly check?: (h: Harness) => Promise<void>;
}

/** The request `orig` as placed before the cases ran; reused-id cases must leave it exactly so. */
let origBefore: RequestRecord | undefined;

async function origUntouched(h: Harness): Promise<void> {
  expect(await h.pool.context.store.getRequest('orig')).toEqual(origBefore);
  const main = await mainBacking(h);
  const mine = Object.values(main.slotMap).filter((id) => id.startsWith('orig/'));
  expect(mine).toEqual(['orig/0']); // a second node claimed for the reused id was given back
}

async function notRecorded(h: Harness, id: string): Promise<void> {
  expect(await h.pool.context.store.getRequest(id)).toBeUndefined();
}

async function mainBacking(h: Harness): Promise<BackingRecord> {
  const main = (await h.pool.context.store.listBacking()).filter((b) => b.poolKey === 'meta/main');
  expect(main).toHaveLength(1); // every good request packed onto one backing node
  return main[0] as BackingRecord;
}

const malformed = (name: string, body: string): RejectedCase => ({
  name: `malformed JSON: ${name}`,
  body,
  reason: `malformed JSON: ${jsonError(body)}`,
  logged: true,
});

const notAnObject = (name: string, body: string): RejectedCase => ({
  name: `not a JSON object: ${name}`,
  body,
  reason: 'message must be a JSON object',
  logged: true,
});

const REJECTED: readonly RejectedCase[] = [
  malformed('truncated', '{"kind":"request","id":"trunc","labels":["small-'),
  malformed('trailing comma', '{"kind":"request","id":"comma","labels":["small-node"],}'),
  malformed('empty body', ''),
  malformed('single quotes', "{'kind':'request','id':'quotes','labels':['small-node']}"),
  malformed('form encoding', 'kind=request&id=form&labels=small-node'),
  notAnObject('null', 'null'),
  notAnObject('an array of requests', `[${request('in-array')}]`),
  notAnObject('a number', '42'),
  notAnObject('a string', '"request"'),
  {
    name: 'kind missing (the id is not recorded)',
    body: json({ id: 'no-kind', labels: ['small-node'] }),
    reason: 'missing "kind" (expected "request", "release", "cancel" or "renew")',
    logged: true,
    check: (h) => notRecorded(h, 'no-kind'),
  },
  {
    name: 'unknown kind',
    body: json({ kind: 'launch', id: 'kind-launch', labels: ['small-node'] }),
    reason: 'unknown kind "launch" (expected "request", "release", "cancel" or "renew")',
    logged: true,
    recordedAs: 'kind-launch',
  },
  {
    name: 'kind in the wrong case',
    body: json({ kind: 'Request', id: 'kind-case', labels: ['small-node'] }),
    reason: 'unknown kind "Request" (expected "request", "release", "cancel" or "renew")',
    logged: true,
    recordedAs: 'kind-case',
  },
  {
    name: 'kind of the wrong type',
    body: json({ kind: 1, id: 'kind-number', labels: ['small-node'] }),
    reason: 'unknown kind 1 (expected "request", "release", "cancel" or "renew")',
    logged: true,
    recordedAs: 'kind-number',
  },
  {
    name: 'unknown kind without an id',
    body: json({ kind: 'launch' }),
    reason: 'unknown kind "launch" (expected "request", "release", "cancel" or "renew")',
    logged: true,
  },
  {
    name: 'request without an id',
    body: json({ kind: 'request', labels: ['small-node'] }),
    reason: 'invalid request message: id: is required',
    logged: true,
  },
  {
    name: 'id of the wrong type',
    body: request(42),
    reason: 'invalid request message: id: must be a string, not a number',
    logged: true,
  },
  {
    name: 'id with spaces (not recorded)',
    body: request('my request'),
    reason: `invalid request message: id: ${ID_RULE}`,
    logged: true,
    check: (h) => notRecorded(h, 'my request'),
  },
  {
    name: 'id of 129 characters',
    body: request('a'.repeat(129)),
    reason: `invalid request message: id: ${ID_RULE}`,
    logged: true,
  },
  {
    name: "id starting with '-'",
    body: request('-dash'),
    reason: `invalid request message: id: ${ID_RULE}`,
    logged: true,
  },
  {
    name: "id with a '/' (reserved for node ids)",
    body: request('orig/0'),
    reason: `invalid request message: id: ${ID_RULE}`,
    logged: true,
  },
  {
    name: 'empty id',
    body: request(''),
    reason: `invalid request message: id: ${ID_RULE}`,
    logged: true,
  },
  {
    name: 'labels missing',
    body: json({ kind: 'request', id: 'labels-missing' }),
    reason: 'invalid request message: labels: a request needs "labels" or "shapes"',
    logged: true,
    recordedAs: 'labels-missing',
  },
  {
    name: 'labels not an array',
    body: request('labels-string', 'small-node'),
    reason: 'invalid request message: labels: must be an array, not a string',
    logged: true,
    recordedAs: 'labels-string',
  },
  {
    name: 'empty node set',
    body: request('labels-empty', []),
    reason: 'invalid request message: labels: a request needs at least one label',
    logged: true,
    recordedAs: 'labels-empty',
  },
  {
    name: 'a label that is not a string',
    body: request('labels-number', ['small-node', 1]),
    reason: 'invalid request message: labels.1: must be a string, not a number',
    logged: true,
    recordedAs: 'labels-number',
  },
  {
    name: 'an empty label',
    body: request('labels-blank', ['small-node', '']),
    reason: 'invalid request message: labels.1: a label must not be empty',
    logged: true,
    recordedAs: 'labels-blank',
  },
  {
    name: `node set of MAX_NODE_SET + 1 (${MAX_NODE_SET + 1}) labels`,
    body: request('labels-65', Array<string>(MAX_NODE_SET + 1).fill('small-node')),
    reason: `invalid request message: labels: a node set has at most ${MAX_NODE_SET} labels`,
    logged: true,
    recordedAs: 'labels-65',
  },
  {
    name: 'misspelt key "label" instead of "labels"',
    body: json({ kind: 'request', id: 'label-typo', label: ['small-node'] }),
    reason: 'invalid request message: unknown key "label"; labels: a request needs "labels" or "shapes"',
    logged: true,
    recordedAs: 'label-typo',
  },
  {
    name: 'an unknown label',
    body: request('unknown-label', ['gpu-node']),
    reason: `unknown label "gpu-node" ${CONFIGURED}`,
    logged: false,
    recordedAs: 'unknown-label',
  },
  {
    name: 'several unknown labels (labels are case-sensitive, repeats named once)',
    body: request('unknown-labels', ['gpu-node', 'Small-Node', 'gpu-node']),
    reason: `unknown labels "gpu-node", "Small-Node" ${CONFIGURED}`,
    logged: false,
    recordedAs: 'unknown-labels',
  },
  {
    name: 'a known label with an unknown one',
    body: request('unknown-mixed', ['small-node', 'gpu-node']),
    reason: `unknown label "gpu-node" ${CONFIGURED}`,
    logged: false,
    recordedAs: 'unknown-mixed',
  },
  {
    name: 'labels no single pool offers together',
    body: request('no-pool', ['small-node', 'side-node']),
    reason: 'no pool offers all of the labels small-node, side-node together',
    logged: false,
    recordedAs: 'no-pool',
  },
  {
    name: 'node set larger than max-servers of every pool',
    body: request('too-many', ['capped-node', 'capped-node', 'capped-node']),
    reason: 'a node set of 3 exceeds max-servers of every pool that offers it (largest: 2)',
    logged: false,
    recordedAs: 'too-many',
  },
  {
    name: `huge node set (${MAX_NODE_SET} labels)`,
    body: request('huge', Array<string>(MAX_NODE_SET).fill('capped-node')),
    reason: `a node set of ${MAX_NODE_SET} exceeds max-servers of every pool that offers it (largest: 2)`,
    logged: false,
    recordedAs: 'huge',
  },
  {
    name: 'the only pool offering the label is disabled (max-servers 0)',
    body: request('disabled', ['off-node']),
    reason: 'every pool offering off-node is disabled (max-servers <= 0): meta/off',
    logged: false,
    recordedAs: 'disabled',
  },
  {
    name: 'an extra unknown key',
    body: request('extra-key', ['small-node'], { colour: 'red' }),
    reason: 'invalid request message: unknown key "colour"',
    logged: true,
    recordedAs: 'extra-key',
  },
  {
    name: 'priority not an integer',
    body: request('prio-float', ['small-node'], { priority: 1.5 }),
    reason: 'invalid request message: priority: must be an integer, not 1.5',
    logged: true,
    recordedAs: 'prio-float',
  },
  {
    name: 'priority as a string',
    body: request('prio-string', ['small-node'], { priority: '5' }),
    reason: 'invalid request message: priority: must be a number, not a string',
    logged: true,
    recordedAs: 'prio-string',
  },
  // Issue 22, defect 4: priorities are bounded as configuration priorities are.
  {
    name: 'priority above 1e6 (2e9 waited behind the min-ready nodes)',
    body: request('prio-huge', ['small-node'], { priority: 2e9 }),
    reason: `invalid request message: priority: ${PRIORITY_RULE}`,
    logged: true,
    recordedAs: 'prio-huge',
  },
  {
    name: 'priority below -1e6',
    body: request('prio-low', ['small-node'], { priority: -1_000_001 }),
    reason: `invalid request message: priority: ${PRIORITY_RULE}`,
    logged: true,
    recordedAs: 'prio-low',
  },
  // Issue 22, defect 2: numbers DynamoDB cannot store (magnitude below 1e-130) were retried forever.
  {
    name: 'a shape of 1e-300 cores (DynamoDB: Number underflow)',
    body: json({ kind: 'request', id: 'sh-2', shapes: [{ cores: 1e-300 }] }),
    reason: 'invalid request message: shapes.0.cores: must be at least 0.001 (a thousandth of a core)',
    logged: true,
    recordedAs: 'sh-2',
  },
  {
    name: 'an expected-duration of 1e-300 seconds',
    body: request('dur-tiny', ['small-node'], { 'expected-duration': 1e-300 }),
    reason: 'invalid request message: expected-duration: must be at least 1 second',
    logged: true,
    recordedAs: 'dur-tiny',
  },
  {
    name: 'requestor of 257 characters',
    body: request('long-requestor', ['small-node'], { requestor: 'r'.repeat(257) }),
    reason: 'invalid request message: requestor: must be at most 256 characters',
    logged: true,
    recordedAs: 'long-requestor',
  },
  {
    name: 'requestor not a string',
    body: request('requestor-number', ['small-node'], { requestor: 7 }),
    reason: 'invalid request message: requestor: must be a string, not a number',
    logged: true,
    recordedAs: 'requestor-number',
  },
  {
    name: 'same request id, different labels (the original untouched)',
    body: request('orig', ['small-node', 'small-node'], { requestor: 'alice' }),
    reason:
      'request id "orig" is already used by another request (labels small-node, requestor alice); this one differs in labels: use a new id for a new request',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'same request id, same labels, different priority',
    body: request('orig', ['small-node'], { requestor: 'alice', priority: 5 }),
    reason:
      'request id "orig" is already used by another request (labels small-node, requestor alice); this one differs in priority: use a new id for a new request',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'same request id with an invalid body (not recorded over the original)',
    body: request('orig', []),
    reason: 'invalid request message: labels: a request needs at least one label',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'an id first sent with a typo, sent again corrected',
    body: request('typo', ['small-node'], { priority: 1 }),
    reason:
      'request id "typo" is already used by another request (labels small-node); this one differs in priority: use a new id for a new request',
    logged: true,
    check: async (h) => {
      expect(await h.pool.context.store.getRequest('typo')).toMatchObject({
        state: 'failed',
        reason: 'invalid request message: unknown key "prio"',
      });
    },
  },
  // Issue 22, defect 3: the pool's own min-ready ids cannot be written or ended by any message.
  {
    name: 'cancel of a min-ready request (not recorded)',
    body: json({ kind: 'cancel', id: 'min-ready:small-node:0:1' }),
    reason: `invalid cancel message: id: ${SPARE_ID_RULE}`,
    logged: true,
    check: (h) => notRecorded(h, 'min-ready:small-node:0:1'),
  },
  {
    name: 'request under a min-ready id (nothing recorded under its id)',
    body: request('min-ready:small-node:0:2'),
    reason: `invalid request message: id: ${SPARE_ID_RULE}`,
    logged: true,
    check: (h) => notRecorded(h, 'min-ready:small-node:0:2'),
  },
  {
    name: 'unknown kind under a min-ready id (nothing recorded under its id)',
    body: json({ kind: 'launch', id: 'min-ready:small-node:0:3' }),
    reason: 'unknown kind "launch" (expected "request", "release", "cancel" or "renew")',
    logged: true,
    check: (h) => notRecorded(h, 'min-ready:small-node:0:3'),
  },
  {
    name: 'release without nodeId or id',
    body: json({ kind: 'release' }),
    reason:
      'invalid release message: nodeId: a release needs "nodeId" (one node) or "id" (every node of a request)',
    logged: true,
  },
  {
    name: 'release with an empty nodeId',
    body: release(''),
    reason: 'invalid release message: nodeId: must not be empty',
    logged: true,
  },
  {
    name: 'release with a nodeId of the wrong type',
    body: release(7),
    reason: 'invalid release message: nodeId: must be a string, not a number',
    logged: true,
  },
  {
    name: 'release with force not a boolean (nothing released)',
    body: release('held/0', { force: 'yes' }),
    reason: 'invalid release message: force: must be a boolean, not a string',
    logged: true,
    check: async (h) => {
      expect((await h.pool.context.store.getRequest('held'))?.nodes[0]).toMatchObject({
        state: 'pending',
        held: true,
      });
    },
  },
  {
    name: 'release with both nodeId and a request id',
    body: release('orig/0', { id: 'orig' }),
    reason: 'invalid release message: id: give "nodeId" or "id", not both',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'release of a request id instead of a node id',
    body: release('orig'),
    reason: 'unknown node "orig": node ids look like <request-id>/<index>',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'release of a malformed node id (leading zero)',
    body: release('orig/00'),
    reason: 'unknown node "orig/00": node ids look like <request-id>/<index>',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'release of a node of an unknown request',
    body: release('nobody/0'),
    reason: 'unknown node "nobody/0"',
    logged: true,
  },
  {
    name: 'release of a node index beyond the node set',
    body: release('orig/5'),
    reason: 'unknown node "orig/5"',
    logged: true,
    check: origUntouched,
  },
  // Issue 23: leases, renewals and the release of a whole request.
  ...[0, -60, 9, 12.5, 604_801, 10_000_000].map(
    (lease): RejectedCase => ({
      name: `request with a lease of ${lease}`,
      body: request(`lease-${String(lease).replace(/[^0-9]/g, '')}`, ['small-node'], { lease }),
      reason: `invalid request message: lease: ${Number.isInteger(lease) ? LEASE_RULE : `must be an integer, not ${lease}`}`,
      logged: true,
      recordedAs: `lease-${String(lease).replace(/[^0-9]/g, '')}`,
    }),
  ),
  {
    name: 'request with a lease as a string',
    body: request('lease-string', ['small-node'], { lease: '60' }),
    reason: 'invalid request message: lease: must be a number, not a string',
    logged: true,
    recordedAs: 'lease-string',
  },
  {
    name: 'request with a lease above the label max-lease (recorded failed)',
    body: request('lease-above', ['capped-node'], { lease: 7200 }),
    reason: 'lease 7200 s is above the maximum of 3600 s (max-lease)',
    logged: false,
    recordedAs: 'lease-above',
  },
  {
    name: 'renew with an unknown key',
    body: json({ kind: 'renew', id: 'orig', until: 5 }),
    reason: 'invalid renew message: unknown key "until"',
    logged: true,
    check: origUntouched,
  },
  ...[0, -1, 10.5, 604_801].map(
    (lease): RejectedCase => ({
      name: `renew with a lease of ${lease}`,
      body: json({ kind: 'renew', id: 'orig', lease }),
      reason: `invalid renew message: lease: ${Number.isInteger(lease) ? LEASE_RULE : `must be an integer, not ${lease}`}`,
      logged: true,
      check: origUntouched,
    }),
  ),
  {
    name: 'renew without an id',
    body: json({ kind: 'renew' }),
    reason: 'invalid renew message: id: is required',
    logged: true,
  },
  {
    name: 'renew of an unknown request (nothing recorded)',
    body: json({ kind: 'renew', id: 'nobody' }),
    reason: 'unknown request "nobody"',
    logged: true,
    check: (h) => notRecorded(h, 'nobody'),
  },
  {
    name: 'renew of a request without a lease (nothing changes)',
    body: json({ kind: 'renew', id: 'orig' }),
    reason: 'request orig has no lease: send one with the request ("lease")',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'renew of a failed request (nothing revived)',
    body: json({ kind: 'renew', id: 'unknown-label' }),
    reason: `request unknown-label has ended (failed: unknown label "gpu-node" ${CONFIGURED}): there is nothing to renew`,
    logged: true,
    check: async (h) => {
      expect((await h.pool.context.store.getRequest('unknown-label'))?.state).toBe('failed');
    },
  },
  {
    name: 'release of a whole unknown request',
    body: json({ kind: 'release', id: 'nobody' }),
    reason: 'unknown request "nobody"',
    logged: true,
    check: (h) => notRecorded(h, 'nobody'),
  },
  {
    name: 'release of a whole min-ready request',
    body: json({ kind: 'release', id: 'min-ready:small-node:0:4' }),
    reason: `invalid release message: id: ${SPARE_ID_RULE}`,
    logged: true,
  },
  {
    name: 'release of a whole request with force not a boolean',
    body: json({ kind: 'release', id: 'orig', force: 1 }),
    reason: 'invalid release message: force: must be a boolean, not a number',
    logged: true,
    check: origUntouched,
  },
  {
    name: 'release of a held node without force (it stays held and placed)',
    body: release('held/0'),
    reason: 'node held/0 is held; release it with `metastatic release held/0 --force`',
    logged: true,
    check: async (h) => {
      expect((await h.pool.context.store.getRequest('held'))?.nodes[0]).toMatchObject({
        state: 'pending',
        held: true,
      });
      expect(Object.values((await mainBacking(h)).slotMap)).toContain('held/0');
    },
  },
];

/** Releases that are no error at all: consumed quietly, nothing freed twice. */
interface QuietCase {
  readonly name: string;
  readonly body: string;
  readonly check: (h: Harness, usedBefore: number) => Promise<void>;
}

const QUIET: readonly QuietCase[] = [
  {
    name: 'release of an already-released node',
    body: release('rel/0'),
    check: async (h, usedBefore) => {
      const main = await mainBacking(h);
      expect(main.used).toBe(usedBefore + 1); // the good request's slot only; rel/0's is not freed twice
      expect(main.used).toBe(Object.keys(main.slotMap).length);
      expect(Object.values(main.slotMap)).not.toContain('rel/0');
      expect((await h.pool.context.store.getRequest('rel'))?.nodes[0]?.state).toBe('released');
    },
  },
  {
    name: 'release of a node of a failed request',
    body: release('unknown-label/0'),
    check: async (h, usedBefore) => {
      expect((await mainBacking(h)).used).toBe(usedBefore + 1);
      expect(await h.pool.context.store.getRequest('unknown-label')).toMatchObject({
        state: 'failed',
        nodes: [{ state: 'failed', reason: `unknown label "gpu-node" ${CONFIGURED}` }],
      });
    },
  },
];

/** The one retryable class, and how it ends: waiting for capacity (or cancelled by a release). */
interface BoundedCase {
  readonly name: string;
  readonly body: string;
  readonly receiveCount: number;
  /** Reported as a batch item failure (SQS brings it back), with this reason in the log. */
  readonly retried?: string;
  /** Not retried: the request is recorded failed with this reason. */
  readonly failed?: { readonly id: string; readonly reason: string };
}

const CAPACITY = 'request cap-wait waits for capacity: meta/capped is at max-servers (2)';

const BOUNDED: readonly BoundedCase[] = [
  {
    name: 'a request waiting for capacity is retried on its first receive',
    body: request('cap-wait', ['capped-node']),
    receiveCount: 1,
    retried: CAPACITY,
  },
  {
    name: 'the waiting request on its last receive (maxReceiveCount) is recorded failed',
    body: request('cap-wait', ['capped-node']),
    receiveCount: MAX_RECEIVES,
    failed: { id: 'cap-wait', reason: `no capacity after ${MAX_RECEIVES} attempts: ${CAPACITY}` },
  },
  {
    name: 'a release of a node of the failed request is then consumed quietly',
    body: release('cap-wait/0'),
    receiveCount: 2,
  },
  {
    name: 'another request waiting for capacity is retried',
    body: request('cap-cancel', ['capped-node']),
    receiveCount: 1,
    retried: 'request cap-cancel waits for capacity: meta/capped is at max-servers (2)',
  },
  {
    name: 'a release of a node whose request still waits cancels that request, once',
    body: release('cap-cancel/0'),
    receiveCount: 1,
    failed: { id: 'cap-cancel', reason: 'cancelled: node cap-cancel/0 was released before it was placed' },
  },
  {
    name: 'the cancelled request, delivered again, stops waiting (consumed, not placed)',
    body: request('cap-cancel', ['capped-node']),
    receiveCount: 2,
    failed: { id: 'cap-cancel', reason: 'cancelled: node cap-cancel/0 was released before it was placed' },
  },
];

// ---- the catalogue: fulfil queue ----------------------------------------------------------------------

interface EventCase {
  readonly name: string;
  readonly body: string;
  /** Logged as `rejected event` with this reason, and consumed. */
  readonly rejected?: string;
  /** Parsed, and handled as `ignored` with this reason (logged at debug), and consumed. */
  readonly ignored?: string;
}

const NOT_AN_EVENT = 'not an EC2 state-change or spot interruption event';
const UNKNOWN_EC2 = 'i-0123456789abcdef0';
const UNKNOWN_LOCAL = 'local-00000000deadbeef';
const stateChange = (instanceId: string, state: string) =>
  json({
    version: '0',
    'detail-type': StateChangeDetailType,
    source: 'aws.ec2',
    resources: [],
    detail: { 'instance-id': instanceId, state },
  });
const spotWarning = (instanceId: string) =>
  json({
    version: '0',
    'detail-type': SpotInterruptionDetailType,
    source: 'aws.ec2',
    resources: [],
    detail: { 'instance-id': instanceId, 'instance-action': 'terminate' },
  });

const EVENTS: readonly EventCase[] = [
  {
    name: 'malformed JSON',
    body: '{"detail-type":',
    rejected: `malformed JSON: ${jsonError('{"detail-type":')}`,
  },
  { name: 'empty body', body: '', rejected: `malformed JSON: ${jsonError('')}` },
  {
    name: 'JSON null',
    body: 'null',
    rejected: `${NOT_AN_EVENT}: Invalid input: expected object, received null`,
  },
  {
    name: 'an event of another detail-type',
    body: json({
      version: '0',
      'detail-type': 'EC2 Instance Launch Successful',
      source: 'aws.autoscaling',
      detail: {},
    }),
    rejected: `${NOT_AN_EVENT}: detail-type: Invalid discriminator value. Expected 'EC2 Instance State-change Notification' | 'EC2 Spot Instance Interruption Warning'`,
  },
  {
    name: 'a state-change event with an unknown state',
    body: stateChange(UNKNOWN_EC2, 'exploded'),
    rejected: `${NOT_AN_EVENT}: detail.state: Invalid option: expected one of "pending"|"running"|"stopping"|"stopped"|"shutting-down"|"terminated"`,
  },
  {
    name: 'a state-change event without detail',
    body: json({ 'detail-type': StateChangeDetailType, source: 'aws.ec2' }),
    rejected: `${NOT_AN_EVENT}: detail: Invalid input: expected object, received undefined`,
  },
  {
    name: 'a state change for an unknown EC2 instance',
    body: stateChange(UNKNOWN_EC2, 'terminated'),
    ignored: `resource ${UNKNOWN_EC2} is recorded by no backing node`,
  },
  {
    name: 'running for an unknown local instance',
    body: stateChange(UNKNOWN_LOCAL, 'running'),
    ignored: `resource ${UNKNOWN_LOCAL} is recorded by no backing node`,
  },
  {
    name: 'terminated for an unknown local instance',
    body: stateChange(UNKNOWN_LOCAL, 'terminated'),
    ignored: `resource ${UNKNOWN_LOCAL} is recorded by no backing node`,
  },
  {
    name: 'a spot warning for an unknown EC2 instance',
    body: spotWarning(UNKNOWN_EC2),
    ignored: `resource ${UNKNOWN_EC2} is recorded by no backing node`,
  },
  {
    name: 'a spot warning for an unknown local instance',
    body: spotWarning(UNKNOWN_LOCAL),
    ignored: `resource ${UNKNOWN_LOCAL} is recorded by no backing node`,
  },
];

// ---- the catalogue: configuration ---------------------------------------------------------------------

/**
 * A valid configuration with room for one bad edit. Lines: 13 `- name: small-node`, 14 its
 * `backing-label`, 15 onwards `labelExtra`; `poolExtra` goes in before line 12 (`labels:`).
 */
const configWith = (labelExtra = '', poolExtra = ''): string => {
  const base = poolConfig();
  const metaLabels = base.lastIndexOf('        labels:\n');
  return `${base.slice(0, metaLabels)}${poolExtra}${base.slice(metaLabels)}${labelExtra}`;
};

interface ConfigCase {
  readonly name: string;
  readonly yaml: string;
  /** formatConfigErrors' output: `<file>:<line>:<column>: <path>: <message>` per error. */
  readonly errors: string;
}

const L = 'bad.yaml';
const LABEL = 'providers[1].pools[0].labels[0]';

const CONFIGS: readonly ConfigCase[] = [
  {
    name: 'unknown top-level key',
    yaml: `${configWith()}pools: []\n`,
    errors: `${L}:15:1: pools: unknown key "pools"`,
  },
  {
    name: 'misspelt top-level key (also reported missing)',
    yaml: configWith().replace(/^providers:/, 'provider:'),
    errors: [
      `${L}:1:1: providers: missing required key "providers"`,
      `${L}:1:1: provider: unknown key "provider"; did you mean "providers"?`,
    ].join('\n'),
  },
  {
    name: 'unknown key with a suggestion (snake_case)',
    yaml: configWith('            max_parallel_jobs: 2\n'),
    errors: `${L}:15:13: ${LABEL}.max_parallel_jobs: unknown key "max_parallel_jobs"; did you mean "max-parallel-jobs"?`,
  },
  {
    name: 'unknown key with a suggestion (a letter short)',
    yaml: configWith('', '        max-server: 4\n'),
    errors: `${L}:12:9: providers[1].pools[0].max-server: unknown key "max-server"; did you mean "max-servers"?`,
  },
  {
    name: 'wrong type',
    yaml: configWith('            max-parallel-jobs: two\n'),
    errors: `${L}:15:32: ${LABEL}.max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got "two"`,
  },
  {
    name: 'negative grace-time',
    yaml: configWith('            grace-time: -1\n'),
    errors: `${L}:15:25: ${LABEL}.grace-time: grace-time: expected a number of seconds >= 0 and <= 604800, got -1`,
  },
  {
    name: 'max-parallel-jobs 0',
    yaml: configWith('            max-parallel-jobs: 0\n'),
    errors: `${L}:15:32: ${LABEL}.max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got 0`,
  },
  {
    name: 'max-age below min-retention-time',
    yaml: configWith('            min-retention-time: 600\n            max-age: 300\n'),
    errors: `${L}:16:22: ${LABEL}.max-age: max-age: must be 0 (off) or >= min-retention-time (600), got 300`,
  },
  {
    name: 'backing-label that nothing provides',
    yaml: configWith().replace('backing-label: large-node', 'backing-label: huge-node'),
    errors: `${L}:14:28: ${LABEL}.backing-label: backing-label: no local or aws pool offers label "huge-node"`,
  },
  {
    name: 'backing-label missing',
    yaml: configWith().replace('            backing-label: large-node\n', ''),
    errors: `${L}:13:13: ${LABEL}.backing-label: missing required key "backing-label"`,
  },
  {
    name: 'backing-label naming a metastatic label',
    yaml: configWith('          - name: tiny-node\n            backing-label: small-node\n'),
    errors: `${L}:16:28: providers[1].pools[0].labels[1].backing-label: backing-label must name a label of a local or aws pool; "small-node" is a metastatic label (${LABEL})`,
  },
  {
    name: 'two labels sharing a backing-label but disagreeing',
    yaml: configWith(
      '            max-parallel-jobs: 2\n          - name: other-node\n            backing-label: large-node\n            max-parallel-jobs: 4\n',
    ),
    errors: `${L}:18:32: providers[1].pools[0].labels[1].max-parallel-jobs: max-parallel-jobs: labels sharing backing-label "large-node" must agree; this label has 4, ${LABEL} has 2`,
  },
  {
    name: 'a label name both metastatic and backing',
    yaml: configWith().replace('name: small-node', 'name: large-node'),
    errors: `${L}:13:19: ${LABEL}.name: label "large-node" is also offered by a local or aws pool (providers[0].pools[0].labels[0]); a label name must be either metastatic or backing, not both`,
  },
  {
    name: 'duplicate provider names',
    yaml: configWith().replace('name: meta', 'name: local'),
    errors: `${L}:8:11: providers[1].name: duplicate provider name "local" (first used at providers[0])`,
  },
  {
    name: 'duplicate pool names',
    yaml: `${configWith()}      - name: main\n        labels:\n          - name: other-node\n            backing-label: large-node\n`,
    errors: `${L}:15:15: providers[1].pools[1].name: duplicate pool name "main" in provider "meta" (first used at providers[1].pools[0])`,
  },
  {
    name: 'unknown driver',
    yaml: configWith().replace('driver: metastatic', 'driver: gce'),
    errors: `${L}:9:13: providers[1].driver: driver must be one of metastatic, local, aws, got "gce"`,
  },
  {
    name: 'YAML syntax error: an unclosed flow sequence',
    yaml: configWith().replace('backing-label: large-node', 'backing-label: [large-node'),
    errors: `${L}:15:1: YAML syntax error: Flow sequence in block collection must be sufficiently indented and end with a ]`,
  },
  {
    name: 'YAML syntax error: a tab in the indentation',
    yaml: configWith().replace('            backing-label', '\t    backing-label'),
    errors: `${L}:14:1: YAML syntax error: Tabs are not allowed as indentation`,
  },
  {
    name: 'YAML syntax error: a duplicate key',
    yaml: configWith('            grace-time: 5\n            grace-time: 10\n'),
    errors: `${L}:16:13: YAML syntax error: Map keys must be unique`,
  },
  // Issue 10: numbers without a maximum validated and then broke the pool; '#' in names made two labels
  // share a backing node; a host with a space reached the backing process's command line.
  {
    name: 'max-parallel-jobs beyond its maximum (1e9 crashed the second request)',
    yaml: configWith('            max-parallel-jobs: 1000000000\n'),
    errors: `${L}:15:32: ${LABEL}.max-parallel-jobs: max-parallel-jobs: expected an integer >= 1 and <= 1000, got 1000000000`,
  },
  {
    name: "boot-delay beyond a day (1e12 overflowed Node's timer)",
    yaml: configWith().replace(
      '          - name: large-node\n',
      '          - name: large-node\n            boot-delay: 1e12\n',
    ),
    errors: `${L}:8:25: providers[0].pools[0].labels[0].boot-delay: boot-delay: expected a number of seconds >= 0 and <= 86400, got 1000000000000`,
  },
  {
    name: "'#' in a pool or label name (main + x#y and main#x + y built one index key)",
    yaml: `${configWith().replace('name: small-node', 'name: x#y')}      - name: main#x\n        labels:\n          - name: y\n            backing-label: large-node\n`,
    errors: [
      `${L}:13:19: ${LABEL}.name: name: expected a name of ${NAME_RULE}, got "x#y"`,
      `${L}:15:15: providers[1].pools[1].name: name: expected a name of ${NAME_RULE}, got "main#x"`,
    ].join('\n'),
  },
  {
    name: 'a local host with an argument in it',
    yaml: configWith().replace('    driver: local\n', '    driver: local\n    host: 127.0.0.1 --evil\n'),
    errors: `${L}:4:11: providers[0].host: host: expected an IPv4 or IPv6 address or a DNS name, got "127.0.0.1 --evil"`,
  },
  // Issue 22: a number DynamoDB cannot store; a slot of 1e-300 cores is no shape.
  {
    name: "a slot's cores below a thousandth of a core",
    yaml: configWith('            cores: 1e-300\n'),
    errors: `${L}:15:20: ${LABEL}.cores: cores: expected a number of cores >= 0.001 and <= 1024, got 1e-300`,
  },
  {
    name: 'an empty file',
    yaml: '',
    errors: `${L}:1:1: configuration: expected a mapping with a "providers" list, got an empty value`,
  },
];

const CATALOGUE_SIZE = REJECTED.length + QUIET.length + BOUNDED.length + EVENTS.length + CONFIGS.length;

// ---- the tests ----------------------------------------------------------------------------------------

describe('bad input on the queues (one embedded pool)', () => {
  let h: Harness;
  const logs: LogEntry[] = [];
  let goods = 0;

  const store = () => h.pool.context.store;
  const warnings = (message: string) =>
    logs
      .filter((l) => l.level === 'warn' && l.message === message)
      .map((l) => ({ messageId: l.fields.messageId, reason: l.fields.reason }));

  /** Runs a batch, failing the test on any record reported for retry. */
  async function consumed(bodies: string[]): Promise<void> {
    const response = await h.pool.handlers.request(sqsEvent(bodies));
    expect(response.batchItemFailures).toEqual([]);
  }

  /** One batch: the bad body, then a known-good request. */
  async function withGood(bad: string, receiveCount = 1) {
    const goodId = `good-${++goods}`;
    logs.length = 0;
    const response = await h.pool.handlers.request(
      sqsEvent([bad, request(goodId, ['small-node'], { requestor: 'catalogue' })], receiveCount),
    );
    return { response, goodId };
  }

  /** The good request of the batch was placed and nothing about it was logged as a problem. */
  async function expectGoodPlaced(goodId: string): Promise<void> {
    const good = await store().getRequest(goodId);
    expect(good?.state).toMatch(/^(pending|fulfilled)$/);
    expect(good?.nodes[0]?.backingNodeId).toBe((await mainBacking(h)).id);
    const problems = logs.filter(
      (l) =>
        l.level !== 'debug' &&
        l.level !== 'info' &&
        (l.fields.messageId === 'm-1' || l.fields.requestId === goodId),
    );
    expect(problems).toEqual([]);
  }

  beforeAll(async () => {
    h = await startHarness(POOL_CONFIG, { maxReceiveCount: MAX_RECEIVES });
    Object.assign(h.pool.context, { log: capturingLog(logs) });
    // What the cases collide with: a placed request, a released node, a held node, a request recorded
    // failed for a typo, and a capped pool at its max-servers.
    await consumed([
      request('orig', ['small-node'], { requestor: 'alice' }),
      request('rel'),
      request('held'),
      json({ kind: 'request', id: 'typo', labels: ['small-node'], prio: 1 }),
      request('cap-fill', ['capped-node', 'capped-node']),
    ]);
    await consumed([release('rel/0')]);
    await holdNode(h.pool.context, 'held/0');
    origBefore = await store().getRequest('orig');
    expect(origBefore).toMatchObject({ state: 'pending', labels: ['small-node'] });
    expect(await store().getRequest('typo')).toMatchObject({ state: 'failed' });
    expect(await store().getRequest('cap-fill')).toMatchObject({ state: 'pending' });
  });

  afterAll(async () => {
    await h?.close();
  });

  it(`the catalogue holds ${CATALOGUE_SIZE} cases`, () => {
    expect(CATALOGUE_SIZE).toBeGreaterThanOrEqual(40);
    expect(REJECTED.every((c) => c.logged || c.recordedAs !== undefined)).toBe(true);
  });

  describe('request queue: refused, with the reason, and consumed', () => {
    it.each(REJECTED)('$name', async (c) => {
      const { response, goodId } = await withGood(c.body);
      expect(response.batchItemFailures).toEqual([]); // consumed: never comes back
      expect(warnings('rejected message')).toEqual(c.logged ? [{ messageId: 'm-0', reason: c.reason }] : []);
      if (c.recordedAs !== undefined) {
        const r = await store().getRequest(c.recordedAs);
        expect(r).toMatchObject({ state: 'failed', reason: c.reason });
        expect(r?.nodes.every((n) => n.state === 'failed' && n.reason === c.reason)).toBe(true);
      }
      await c.check?.(h);
      await expectGoodPlaced(goodId);
    });
  });

  describe('request queue: harmless repeats', () => {
    it.each(QUIET)('$name', async (c) => {
      const usedBefore = (await mainBacking(h)).used;
      const { response, goodId } = await withGood(c.body);
      expect(response.batchItemFailures).toEqual([]);
      expect(logs.filter((l) => l.level === 'warn' || l.level === 'error')).toEqual([]);
      await c.check(h, usedBefore);
      await expectGoodPlaced(goodId);
    });
  });

  describe('request queue: what is retried, and how the retries end', () => {
    it.each(BOUNDED)('$name', async (c) => {
      const { response, goodId } = await withGood(c.body, c.receiveCount);
      expect(response.batchItemFailures).toEqual(c.retried ? [{ itemIdentifier: 'm-0' }] : []);
      const retried = logs
        .filter((l) => l.message === 'message will be retried')
        .map((l) => ({
          messageId: l.fields.messageId,
          requestId: l.fields.requestId,
          receives: l.fields.receives,
          reason: l.fields.reason,
        }));
      const id = (JSON.parse(c.body) as { id?: string }).id;
      expect(retried).toEqual(
        c.retried ? [{ messageId: 'm-0', requestId: id, receives: c.receiveCount, reason: c.retried }] : [],
      );
      expect(warnings('rejected message')).toEqual([]);
      if (c.failed) {
        expect(await store().getRequest(c.failed.id)).toMatchObject({
          state: 'failed',
          reason: c.failed.reason,
        });
      } else if (id !== undefined) {
        expect((await store().getRequest(id))?.state).toBe('requested'); // visible while it waits
      }
      await expectGoodPlaced(goodId);
    });
  });

  /**
   * Issue 22, defect 2: a write the store refuses as invalid (a number out of DynamoDB's range, an item
   * over 400 KB) fails the same way on every receive. Whatever the field, and even where a bound was
   * missed (here the `side` pool's node-attributes, set past validation), the request ends at once with
   * the store's reason, and every line about it names it.
   */
  describe('request queue: a write the store refuses ends the request at once', () => {
    const side = () => {
      const pool = h.pool.context.config.metastaticPools.find((p) => p.key === 'meta/side');
      if (!pool) throw new Error('no side pool');
      return pool;
    };
    let attributesBefore: Readonly<Record<string, unknown>> = {};
    beforeAll(async () => {
      attributesBefore = side().nodeAttributes;
      // A ready side backing node, so the next side request's node is ready, attributes and all, in the
      // request's own write.
      await consumed([request('side-first', ['side-node'])]);
      await h.fulfilUntil(async () => (await store().getRequest('side-first'))?.state === 'fulfilled');
    });
    afterAll(() => {
      Object.assign(side(), { nodeAttributes: attributesBefore });
    });

    it.each([
      ['a node attribute of 1e-300', 'refused-number', { tiny: 1e-300 }, /Number underflow/],
      ['node attributes over 400 KB', 'refused-size', { blob: 'x'.repeat(420_000) }, /Item size/],
    ])('%s', async (_what, id, attributes, reason) => {
      Object.assign(side(), { nodeAttributes: attributes });
      const { response, goodId } = await withGood(request(id, ['side-node']));
      expect(response.batchItemFailures).toEqual([]); // not retried: the first receive ends it
      const r = await store().getRequest(id);
      expect(r).toMatchObject({ state: 'failed', labels: ['side-node'] });
      // Refused where the placement records the node ready (the nodes could not be recorded), or by any
      // other write of the request (the request function's own catch): the table's reason either way.
      expect(r?.reason).toMatch(/^(the nodes could not be recorded: )?the table refused a write: /);
      expect(r?.reason).toMatch(reason);
      const ended = logs.filter((l) => l.message === 'request ended: the table refused a write');
      expect(ended).toEqual([
        expect.objectContaining({ level: 'warn', fields: expect.objectContaining({ requestId: id }) }),
      ]);
      // Every line about the message names its request.
      const about = logs.filter((l) => l.fields.messageId === 'm-0');
      expect(about.length).toBeGreaterThan(0);
      expect(about.filter((l) => l.fields.requestId !== id)).toEqual([]);
      // Nothing it claimed is kept: no slot of a side backing node names its node.
      const sides = (await store().listBacking()).filter((b) => b.poolKey === 'meta/side');
      expect(sides.flatMap((b) => Object.values(b.slotMap))).not.toContain(`${id}/0`);
      await expectGoodPlaced(goodId);
    });

    it('records the request without the refused field when the refusal is on its own record', async () => {
      // A message whose number no bound caught (the schema would refuse this one): its record cannot be
      // written as sent, so the failure is recorded with the id, labels and body hash only.
      const m: RequestMessage = {
        kind: 'request',
        id: 'bare-1',
        labels: ['small-node'],
        requestor: 'catalogue',
        'expected-duration': 1e-300,
      };
      const r = await endRequestOf(h.pool.context, m, 'gave up after 3 attempts: the table refused a write');
      expect(r).toMatchObject({ id: 'bare-1', state: 'failed', labels: ['small-node'] });
      expect(r?.reason).toMatch(/^gave up after 3 attempts: the table refused a write/);
      const stored = await store().getRequest('bare-1');
      expect(stored).toEqual(r);
      expect(stored?.expectedDuration).toBeUndefined();
      expect(stored?.bodyHash).toBe(requestBodyHash(m));
      // The same message delivered again is a late delivery of an ended request: nothing more.
      expect(await endRequestOf(h.pool.context, m, 'again')).toEqual(stored);
    });

    it('logs what the dead-letter handler could not do, naming the request', async () => {
      const missing = new DynamoStore(h.pool.dynamodb, 'no-such-table');
      const dead: LogEntry[] = [];
      const handler = makeDeadLetterHandler({ ...h.pool.context, store: missing, log: capturingLog(dead) });
      const response = await handler(
        sqsEvent([request('dead-1'), release('dead-2/0'), json({ kind: 'cancel', id: 'dead-3' })], 50),
      );
      expect(response.batchItemFailures).toHaveLength(3); // it stays in the dead-letter queue
      const failed = dead.filter((l) => l.level === 'error');
      expect(failed.map((l) => [l.fields.messageId, l.fields.requestId])).toEqual([
        ['m-0', 'dead-1'],
        ['m-1', 'dead-2'],
        ['m-2', 'dead-3'],
      ]);
      for (const l of failed) {
        expect(l.message).toBe('dead-lettered message not handled; it stays in the dead-letter queue');
        expect(String(l.fields.error)).toMatch(/non-existent table|not found/i);
      }
    });
  });

  describe('fulfil queue: refused or ignored, and consumed', () => {
    it.each(EVENTS)('$name', async (c) => {
      const main = await mainBacking(h);
      expect(main.resourceId).toBeDefined();
      const good = stateChangeEvent({
        resourceId: main.resourceId as string,
        state: 'running',
        source: LOCAL_EVENT_SOURCE,
        region: 'us-east-1',
        at: h.clock.now(),
      });
      logs.length = 0;
      const response = await h.pool.handlers.fulfil(sqsEvent([c.body, json(good)]));
      expect(response.batchItemFailures).toEqual([]);
      expect(warnings('rejected event')).toEqual(
        c.rejected ? [{ messageId: 'm-0', reason: c.rejected }] : [],
      );
      const handled = (messageId: string) =>
        logs
          .filter((l) => l.message === 'state change handled' && l.fields.messageId === messageId)
          .map((l) => l.fields.outcome);
      expect(handled('m-0')).toEqual(c.ignored ? [{ kind: 'ignored', reason: c.ignored }] : []);
      // The good event in the same batch made (or kept) the backing node and its nodes ready.
      expect(handled('m-1')).toEqual([expect.objectContaining({ kind: 'ready', backingNodeId: main.id })]);
      expect((await store().getBacking(main.id))?.state).toBe('ready');
      expect((await store().getRequest(`good-${goods}`))?.state).toBe('fulfilled');
      // Nothing was failed by an event about someone else's instance.
      expect((await store().listBacking()).filter((b) => b.state === 'failed')).toEqual([]);
    });
  });
});

describe('bad configurations: every error with its file, line, column and path', () => {
  it.each(CONFIGS)('$name', (c) => {
    const result = parseConfig(c.yaml, L);
    expect(result.ok).toBe(false);
    expect(result.ok ? '' : formatConfigErrors(result.errors)).toBe(c.errors);
  });

  it('gives the errors as data too', () => {
    const result = parseConfig(configWith('            grace-time: -1\n'), L);
    expect(result.ok ? [] : result.errors).toEqual([
      {
        file: L,
        path: `${LABEL}.grace-time`,
        line: 15,
        column: 25,
        message: 'grace-time: expected a number of seconds >= 0 and <= 604800, got -1',
      },
    ]);
  });
});

describe('a local host that validates but cannot be listened on', () => {
  // 192.0.2.1 (TEST-NET-1, RFC 5737) is an address, so it passes the schema, but it is on no interface
  // here: the backing process fails to listen (EADDRNOTAVAIL) and exits before it is ready. The cause
  // used to stay in the log, the request ending with "backing resource ... is terminated".
  const config = poolConfig({
    backing: { provider: { host: '192.0.2.1' } },
    meta: { provider: { 'launch-retries': 1 } },
  });
  let h: Harness | undefined;
  afterAll(async () => {
    await h?.close();
  });

  it("carries the process's own error into the backing node's and the request's failure reason", async () => {
    h = await startHarness(config);
    const store = h.pool.context.store;
    await h.send(request('unlistenable'));
    await h.drainRequests();
    await h.fulfilUntil(async () => (await store.getRequest('unlistenable'))?.state === 'failed');
    const [backing] = await store.listBacking();
    const cause =
      /^backing resource local-[0-9a-f]{16} is terminated: exited before it was ready \(exit code 2\): backing node: server error: listen EADDRNOTAVAIL: address not available 192\.0\.2\.1$/;
    expect(backing?.reason).toMatch(cause);
    expect((await store.getRequest('unlistenable'))?.reason).toContain(backing?.reason);
  });
});
