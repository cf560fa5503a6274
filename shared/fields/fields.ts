import { z } from 'zod';
import { MAX_LEASE, MIN_LEASE } from '../core/leases.ts';
import { MAX_PRIORITY } from '../core/priority.ts';
import { MAX_CORES, MAX_SIZE_MIB, MIN_CORES, parseSize, SIZE_PATTERN, SIZE_RULE } from '../core/shapes.ts';

/**
 * The limits every number in a configuration is held to, and the leaf schemas the driver schemas are
 * built from. Every leaf carries an error phrase such as "an integer >= 1": load.ts turns a failed check
 * into `<key>: expected <phrase>, got <value>`, so keep the phrases short and in that grammatical form.
 */

// ---- limits -----------------------------------------------------------------------------------------
// Every number has a maximum: an unbounded value would pass validation, then break the pool at run time
// (max-parallel-jobs 1e9 would build an array of every free slot, boot-delay 1e12 would overflow Node's
// timer).
// Each bound is documented with its reason in the "Limits" table of docs/configuration.md.

/** A day, in seconds: launch and boot bounds (a machine not up within a day will not come up). */
export const MAX_BOOT_SECONDS = 24 * 3600;
/** A week, in seconds: how long a backing node is kept or a request waits. */
export const MAX_KEEP_SECONDS = 7 * 24 * 3600;
/**
 * Slots per backing node. The free index orders backing nodes by free slots padded to 5 digits
 * (shared/store/table.ts, ordering breaks above 99,999), and the slot map is one DynamoDB item (400 KB):
 * 1,000 slots of the longest node ids (131 characters) take ~140 KB.
 */
export const MAX_PARALLEL_JOBS = 1000;
/**
 * Ready nodes kept per label (min-ready). A request looks for a free one seat by seat (a read each, a
 * few at a time, stopping at the first free one) and every reaper run reads every seat, so the bound
 * keeps both small; Nodepool installations keep a handful per label.
 */
export const MAX_MIN_READY = 100;
/** min-ready auto: the share of requests that should find a ready node (ready-target), its bounds and default. */
export const READY_TARGET_BOUNDS = { min: 0.5, max: 0.999, default: 0.9 } as const;
/** min-ready auto: the most ready nodes held when max-ready is not given. */
export const DEFAULT_MAX_READY = 10;
/**
 * Servers of a pool. A place in a pool's capacity set is its own small item, so no item
 * grows with the pool; the bound is what is tested (test/embedded/capacityScale.test.ts) and what one
 * pool's counter item sustains (docs/table.md, Scale).
 */
export const MAX_SERVERS = 10_000;
/** Launch attempts per node: each may take up to launch-timeout; more only delay the failure. */
export const MAX_LAUNCH_RETRIES = 20;
/** Priorities: only their order matters; the bound keeps them plain integers (as a message's). */
export { MAX_PRIORITY } from '../core/priority.ts';
/** EC2 keeps at most 10,000 versions of a launch template; version numbers never reach this. */
export const MAX_TEMPLATE_VERSION = 1_000_000;
/** EBS: the largest volume of any type (io2 Block Express, 64 TiB); per type in resolve.ts. */
export const MAX_VOLUME_SIZE = 65_536;

/**
 * Provider, pool and label names (and backing-label). The table joins them with `/` and `#` into keys
 * (`FREE#<provider>/<pool>#<label>`), so neither may appear in a name: `main` + `x#y` and `main#x` + `y`
 * would share a key and so a backing node.
 */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
export const NAME_RULE = '1-64 characters of A-Z a-z 0-9 . _ - starting with a letter or digit';

// ---- leaf builders ----------------------------------------------------------------------------------

export const NON_EMPTY_STRING = 'a non-empty string';
export const nonEmptyString = () => z.string({ error: NON_EMPTY_STRING }).min(1, { error: NON_EMPTY_STRING });

export const NAME = `a name of ${NAME_RULE}`;
export const name = () => z.string({ error: NAME }).regex(NAME_PATTERN, { error: NAME });

export const intBetween = (min: number, max: number) => {
  const phrase = `an integer >= ${min} and <= ${max}`;
  return z.int({ error: phrase }).min(min, { error: phrase }).max(max, { error: phrase });
};

