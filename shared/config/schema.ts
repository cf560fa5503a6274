/**
 * The YAML shape of a configuration file (Nodepool's layout: a `providers` list with pools and labels,
 * plus an optional top-level `labels` list). Field-level rules live here; rules across fields and
 * providers (references, agreement between labels, unique names) are checked in resolve.ts.
 *
 * Every leaf schema carries an error phrase such as "an integer >= 1": load.ts turns a failed check into
 * `<key>: expected <phrase>, got <value>`, so keep the phrases short and in that grammatical form.
 * Objects are strict (an unknown key is an error, so typos are caught), except the `aws` driver's, whose
 * full schema comes later and which therefore accept extra keys.
 */
import { z } from 'zod';

export const DRIVERS = ['metastatic', 'local', 'aws'] as const;
export type Driver = (typeof DRIVERS)[number];

// ---- leaf builders ----------------------------------------------------------------------------------

const NON_EMPTY_STRING = 'a non-empty string';
const nonEmptyString = () => z.string({ error: NON_EMPTY_STRING }).min(1, { error: NON_EMPTY_STRING });

const integer = () => z.int({ error: 'an integer' });

const intAtLeast = (min: number) => {
  const phrase = `an integer >= ${min}`;
  return z.int({ error: phrase }).min(min, { error: phrase });
};

/** Seconds; fractions allowed. */
const seconds = () => {
  const phrase = 'a number of seconds >= 0';
  return z.number({ error: phrase }).min(0, { error: phrase });
};

const positiveSeconds = () => {
  const phrase = 'a number of seconds > 0';
  return z.number({ error: phrase }).positive({ error: phrase });
};

const bool = () => z.boolean({ error: 'true or false' });

/** One instance, so the JSON Schema defines it once. */
const jsonValue = z.json();
const attributes = () => z.record(z.string(), jsonValue, { error: 'a mapping of names to values' });

const nonEmptyList = <T extends z.ZodType>(item: T, what: string) => {
  const phrase = `a non-empty list of ${what}`;
  return z.array(item, { error: phrase }).min(1, { error: phrase });
};

const MAPPING = 'a mapping';

// ---- driver: metastatic -----------------------------------------------------------------------------

export const metastaticLabelSchema = z.strictObject(
  {
    name: nonEmptyString().describe('The label users request; unique within the pool.'),
    'backing-label': nonEmptyString().describe(
      'The label of a local or aws pool whose nodes (backing nodes) are divided into slots for this label.',
    ),
    'max-parallel-jobs': intAtLeast(1).default(1).describe('Slots per backing node.'),
    'grace-time': seconds()
      .default(60)
      .describe('Seconds an empty backing node is kept after its last slot was freed.'),
    'min-retention-time': seconds()
      .default(0)
      .describe('Seconds after its launch before a backing node may be released (minimum billing periods).'),
    'max-age': seconds()
      .optional()
      .describe(
        'Seconds after its launch after which a backing node takes no new nodes and goes once empty; ' +
          'unset or 0 = off. Must be >= min-retention-time.',
      ),
    'host-key-checking': bool()
      .optional()
      .describe("Scan the backing node's SSH host keys at each slot allocation. Default: the pool's value."),
  },
  { error: MAPPING },
);

