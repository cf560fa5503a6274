import { z } from 'zod';
import { requestIdPattern, SPARE_ID_PREFIX } from './ids.ts';
import { LEASE_RULE, MAX_LEASE, MIN_LEASE } from './leases.ts';
import { MAX_PRIORITY } from './priority.ts';
import { MAX_CORES, MAX_SIZE_MIB, MIN_CORES, parseSize, type Shape, SIZE_RULE } from './shapes.ts';
import { boundedReason, clip, listSome, quote } from './text.ts';

/**
 * The public message API of the request queue (documented in docs/messages.md). Strict: unknown keys are
 * rejected so a typo never silently changes a request.
 *
 * Every number is bounded both ways to a range that means something for its field, which keeps it
 * within what DynamoDB stores (magnitude 1e-130 to 1e+126, 38 digits; a JSON number has at most 17).
 * The limits keep what a message can make the pool store within DynamoDB's 400 KB item: a request's
 * labels are stored twice (the set, and each node's label), so 64 labels of 255 characters take at most
 * ~100 KB (test/unit/core.test.ts measures the largest request the schema admits). SQS's own limit, 256 KB
 * per message, is far above what a valid message needs.
 */
export const MAX_NODE_SET = 64;
export const MAX_LABEL_LENGTH = 255;
export const PRIORITY_RULE = `must be an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY} (lower is served first)`;
/** An expected duration beyond a week is more likely milliseconds typed as seconds. */
export const MAX_EXPECTED_DURATION = 7 * 24 * 3600;
/**
 * No node is kept less than a second; below 1e-130 DynamoDB cannot store the number at all (the request
 * keeps it), and such a request was retried until its receives ran out, never recorded.
 */
export const MIN_EXPECTED_DURATION = 1;

/**
 * A request id a message may name (a request's own, or the one a cancel ends): never one of the pool's
 * own min-ready requests (core/minReady.ts), which no message may write or end.
 */
function clientRequestId() {
  return z
    .string()
    .regex(
      requestIdPattern,
      'must be 1-128 characters of A-Z a-z 0-9 . _ : - starting with a letter or digit',
    )
    .refine((id) => !id.startsWith(SPARE_ID_PREFIX), {
      message: `must not start with "${SPARE_ID_PREFIX}": those are the pool's own min-ready requests`,
    });
}

/** A client lease, seconds (core/leases.ts): whole, from MIN_LEASE to MAX_LEASE. */
function leaseField() {
  return z.number().int(LEASE_RULE).min(MIN_LEASE, LEASE_RULE).max(MAX_LEASE, LEASE_RULE);
}

/** What one node of a request by shape needs: at least one of cores, memory, disk. */
export const ShapeMessage = z
  .strictObject({
    cores: z
      .number()
      .min(MIN_CORES, `must be at least ${MIN_CORES} (a thousandth of a core)`)
      .max(MAX_CORES, `must be at most ${MAX_CORES}`)
      .optional(),
    memory: sizeField().optional(),
    disk: sizeField().optional(),
  })
  .refine((s) => s.cores !== undefined || s.memory !== undefined || s.disk !== undefined, {
    message: 'a shape needs at least one of cores, memory, disk',
  });
export type ShapeMessage = z.infer<typeof ShapeMessage>;

function sizeField() {
  return z
    .string()
    .max(32, 'must be at most 32 characters')
    .refine(
      (v) => {
        const mib = parseSize(v);
        return mib !== undefined && mib > 0 && mib <= MAX_SIZE_MIB;
      },
      { message: `must be ${SIZE_RULE}, at most 1PiB` },
    );
}

/** A shape as the pool reasons about it (sizes in MiB). */
export function shapeOf(s: ShapeMessage): Shape {
  return {
    ...(s.cores === undefined ? {} : { cores: s.cores }),
    ...(s.memory === undefined ? {} : { memoryMiB: parseSize(s.memory) as number }),
    ...(s.disk === undefined ? {} : { diskMiB: parseSize(s.disk) as number }),
  };
}