export const priority = () => intBetween(-MAX_PRIORITY, MAX_PRIORITY);

/**
 * Requestors a `priority-ceiling` may name. Each request is checked against one map per label; the bound
 * keeps a configuration (and the resolved maps every handler holds) small: a pool has a few trusted
 * senders, not thousands.
 */
export const MAX_CEILING_REQUESTORS = 1000;
/** A requestor as a message names it (core/messages.ts): at most this many characters. */
export const MAX_REQUESTOR_LENGTH = 256;

/**
 * `priority-ceiling`: the best (lowest) priority a request may claim, by requestor. A request
 * that claims a better one is served at its ceiling (clamped, not refused), and its record keeps what
 * it claimed (core/priority.ts, trustedPriority).
 */
export const PRIORITY_CEILING_HELP =
  'The best (lowest) priority a request may claim, by its requestor: a request claiming a better one is served at its ceiling ' +
  '(clamped, not refused; its record keeps the priority it claimed). `requestor` is not authenticated: anyone who can send ' +
  'to the request queue can name any requestor, so give a trusted name a better ceiling only where the queue is yours alone.';
export const priorityCeiling = () =>
  z.strictObject(
    {
      default: priority()
        .optional()
        .describe(
          'Ceiling of a request whose requestor is not listed, or that names none. Unset = no ceiling for them.',
        ),
      requestors: z
        .record(
          z
            .string({ error: `a requestor of 1 to ${MAX_REQUESTOR_LENGTH} characters` })
            .min(1, { error: `a requestor of 1 to ${MAX_REQUESTOR_LENGTH} characters` })
            .max(MAX_REQUESTOR_LENGTH, { error: `a requestor of 1 to ${MAX_REQUESTOR_LENGTH} characters` }),
          priority(),
          { error: `a mapping of requestor (1 to ${MAX_REQUESTOR_LENGTH} characters) to priority` },
        )
        .refine((m) => Object.keys(m).length <= MAX_CEILING_REQUESTORS, {
          error: `at most ${MAX_CEILING_REQUESTORS} requestors`,
        })
        .default({})
        .describe(`Ceiling of each requestor named here; at most ${MAX_CEILING_REQUESTORS}.`),
    },
    { error: 'a mapping with "default" and/or "requestors"' },
  );

/** Seconds; fractions allowed. */
export const seconds = (max: number) => {
  const phrase = `a number of seconds >= 0 and <= ${max}`;
  return z.number({ error: phrase }).min(0, { error: phrase }).max(max, { error: phrase });
};

export const positiveSeconds = (max: number) => {
  const phrase = `a number of seconds > 0 and <= ${max}`;
  return z.number({ error: phrase }).positive({ error: phrase }).max(max, { error: phrase });
};

export const bool = () => z.boolean({ error: 'true or false' });

export { DEFAULT_REQUEST_TIMEOUT } from '../core/pools.ts';
export const MAX_REQUEST_TIMEOUT = MAX_KEEP_SECONDS;
export const requestTimeout = () => positiveSeconds(MAX_REQUEST_TIMEOUT);
export const REQUEST_TIMEOUT_HELP =
  'Seconds a request may wait to be placed (from when it was first recorded); then the reaper ends it failed. ' +
  `Set on the provider, pool or label: the most specific wins. At most ${MAX_REQUEST_TIMEOUT} (7 days).`;

/** default-lease / max-lease: whole seconds within a message's lease bounds (core/leases.ts). */
export const leaseSeconds = () => intBetween(MIN_LEASE, MAX_LEASE);
export const DEFAULT_LEASE_HELP =
  'Seconds of lease a request takes when it asks for none: its client must renew it, or the reaper releases its nodes. ' +
  `Unset = max-lease if set, else no lease. Set on the provider, pool or label: the most specific wins. ${MIN_LEASE} to ${MAX_LEASE} (7 days).`;
export const MAX_LEASE_HELP =
  'The longest lease a request may take or renew to; a longer one is refused. Unset = no bound. ' +
  `Set on the provider, pool or label: the most specific wins. ${MIN_LEASE} to ${MAX_LEASE} (7 days).`;

