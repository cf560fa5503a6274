/**
 * The YAML shape of a configuration file (Nodepool's layout: a `providers` list with pools and labels,
 * plus an optional top-level `labels` list). Field-level rules live here; rules across fields and
 * providers (references, agreement between labels, unique names) are checked in rules.ts. The limits
 * and leaf schemas are in fields.ts, the aws driver's schema in awsSchema.ts.
 *
 * Every leaf schema carries an error phrase such as "an integer >= 1": load.ts turns a failed check into
 * `<key>: expected <phrase>, got <value>`, so keep the phrases short and in that grammatical form.
 * Objects are strict (an unknown key is an error, so typos are caught).
 */

import { z } from 'zod';
import { RECORD_RETENTION_SECONDS } from '../core/timing.ts';
import {
  attributes,
  bool,
  cores,
  DEFAULT_LEASE_HELP,
  DEFAULT_MAX_READY,
  DEFAULT_REQUEST_TIMEOUT,
  intBetween,
  leaseSeconds,
  MAPPING,
  MAX_ATTRIBUTES_BYTES,
  MAX_ATTRIBUTES_DEPTH,
  MAX_BOOT_SECONDS,
  MAX_KEEP_SECONDS,
  MAX_LAUNCH_RETRIES,
  MAX_LEASE_HELP,
  MAX_MIN_READY,
  MAX_PARALLEL_JOBS,
  MAX_SERVERS,
  name,
  nonEmptyList,
  PRIORITY_CEILING_HELP,
  positiveSeconds,
  priority,
  priorityCeiling,
  READY_TARGET_BOUNDS,
  REQUEST_TIMEOUT_HELP,
  requestTimeout,
  seconds,
  size,
} from '../fields/fields.ts';
import type { BackingProviderSection } from '../providers/driver.ts';
import { BACKING_DRIVERS, type BackingDriverName } from '../providers/drivers.ts';
import { githubSchema } from './githubSchema.ts';

// ---- driver: metastatic -----------------------------------------------------------------------------

export const metastaticLabelSchema = z.strictObject(
  {
    name: name().describe('The label users request; unique within the pool.'),
    'backing-label': name().describe(
      'The label of a local or aws pool whose nodes (backing nodes) are divided into slots for this label.',
    ),
    'max-parallel-jobs': intBetween(1, MAX_PARALLEL_JOBS)
      .default(1)
      .describe(`Slots per backing node; at most ${MAX_PARALLEL_JOBS}.`),
    'grace-time': seconds(MAX_KEEP_SECONDS)
      .default(60)
      .describe('Seconds an empty backing node is kept after its last slot was freed; at most 7 days.'),
    'min-retention-time': seconds(MAX_KEEP_SECONDS)
      .default(0)
      .describe(
        'Seconds after its launch before a backing node may be released (minimum billing periods); at most 7 days.',
      ),
    'max-age': seconds(MAX_KEEP_SECONDS)
      .optional()
      .describe(
        'Seconds after its launch after which a backing node takes no new nodes and goes once empty; ' +
          'unset or 0 = off. Must be >= min-retention-time; at most 7 days.',
      ),
    'host-key-checking': bool()
      .optional()
      .describe("Scan the backing node's SSH host keys at each slot allocation. Default: the pool's value."),
    'request-timeout': requestTimeout()
      .optional()
      .describe(`${REQUEST_TIMEOUT_HELP} Default: the pool's value.`),
    'default-lease': leaseSeconds().optional().describe(`${DEFAULT_LEASE_HELP} Default: the pool's value.`),
    'max-lease': leaseSeconds().optional().describe(`${MAX_LEASE_HELP} Default: the pool's value.`),
    cores: cores()
      .optional()
      .describe(
        "Cores one slot gives, for requests by shape. Default: the backing instance type's vCPUs / max-parallel-jobs, where known.",
      ),
    memory: size()
      .optional()
      .describe(
        'Memory one slot gives ("4GiB"), for requests by shape. Default: the backing instance type\'s / max-parallel-jobs, where known.',
      ),
    disk: size().optional().describe('Disk one slot gives ("20GiB"), for requests by shape.'),
  },
  { error: MAPPING },
);