export const RequestMessage = z
  .strictObject({
    kind: z.literal('request'),
    id: clientRequestId(),
    labels: z
      .array(
        z
          .string()
          .min(1, 'a label must not be empty')
          .max(MAX_LABEL_LENGTH, `a label has at most ${MAX_LABEL_LENGTH} characters`),
      )
      .min(1, 'a request needs at least one label')
      .max(MAX_NODE_SET, `a node set has at most ${MAX_NODE_SET} labels`)
      .optional(),
    /**
     * Instead of labels: what each node needs (core/shapes.ts). The pool picks for each the label whose
     * slot fits at the lowest cost per slot-hour, and records it on the node.
     */
    shapes: z
      .array(ShapeMessage)
      .min(1, 'a request needs at least one shape')
      .max(MAX_NODE_SET, `a node set has at most ${MAX_NODE_SET} shapes`)
      .optional(),
    requestor: z.string().max(256, 'must be at most 256 characters').optional(),
    /** Lower first; bounded as configuration priorities are. The pool's own spares come after any. */
    priority: z.number().int().min(-MAX_PRIORITY, PRIORITY_RULE).max(MAX_PRIORITY, PRIORITY_RULE).optional(),
    /**
     * How long the requestor expects to keep its nodes, in seconds: placement puts them where the nodes
     * already running are expected to end about when they do, so backing nodes empty together.
     */
    'expected-duration': z
      .number()
      .min(MIN_EXPECTED_DURATION, `must be at least ${MIN_EXPECTED_DURATION} second`)
      .max(MAX_EXPECTED_DURATION, `must be at most ${MAX_EXPECTED_DURATION} seconds (7 days)`)
      .optional(),
    /**
     * A client lease, seconds: renew it (RenewMessage) before it lapses, or the reaper releases every
     * node of the request. Bounded again by the labels' max-lease when the request is served.
     */
    lease: leaseField().optional(),
  })
  .superRefine((m, ctx) => {
    if ((m.labels === undefined) === (m.shapes === undefined)) {
      ctx.addIssue({
        code: 'custom',
        path: [m.labels === undefined ? 'labels' : 'shapes'],
        message:
          m.labels === undefined
            ? 'a request needs "labels" or "shapes"'
            : 'give "labels" or "shapes", not both',
      });
    }
  });
export type RequestMessage = z.infer<typeof RequestMessage>;

/**
 * Releases one node (`nodeId`) or every node of a request (`id`): exactly one of them. A whole request's
 * held nodes are kept unless `force`, as a single held node is.
 */
export const ReleaseMessage = z
  .strictObject({
    kind: z.literal('release'),
    nodeId: z.string().min(1, 'must not be empty').max(256, 'must be at most 256 characters').optional(),
    /** Never one of the pool's own min-ready requests: they end with their seat or their taker. */
    id: clientRequestId().optional(),
    /** Releases a held node too (operators). */
    force: z.boolean().optional(),
  })
  .superRefine((m, ctx) => {
    if ((m.nodeId === undefined) === (m.id === undefined)) {
      ctx.addIssue({
        code: 'custom',
        path: [m.nodeId === undefined ? 'nodeId' : 'id'],
        message:
          m.nodeId === undefined
            ? 'a release needs "nodeId" (one node) or "id" (every node of a request)'
            : 'give "nodeId" or "id", not both',
      });
    }
  });
export type ReleaseMessage = z.infer<typeof ReleaseMessage>;

/**
 * Ends a request that is not fulfilled yet: a waiting one fails with the reason, a placed one fails with
 * its nodes (their slots and places are given back). A request not received yet is recorded as cancelled,
 * so its message, when it comes, is refused. A fulfilled or failed request is left as it is.
 */
export const CancelMessage = z.strictObject({
  kind: z.literal('cancel'),
  /** Never one of the pool's own min-ready requests: they end with their seat or their taker. */
  id: clientRequestId(),
  /** Why, recorded in the request's reason after "cancelled: ". */
  reason: z.string().max(256, 'must be at most 256 characters').optional(),
});
export type CancelMessage = z.infer<typeof CancelMessage>;

/** Renews a request's lease from now: by its own length, or by `lease` seconds (within max-lease). */
export const RenewMessage = z.strictObject({
  kind: z.literal('renew'),
  id: clientRequestId(),
  lease: leaseField().optional(),
});
export type RenewMessage = z.infer<typeof RenewMessage>;