/**
 * A local provider's host: an IPv4 or IPv6 address or a DNS name. It is passed to each backing process's
 * command line, so a space or a leading '-' (`127.0.0.1 --evil`) must never get through; a name of digits
 * and dots only is not an address (999.1.1.1) and not a DNS name either.
 */
export const DNS_NAME =
  /^(?![0-9.]+$)(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$/;
export const HOST = 'an IPv4 or IPv6 address or a DNS name';
export const host = () =>
  z.union([z.ipv4({ error: HOST }), z.ipv6({ error: HOST }), z.string({ error: HOST }).regex(DNS_NAME)], {
    error: HOST,
  });

/** One instance, so the JSON Schema defines it once. */
export const jsonValue = z.json();

/**
 * Attributes (a local label's `attributes`, a metastatic pool's `node-attributes`): bytes of their JSON
 * text (UTF-8), each mapping. A node's attributes are its backing node's (the provider's own and the
 * label's) overridden by the pool's, and a request item holds up to 64 nodes (MAX_NODE_SET), each with
 * its attributes, in DynamoDB's 400 KB: with both mappings at this bound, the longest ids, host keys and
 * reasons, the largest request item is ~310 KB of JSON (test/embedded/limits.test.ts writes it to
 * dynalite; the sum is in docs/configuration.md, Limits). Without the bound, a long value would pass
 * validation, then leave its request pending forever.
 */
export const MAX_ATTRIBUTES_BYTES = 512;
/**
 * Levels of mappings and lists in attributes, the attributes mapping itself the first. DynamoDB stores
 * 32 levels; a node's attributes already sit three deep in its request item (nodes, node, attributes).
 */
export const MAX_ATTRIBUTES_DEPTH = 8;
/** DynamoDB's number range: 0, or a magnitude from 1e-130 up to (not including) 1e126. */
export const DYNAMODB_MIN_MAGNITUDE = 1e-130;
/** Exclusive: 1e126 itself is one past DynamoDB's 9.99…e125 (38 nines). */
export const DYNAMODB_MAGNITUDE_BELOW = 1e126;
const STORABLE_NUMBER = 'a number DynamoDB can store (0, or 1e-130 to 9.99e125 either way)';

/** Levels of mappings and lists in a JSON value (a scalar is 0). */
function depthOf(value: unknown): number {
  if (value === null || typeof value !== 'object') return 0;
  const children = Array.isArray(value) ? value : Object.values(value);
  return 1 + children.reduce<number>((deepest, child) => Math.max(deepest, depthOf(child)), 0);
}

/** The numbers DynamoDB cannot store in a JSON value, with their paths below it. */
function unstorableNumbers(
  value: unknown,
  path: (string | number)[] = [],
): { path: (string | number)[]; value: number }[] {
  if (typeof value === 'number') {
    const magnitude = Math.abs(value);
    const storable =
      magnitude === 0 || (magnitude >= DYNAMODB_MIN_MAGNITUDE && magnitude < DYNAMODB_MAGNITUDE_BELOW);
    return storable ? [] : [{ path, value }];
  }
  if (value === null || typeof value !== 'object') return [];
  return Object.entries(value).flatMap(([key, child]) =>
    unstorableNumbers(child, [...path, Array.isArray(value) ? Number(key) : key]),
  );
}

export const attributes = () =>
  z.record(z.string(), jsonValue, { error: 'a mapping of names to values' }).superRefine((value, ctx) => {
    // `params.got` is what the error says was found (load.ts): a size, not the whole value.
    const bytes = new TextEncoder().encode(JSON.stringify(value)).length;
    if (bytes > MAX_ATTRIBUTES_BYTES) {
      ctx.addIssue({
        code: 'custom',
        message: `a mapping of at most ${MAX_ATTRIBUTES_BYTES} bytes as JSON`,
        params: { got: `${bytes} bytes` },
      });
    }
    const depth = depthOf(value);
    if (depth > MAX_ATTRIBUTES_DEPTH) {
      ctx.addIssue({
        code: 'custom',
        message: `values nested at most ${MAX_ATTRIBUTES_DEPTH} levels deep`,
        params: { got: `${depth} levels` },
      });
    }
    for (const number of unstorableNumbers(value)) {
      ctx.addIssue({ code: 'custom', message: STORABLE_NUMBER, path: number.path, input: number.value });
    }
  });

export const nonEmptyList = <T extends z.ZodType>(item: T, what: string) => {
  const phrase = `a non-empty list of ${what}`;
  return z.array(item, { error: phrase }).min(1, { error: phrase });
};

export const MAPPING = 'a mapping';

// ---- shapes (what one slot gives; docs/configuration.md, Shapes) --------------------------------------

/** Cores of a slot: fractions allowed (a slot may be half a core), MIN_CORES to MAX_CORES. */
export const cores = () => {
  const phrase = `a number of cores >= ${MIN_CORES} and <= ${MAX_CORES}`;
  return z.number({ error: phrase }).min(MIN_CORES, { error: phrase }).max(MAX_CORES, { error: phrase });
};

/** A size with its unit (memory, disk), at most 1 PiB; kept as written, read with parseSize. */
export const size = () => {
  const phrase = `${SIZE_RULE}, at most 1PiB`;
  return z
    .string({ error: phrase })
    .max(32, { error: phrase })
    .regex(SIZE_PATTERN, { error: phrase })
    .refine(
      (s) => {
        const mib = parseSize(s);
        return mib !== undefined && mib > 0 && mib <= MAX_SIZE_MIB;
      },
      { error: phrase },
    );
};

/** What a backing node costs an hour (any currency, the same for every label); at most MAX_HOURLY_COST. */
export const MAX_HOURLY_COST = 10_000;
export const hourlyCost = () => {
  const phrase = `a cost per hour >= 0 and <= ${MAX_HOURLY_COST}`;
  return z.number({ error: phrase }).min(0, { error: phrase }).max(MAX_HOURLY_COST, { error: phrase });
};

// ---- credentials (a local backing pool's authorized-keys) -----------------------------------------------

/** Keys a local backing pool accepts besides the embedded pool's own client key. */
export const MAX_AUTHORIZED_KEYS = 32;
/** Characters of one key line: a 16384-bit RSA key with a comment fits; a pasted file does not. */
export const MAX_AUTHORIZED_KEY_CHARS = 4096;
/** The key types a local backing node can verify (ssh2's server: no FIDO `sk-` keys, no DSA). */
export const AUTHORIZED_KEY_TYPES = [
  'ssh-ed25519',
  'ssh-rsa',
  'ecdsa-sha2-nistp256',
  'ecdsa-sha2-nistp384',
  'ecdsa-sha2-nistp521',
] as const;
const AUTHORIZED_KEY = `an OpenSSH public key line "<type> <base64> [comment]" of at most ${MAX_AUTHORIZED_KEY_CHARS} characters, type ${AUTHORIZED_KEY_TYPES.join(', ')}`;

/**
 * Whether `line` is `<type> <base64> [comment]` with a known type whose base64 decodes to a key blob of
 * that same type (the blob starts with the type as an SSH string), as in an authorized_keys file without
 * options. Pure, so the configuration checks it without ssh2.
 */
export function isPublicKeyLine(line: string): boolean {
  const match = /^(\S+) ([A-Za-z0-9+/]+={0,2})(?: [^\r\n\0]*)?$/.exec(line);
  if (!match) return false;
  const [, type = '', base64 = ''] = match;
  if (!(AUTHORIZED_KEY_TYPES as readonly string[]).includes(type) || base64.length % 4 !== 0) return false;
  const blob = Buffer.from(base64, 'base64');
  if (blob.length < 4 + type.length) return false;
  return (
    blob.readUInt32BE(0) === type.length && blob.subarray(4, 4 + type.length).toString('latin1') === type
  );
}

export const authorizedKey = () =>
  z
    .string({ error: AUTHORIZED_KEY })
    .max(MAX_AUTHORIZED_KEY_CHARS, { error: AUTHORIZED_KEY })
    .refine(isPublicKeyLine, { error: AUTHORIZED_KEY });

export const authorizedKeys = () => {
  const phrase = `a list of at most ${MAX_AUTHORIZED_KEYS} public keys`;
  return z.array(authorizedKey(), { error: phrase }).max(MAX_AUTHORIZED_KEYS, { error: phrase });
};