export const metastaticPoolSchema = z.strictObject(
  {
    name: nonEmptyString().describe('Unique within the provider.'),
    priority: integer().optional().describe("Lower wins. Default: the provider's priority."),
    'max-servers': integer()
      .optional()
      .describe("This pool's metastatic nodes in any state; unset = unlimited; <= 0 disables the pool."),
    'node-attributes': attributes()
      .default({})
      .describe("Override the backing node's attributes (top-level keys only)."),
    'host-key-checking': bool().default(false).describe('Default for the labels of this pool.'),
    labels: nonEmptyList(metastaticLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const metastaticProviderSchema = z.strictObject(
  {
    name: nonEmptyString().describe('Unique among providers.'),
    driver: z.literal('metastatic'),
    // Nodepool's documentation says 60, but its code uses 120; we follow the code.
    'boot-timeout': seconds()
      .default(120)
      .describe('Seconds to bound the SSH host-key scan (only used when host-key-checking is on).'),
    'launch-timeout': positiveSeconds()
      .default(3600)
      .describe("Seconds from the start of a node's launch (including its backing node's) to ready."),
    'launch-retries': intAtLeast(1)
      .default(3)
      .describe('Total number of launch attempts (not retries after the first).'),
    priority: integer().default(100).describe('Default priority of the pools (lower wins).'),
    pools: nonEmptyList(metastaticPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- driver: local (backing nodes are local child processes) ----------------------------------------

export const localLabelSchema = z.strictObject(
  {
    name: nonEmptyString().describe('A backing label; unique within the pool.'),
    'boot-delay': seconds().default(0).describe('Seconds before the process accepts connections.'),
    attributes: attributes().default({}).describe('Attributes the backing node reports.'),
  },
  { error: MAPPING },
);

export const localPoolSchema = z.strictObject(
  {
    name: nonEmptyString().describe('Unique within the provider.'),
    'max-servers': intAtLeast(1)
      .optional()
      .describe('Backing nodes this pool may run at once; unset = unlimited.'),
    labels: nonEmptyList(localLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const localProviderSchema = z.strictObject(
  {
    name: nonEmptyString().describe('Unique among providers.'),
    driver: z.literal('local'),
    host: nonEmptyString().default('127.0.0.1').describe('Address the backing processes listen on.'),
    pools: nonEmptyList(localPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- driver: aws (full schema later: extra keys are accepted and passed on as options) --------------

export const awsLabelSchema = z.looseObject(
  { name: nonEmptyString().describe('A backing label; unique within the pool.') },
  { error: MAPPING },
);

export const awsPoolSchema = z.looseObject(
  {
    name: nonEmptyString().describe('Unique within the provider.'),
    'max-servers': integer()
      .optional()
      .describe('Backing nodes this pool may run at once; unset = unlimited.'),
    labels: nonEmptyList(awsLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const awsProviderSchema = z.looseObject(
  {
    name: nonEmptyString().describe('Unique among providers.'),
    driver: z.literal('aws'),
    pools: nonEmptyList(awsPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- top level --------------------------------------------------------------------------------------

export const providerSchema = z.discriminatedUnion(
  'driver',
  [metastaticProviderSchema, localProviderSchema, awsProviderSchema],
  { error: MAPPING },
);

export const topLevelLabelSchema = z.strictObject(
  {
    name: nonEmptyString(),
    'min-ready': intAtLeast(0).optional().describe('Nodes of this label to keep ready.'),
  },
  { error: MAPPING },
);

export const configSchema = z
  .strictObject(
    {
      labels: z
        .array(topLevelLabelSchema, { error: 'a list of labels' })
        .optional()
        .describe('When present, every label offered by any pool must be listed here.'),
      providers: nonEmptyList(providerSchema, 'providers'),
    },
    { error: 'a mapping with a "providers" list' },
  )
  .meta({
    title: 'metastatic configuration',
    description:
      'Providers of metastatic nodes (slots on backing nodes) and of the backing nodes themselves.',
  });

export type ConfigFile = z.infer<typeof configSchema>;
export type ConfigFileInput = z.input<typeof configSchema>;
export type ProviderConfig = z.infer<typeof providerSchema>;
export type MetastaticProviderConfig = z.infer<typeof metastaticProviderSchema>;
export type MetastaticPoolConfig = z.infer<typeof metastaticPoolSchema>;
export type MetastaticLabelConfig = z.infer<typeof metastaticLabelSchema>;
export type LocalProviderConfig = z.infer<typeof localProviderSchema>;
export type LocalPoolConfig = z.infer<typeof localPoolSchema>;
export type LocalLabelConfig = z.infer<typeof localLabelSchema>;
export type AwsProviderConfig = z.infer<typeof awsProviderSchema>;
export type AwsPoolConfig = z.infer<typeof awsPoolSchema>;
export type AwsLabelConfig = z.infer<typeof awsLabelSchema>;
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
  let schema: z.ZodType | undefined = configSchema;
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
