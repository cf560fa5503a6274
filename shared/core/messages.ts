import { z } from 'zod';
import { requestIdPattern } from './ids.ts';

/**
 * The public message API of the request queue (documented in the README). Strict: unknown keys are
 * rejected so a typo never silently changes a request.
 */
export const MAX_NODE_SET = 64;

export const RequestMessage = z.strictObject({
  kind: z.literal('request'),
  id: z
    .string()
    .regex(
      requestIdPattern,
      'must be 1-128 characters of A-Z a-z 0-9 . _ : - starting with a letter or digit',
    ),
  labels: z
    .array(z.string().min(1, 'a label must not be empty'))
    .min(1, 'a request needs at least one label')
    .max(MAX_NODE_SET, `a node set has at most ${MAX_NODE_SET} labels`),
  requestor: z.string().max(256, 'must be at most 256 characters').optional(),
  priority: z.number().int().optional(),
});
export type RequestMessage = z.infer<typeof RequestMessage>;

export const ReleaseMessage = z.strictObject({
  kind: z.literal('release'),
  nodeId: z.string().min(1, 'must not be empty').max(256, 'must be at most 256 characters'),
  /** Releases a held node too (operators). */
  force: z.boolean().optional(),
});
export type ReleaseMessage = z.infer<typeof ReleaseMessage>;

export const PoolMessage = z.discriminatedUnion('kind', [RequestMessage, ReleaseMessage]);
export type PoolMessage = z.infer<typeof PoolMessage>;

export type ParsedMessage =
  | { readonly ok: true; readonly message: PoolMessage }
  | {
      readonly ok: false;
      readonly reason: string;
      /** The request id, when the body carried a usable one: the failure is recorded under it. */
      readonly requestId?: string;
      readonly labels?: string[];
    };

/** Parses an SQS body into a message, or a reason a user can act on. */
export function parseMessage(body: string): ParsedMessage {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (err) {
    return { ok: false, reason: `malformed JSON: ${(err as Error).message}` };
  }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    return { ok: false, reason: 'message must be a JSON object' };
  }
  const obj = json as Record<string, unknown>;
  const requestId = typeof obj.id === 'string' && requestIdPattern.test(obj.id) ? obj.id : undefined;
  const labels =
    Array.isArray(obj.labels) && obj.labels.every((l) => typeof l === 'string')
      ? (obj.labels as string[])
      : undefined;
  if (obj.kind !== 'request' && obj.kind !== 'release') {
    return {
      ok: false,
      reason:
        obj.kind === undefined
          ? 'missing "kind" (expected "request" or "release")'
          : `unknown kind ${JSON.stringify(obj.kind)} (expected "request" or "release")`,
      requestId: obj.kind === undefined ? undefined : requestId,
      labels,
    };
  }
  const parsed = PoolMessage.safeParse(json, { reportInput: true });
  if (parsed.success) return { ok: true, message: parsed.data };
  const reason = parsed.error.issues
    .map((i) => `${i.path.length ? `${i.path.join('.')}: ` : ''}${describeIssue(i)}`)
    .join('; ');
  return {
    ok: false,
    reason: `invalid ${obj.kind} message: ${reason}`,
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
    return `unknown key${i.keys.length > 1 ? 's' : ''} ${i.keys.map((k) => JSON.stringify(k)).join(', ')}`;
  }
  return i.message;
}