export const metastaticPoolSchema = z.strictObject(
  {
    name: name().describe('Unique within the provider.'),
    priority: priority().optional().describe("Lower wins. Default: the provider's priority."),
    'max-servers': z
      .int({ error: `an integer <= ${MAX_SERVERS}` })
      .max(MAX_SERVERS, { error: `an integer <= ${MAX_SERVERS}` })
      .optional()
      .describe(
        `This pool's metastatic nodes in any state; unset = unlimited; <= 0 disables the pool; at most ${MAX_SERVERS}.`,
      ),
    'node-attributes': attributes()
      .default({})
      .describe(
        `Override the backing node's attributes (top-level keys only). At most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, nested at most ${MAX_ATTRIBUTES_DEPTH} levels, numbers DynamoDB can store.`,
      ),
    'host-key-checking': bool().default(false).describe('Default for the labels of this pool.'),
    'request-timeout': requestTimeout()
      .optional()
      .describe(`${REQUEST_TIMEOUT_HELP} Default: the provider's value.`),
    'default-lease': leaseSeconds()
      .optional()
      .describe(`${DEFAULT_LEASE_HELP} Default: the provider's value.`),
    'max-lease': leaseSeconds().optional().describe(`${MAX_LEASE_HELP} Default: the provider's value.`),
    labels: nonEmptyList(metastaticLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const metastaticProviderSchema = z.strictObject(
  {
    name: name().describe('Unique among providers.'),
    driver: z.literal('metastatic'),
    // Nodepool's documentation says 60, but its code uses 120; we follow the code.
    'boot-timeout': positiveSeconds(MAX_BOOT_SECONDS)
      .default(120)
      .describe(
        'Seconds after the provider reports a backing node running within which its connection port must answer; also bounds each SSH host-key scan. At most a day.',
      ),
    'launch-timeout': positiveSeconds(MAX_BOOT_SECONDS)
      .default(3600)
      .describe(
        "Seconds from the start of a node's launch (including its backing node's) to ready; at most a day.",
      ),
    'launch-retries': intBetween(1, MAX_LAUNCH_RETRIES)
      .default(3)
      .describe(
        `Total number of launch attempts (not retries after the first); at most ${MAX_LAUNCH_RETRIES}.`,
      ),
    priority: priority().default(100).describe('Default priority of the pools (lower wins).'),
    'request-timeout': requestTimeout().default(DEFAULT_REQUEST_TIMEOUT).describe(REQUEST_TIMEOUT_HELP),
    'default-lease': leaseSeconds().optional().describe(DEFAULT_LEASE_HELP),
    'max-lease': leaseSeconds().optional().describe(MAX_LEASE_HELP),
    pools: nonEmptyList(metastaticPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- top level --------------------------------------------------------------------------------------

/** A provider section: `metastatic`, or one of the backing drivers (shared/providers/drivers.ts). */
export const providerSchema = z.discriminatedUnion(
  'driver',
  [metastaticProviderSchema, ...Object.values(BACKING_DRIVERS).map((d) => d.schema)],
  { error: MAPPING },
);

const MIN_READY = `an integer >= 0 and <= ${MAX_MIN_READY}, or auto`;
const READY_TARGET = `a share >= ${READY_TARGET_BOUNDS.min} and <= ${READY_TARGET_BOUNDS.max}`;

export const topLevelLabelSchema = z
  .strictObject(
    {
      name: name(),
      'min-ready': z
        .union(
          [
            z.int({ error: MIN_READY }).min(0, { error: MIN_READY }).max(MAX_MIN_READY, { error: MIN_READY }),
            z.literal('auto', { error: MIN_READY }),
          ],
          { error: MIN_READY },
        )
        .optional()
        .describe(
          `Nodes of this label kept ready and unassigned ahead of requests (they count against max-servers); at most ${MAX_MIN_READY}. auto: as many as the label's arrival forecast says the next launch-to-ready time needs for ready-target of its requests to find one, at most max-ready.`,
        ),
      'ready-target': z
        .number({ error: READY_TARGET })
        .min(READY_TARGET_BOUNDS.min, { error: READY_TARGET })
        .max(READY_TARGET_BOUNDS.max, { error: READY_TARGET })
        .optional()
        .describe(
          `With min-ready: auto, the share of requests that should find a ready node (default ${READY_TARGET_BOUNDS.default}).`,
        ),
      'max-ready': intBetween(1, MAX_MIN_READY)
        .optional()
        .describe(`With min-ready: auto, the most ready nodes held (default ${DEFAULT_MAX_READY}).`),
      'priority-ceiling': priorityCeiling()
        .optional()
        .describe(
          `${PRIORITY_CEILING_HELP} For requests of this label, instead of the top-level one; a request of several labels takes the worst of theirs.`,
        ),
    },
    { error: MAPPING },
  )
  .superRefine((label, ctx) => {
    if (label['min-ready'] === 'auto') return;
    for (const key of ['ready-target', 'max-ready'] as const) {
      if (label[key] === undefined) continue;
      ctx.addIssue({
        code: 'custom',
        path: [key],
        message: `a key of min-ready: auto only (min-ready is ${label['min-ready'] ?? 0})`,
        input: label[key],
      });
    }
  });

/** Percent above the cheapest label a request by shape may pay to get a free slot now (no launch). */
export const MAX_SHAPE_COST_MARGIN = 1000;
export const DEFAULT_SHAPE_COST_MARGIN = 20;

export const configSchema = z
  .strictObject(
    {
      labels: z
        .array(topLevelLabelSchema, { error: 'a list of labels' })
        .optional()
        .describe('When present, every label offered by any pool must be listed here.'),
      'learned-durations': bool()
        .default(false)
        .describe(
          'Learn how long nodes of each label (and requestor) are kept, and place a node whose request gives no expected-duration by that estimate when it is confident of one.',
        ),
      'record-retention': intBetween(RECORD_RETENTION_SECONDS.min, RECORD_RETENTION_SECONDS.max)
        .default(RECORD_RETENTION_SECONDS.default)
        .describe(
          `Seconds an ended request (every node released or failed) or a stopped backing node stays in the table before DynamoDB's TTL deletes it (attribute expiresAt). ${RECORD_RETENTION_SECONDS.min / 86400} days (a request message's life in the queue: its record tells a redelivery from a new request) to ${RECORD_RETENTION_SECONDS.max / 86400} days; default ${RECORD_RETENTION_SECONDS.default / 86400}.`,
        ),
      'priority-ceiling': priorityCeiling()
        .optional()
        .describe(`${PRIORITY_CEILING_HELP} Unset = no ceiling: any request may claim any priority.`),
      'shape-cost-margin': intBetween(0, MAX_SHAPE_COST_MARGIN)
        .default(DEFAULT_SHAPE_COST_MARGIN)
        .describe(
          `Requests by shape: a label with a free slot now (no launch) is chosen over the cheapest fitting label when its cost per slot-hour is at most this many percent higher. At most ${MAX_SHAPE_COST_MARGIN}.`,
        ),
      github: githubSchema.optional(),
      providers: nonEmptyList(providerSchema, 'providers'),
    },
    { error: 'a mapping with a "providers" list' },
  )
  .meta({
    title: 'metastatic configuration',
    description:
      'Providers of metastatic nodes (slots on backing nodes) and of the backing nodes themselves.',
  });

/**
 * The file as the schema gives it. Its providers are typed by kind: a metastatic section, or a backing
 * driver's, whose own keys the driver reads (shared/providers/<driver>/configSchema.ts).
 */
export type ConfigFile = Omit<z.infer<typeof configSchema>, 'providers'> & { providers: ProviderConfig[] };
export type ConfigFileInput = z.input<typeof configSchema>;
export type ProviderConfig =
  | MetastaticProviderConfig
  | (BackingProviderSection & { readonly driver: BackingDriverName });
export type MetastaticProviderConfig = z.infer<typeof metastaticProviderSchema>;
export type MetastaticPoolConfig = z.infer<typeof metastaticPoolSchema>;
export type MetastaticLabelConfig = z.infer<typeof metastaticLabelSchema>;
export type TopLevelLabelConfig = z.infer<typeof topLevelLabelSchema>;

// ---- schema introspection (for error messages) ------------------------------------------------------

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Strips optional/default wrappers and picks the discriminated-union option the data selects. */
function unwrap(schema: z.ZodType, data: unknown): z.ZodType | undefined {
  let current: z.ZodType = schema;
  for (;;) {
    if (current instanceof z.ZodOptional || current instanceof z.ZodDefault) {
      current = current.unwrap() as z.ZodType;
    } else if (current instanceof z.ZodDiscriminatedUnion) {
      const key = current.def.discriminator;
      const value = isRecord(data) ? data[key] : undefined;
      const option = (current.options as z.ZodType[]).find((candidate) => {
        if (!(candidate instanceof z.ZodObject)) return false;
        const literal = candidate.shape[key];
        return literal instanceof z.ZodLiteral && literal.values.has(value as never);
      });
      if (!option) return undefined;
      current = option;
    } else {
      return current;
    }
  }
}

/**
 * The keys the schema accepts for the mapping at `path` in `data` (following the discriminator where the
 * data gives one), or undefined when the path does not lead to a mapping schema.
 */
export function knownKeysAt(path: readonly PropertyKey[], data: unknown): string[] | undefined {
  // Walked as the base type: letting the compiler prove the full schema's type assignable to z.ZodType is
  // four seconds of every type check (a deep variance comparison), for nothing the walk relies on.
  let schema: z.ZodType | undefined = configSchema as unknown as z.ZodType;
  let value: unknown = data;
  for (const segment of path) {
    schema = schema && unwrap(schema, value);
    if (schema instanceof z.ZodObject && typeof segment === 'string') {
      schema = (schema.shape as Record<string, z.ZodType>)[segment];
      value = isRecord(value) ? value[segment] : undefined;
    } else if (schema instanceof z.ZodArray && typeof segment === 'number') {
      schema = schema.element as z.ZodType;
      value = Array.isArray(value) ? value[segment] : undefined;
    } else {
      return undefined;
    }
  }
  schema = schema && unwrap(schema, value);
  return schema instanceof z.ZodObject ? Object.keys(schema.shape) : undefined;
}