export const PoolMessage = z.discriminatedUnion('kind', [
  RequestMessage,
  ReleaseMessage,
  CancelMessage,
  RenewMessage,
]);
export type PoolMessage = z.infer<typeof PoolMessage>;

export type ParsedMessage =
  | { readonly ok: true; readonly message: PoolMessage }
  | {
      readonly ok: false;
      readonly reason: string;
      /** The request id, when the body carried a usable one: the failure is recorded under it. */
      readonly requestId?: string;
      /**
       * The labels the body asked for, when they were strings, bounded like a valid message's (at most
       * MAX_NODE_SET, each cut to MAX_LABEL_LENGTH) so that the failure record fits in an item.
       */
      readonly labels?: string[];
    };

const KINDS = '"request", "release", "cancel" or "renew"';

/** Issues of an invalid message listed in its reason before the rest is only counted. */
const MAX_ISSUES = 3;

/** What a rejected message's record keeps of its labels: bounded, whatever the body held. */
function boundedLabels(labels: readonly string[]): string[] {
  return labels.slice(0, MAX_NODE_SET).map((l) => clip(l, MAX_LABEL_LENGTH));
}

/** Parses an SQS body into a message, or a reason a user can act on. */
export function parseMessage(body: string): ParsedMessage {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (err) {
    return { ok: false, reason: boundedReason(`malformed JSON: ${(err as Error).message}`) };
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    return { ok: false, reason: 'message must be a JSON object' };
  }
  const obj = json as Record<string, unknown>;
  // The pool's own ids (min-ready) are never recorded for a message: it could end one of its nodes.
  const requestId =
    typeof obj.id === 'string' && requestIdPattern.test(obj.id) && !obj.id.startsWith(SPARE_ID_PREFIX)
      ? obj.id
      : undefined;
  const labels =
    Array.isArray(obj.labels) && obj.labels.every((l) => typeof l === 'string')
      ? boundedLabels(obj.labels as string[])
      : undefined;
  if (obj.kind !== 'request' && obj.kind !== 'release' && obj.kind !== 'cancel' && obj.kind !== 'renew') {
    return {
      ok: false,
      reason:
        obj.kind === undefined
          ? `missing "kind" (expected ${KINDS})`
          : `unknown kind ${typeof obj.kind === 'string' ? quote(obj.kind) : clip(JSON.stringify(obj.kind), 64)} (expected ${KINDS})`,
      requestId: obj.kind === undefined ? undefined : requestId,
      labels,
    };
  }
  const parsed = PoolMessage.safeParse(json, { reportInput: true });
  if (parsed.success) return { ok: true, message: parsed.data };
  // A body can hold thousands of bad values (20,000 over-long labels): name a few, count the rest.
  const issues = parsed.error.issues;
  const reason = issues
    .slice(0, MAX_ISSUES)
    .map((i) => `${i.path.length ? `${clip(i.path.join('.'), 64)}: ` : ''}${describeIssue(i)}`)
    .join('; ');
  const more = issues.length > MAX_ISSUES ? ` (and ${issues.length - MAX_ISSUES} more issues)` : '';
  return {
    ok: false,
    reason: boundedReason(`invalid ${obj.kind} message: ${reason}${more}`),
    requestId: obj.kind === 'request' ? requestId : undefined,
    labels,
  };
}

const article = (noun: string) => (/^[aeiou]/.test(noun) ? `an ${noun}` : `a ${noun}`);

/** What a value is, in a user's words. */
function kindOf(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'number' && !Number.isInteger(value)) return `${value}`;
  return article(typeof value);
}

/** A zod issue in a user's words: a missing or mistyped field says what it must be and what it got. */
function describeIssue(i: z.core.$ZodIssue): string {
  if (i.code === 'invalid_type') {
    if (i.input === undefined) return 'is required';
    const expected = i.expected === 'int' ? 'integer' : i.expected;
    return `must be ${article(expected)}, not ${kindOf(i.input)}`;
  }
  if (i.code === 'unrecognized_keys') {
    return `unknown key${i.keys.length > 1 ? 's' : ''} ${listSome(i.keys)}`;
  }
  return i.message;
}
