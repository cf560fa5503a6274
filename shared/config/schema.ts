/**
 * The YAML shape of a configuration file (Nodepool's layout: a `providers` list with pools and labels,
 * plus an optional top-level `labels` list). Field-level rules live here; rules across fields and
 * providers (references, agreement between labels, unique names) are checked in resolve.ts.
 *
 * Every leaf schema carries an error phrase such as "an integer >= 1": load.ts turns a failed check into
 * `<key>: expected <phrase>, got <value>`, so keep the phrases short and in that grammatical form.
 * Objects are strict (an unknown key is an error, so typos are caught).
 */
import { z } from 'zod';

export const DRIVERS = ['metastatic', 'local', 'aws'] as const;
export type Driver = (typeof DRIVERS)[number];

// ---- limits -----------------------------------------------------------------------------------------
// Every number has a maximum (issue 10): an unbounded value validated, then broke the pool at run time
// (max-parallel-jobs 1e9 built an array of every free slot, boot-delay 1e12 overflowed Node's timer).
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
 * Servers of a pool (and min-ready). A pool's capacity set is one DynamoDB item (400 KB): 1,000 of the
 * longest node ids with their owner tokens take ~170 KB.
 */
export const MAX_SERVERS = 1000;
/** Launch attempts per node: each may take up to launch-timeout; more only delay the failure. */
export const MAX_LAUNCH_RETRIES = 20;
/** Priorities: only their order matters; the bound keeps them plain integers. */
export const MAX_PRIORITY = 1_000_000;
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

const NON_EMPTY_STRING = 'a non-empty string';
const nonEmptyString = () => z.string({ error: NON_EMPTY_STRING }).min(1, { error: NON_EMPTY_STRING });

const NAME = `a name of ${NAME_RULE}`;
const name = () => z.string({ error: NAME }).regex(NAME_PATTERN, { error: NAME });

const intBetween = (min: number, max: number) => {
  const phrase = `an integer >= ${min} and <= ${max}`;
  return z.int({ error: phrase }).min(min, { error: phrase }).max(max, { error: phrase });
};

const priority = () => intBetween(-MAX_PRIORITY, MAX_PRIORITY);

/** Seconds; fractions allowed. */
const seconds = (max: number) => {
  const phrase = `a number of seconds >= 0 and <= ${max}`;
  return z.number({ error: phrase }).min(0, { error: phrase }).max(max, { error: phrase });
};

const positiveSeconds = (max: number) => {
  const phrase = `a number of seconds > 0 and <= ${max}`;
  return z.number({ error: phrase }).positive({ error: phrase }).max(max, { error: phrase });
};

const bool = () => z.boolean({ error: 'true or false' });

/** request-timeout: how long a request may wait to be placed (issue 14 builds on it). */
export const DEFAULT_REQUEST_TIMEOUT = 3 * 3600;
export const MAX_REQUEST_TIMEOUT = MAX_KEEP_SECONDS;
const requestTimeout = () => positiveSeconds(MAX_REQUEST_TIMEOUT);
const REQUEST_TIMEOUT_HELP =
  'Seconds a request may wait to be placed (from when it was first recorded); then the reaper ends it failed. ' +
  `Set on the provider, pool or label: the most specific wins. At most ${MAX_REQUEST_TIMEOUT} (7 days).`;

/**
 * A local provider's host: an IPv4 or IPv6 address or a DNS name. It is passed to each backing process's
 * command line, so a space or a leading '-' (`127.0.0.1 --evil`) must never get through; a name of digits
 * and dots only is not an address (999.1.1.1) and not a DNS name either.
 */
const DNS_NAME =
  /^(?![0-9.]+$)(?=.{1,253}\.?$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$/;
const HOST = 'an IPv4 or IPv6 address or a DNS name';
const host = () =>
  z.union([z.ipv4({ error: HOST }), z.ipv6({ error: HOST }), z.string({ error: HOST }).regex(DNS_NAME)], {
    error: HOST,
  });

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
      .describe("Override the backing node's attributes (top-level keys only)."),
    'host-key-checking': bool().default(false).describe('Default for the labels of this pool.'),
    'request-timeout': requestTimeout()
      .optional()
      .describe(`${REQUEST_TIMEOUT_HELP} Default: the provider's value.`),
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
    pools: nonEmptyList(metastaticPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- driver: local (backing nodes are local child processes) ----------------------------------------

export const localLabelSchema = z.strictObject(
  {
    name: name().describe('A backing label; unique within the pool.'),
    'boot-delay': seconds(MAX_BOOT_SECONDS)
      .default(0)
      .describe('Seconds before the process accepts connections; at most a day.'),
    attributes: attributes().default({}).describe('Attributes the backing node reports.'),
  },
  { error: MAPPING },
);

export const localPoolSchema = z.strictObject(
  {
    name: name().describe('Unique within the provider.'),
    'max-servers': intBetween(1, MAX_SERVERS)
      .optional()
      .describe(`Backing nodes this pool may run at once; unset = unlimited; at most ${MAX_SERVERS}.`),
    labels: nonEmptyList(localLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const localProviderSchema = z.strictObject(
  {
    name: name().describe('Unique among providers.'),
    driver: z.literal('local'),
    host: host()
      .default('127.0.0.1')
      .describe('Address the backing processes listen on: an IPv4 or IPv6 address or a DNS name.'),
    pools: nonEmptyList(localPoolSchema, 'pools'),
  },
  { error: MAPPING },
);

// ---- driver: aws (backing nodes are EC2 instances) -------------------------------------------------
// Keys follow Nodepool's AWS driver where it has them. Rules across keys ("exactly one of instance-type
// and instance-types", ...) are checked in resolve.ts, like every other cross-field rule.

const stringList = (what: string) => nonEmptyList(nonEmptyString(), what);

export const EBS_VOLUME_TYPES = ['gp3', 'gp2', 'io2', 'io1', 'st1', 'sc1', 'standard'] as const;

const TAG_KEY = 'a tag key of 1 to 128 characters';
const TAG_VALUE = 'a tag value of at most 256 characters';

export const awsLaunchTemplateSchema = z.strictObject(
  {
    id: nonEmptyString().optional().describe('The launch template id (lt-...); give id or name.'),
    name: nonEmptyString().optional().describe('The launch template name; give id or name.'),
    version: z
      .union([nonEmptyString(), intBetween(1, MAX_TEMPLATE_VERSION)], {
        error: 'a version number, "$Latest" or "$Default"',
      })
      .optional()
      .describe('A version number, "$Latest" or "$Default". Default: the default version.'),
  },
  { error: MAPPING },
);

export const awsIamInstanceProfileSchema = z.strictObject(
  {
    name: nonEmptyString().optional().describe('The instance profile name; give name or arn.'),
    arn: nonEmptyString().optional().describe('The instance profile ARN; give name or arn.'),
  },
  { error: MAPPING },
);

export const awsLabelSchema = z.strictObject(
  {
    name: name().describe('A backing label; unique within the pool.'),
    'instance-type': nonEmptyString()
      .optional()
      .describe('The EC2 instance type. Give instance-type or instance-types.'),
    'instance-types': stringList('instance types')
      .optional()
      .describe(
        'EC2 instance types tried in this order when one has no capacity. Give instance-type or instance-types.',
      ),
    'image-id': nonEmptyString().optional().describe('The AMI (ami-...). Give image-id or launch-template.'),
    'launch-template': awsLaunchTemplateSchema
      .optional()
      .describe(
        'A launch template to launch from (it then owns the root volume). Give image-id or launch-template.',
      ),
    'key-name': nonEmptyString().optional().describe('The EC2 key pair installed on the instance.'),
    userdata: z
      .string({ error: 'a string' })
      .optional()
      .describe('User data (plain text; sent base64-encoded).'),
    'iam-instance-profile': awsIamInstanceProfileSchema
      .optional()
      .describe('The IAM instance profile, by name or by ARN.'),
    'volume-size': intBetween(1, MAX_VOLUME_SIZE)
      .optional()
      .describe(
        "Root volume size in GiB, within the EBS limits of its volume-type (gp3, gp2, io1, st1, sc1: 16384; io2: 65536; standard: 1024). Default: the image's.",
      ),
    'volume-type': z
      .enum(EBS_VOLUME_TYPES, { error: `one of ${EBS_VOLUME_TYPES.join(', ')}` })
      .optional()
      // No zod default: with a launch-template the key must stay absent (the template owns the volume).
      .describe('Root volume type, default gp3 (the root volume is always encrypted).'),
    tags: z
      .record(
        z.string({ error: TAG_KEY }).min(1, { error: TAG_KEY }).max(128, { error: TAG_KEY }),
        z.string({ error: TAG_VALUE }).max(256, { error: TAG_VALUE }),
        { error: 'a mapping of tag names to strings' },
      )
      .default({})
      .describe(
        'Extra tags for the instance and its volumes (keys "aws:..." and "metastatic:..." are reserved).',
      ),
    'use-spot': bool()
      .default(false)
      .describe('Launch spot instances, falling back to on-demand when spot has no capacity.'),
    'connection-port': z
      .int({ error: 'a port number from 1 to 65535' })
      .min(1, { error: 'a port number from 1 to 65535' })
      .max(65535, { error: 'a port number from 1 to 65535' })
      .default(22)
      .describe('The TCP port nodes connect to (SSH).'),
  },
  { error: MAPPING },
);

export const awsPoolSchema = z.strictObject(
  {
    name: name().describe('Unique within the provider.'),
    'max-servers': intBetween(1, MAX_SERVERS)
      .optional()
      .describe(`Backing nodes this pool may run at once; unset = unlimited; at most ${MAX_SERVERS}.`),
    'subnet-ids': stringList('subnet ids')
      .optional()
      .describe(
        'Subnets to launch in, tried in this order when one has no capacity. Give subnet-ids or subnet-id.',
      ),
    'subnet-id': nonEmptyString()
      .optional()
      .describe('A single subnet to launch in. Give subnet-ids or subnet-id.'),
    'security-group-ids': stringList('security group ids')
      .optional()
      .describe("Security groups of the instances. Default: the VPC's default group."),
    'security-group-id': nonEmptyString().optional().describe('A single security group.'),
    'public-ipv4': bool()
      .default(false)
      .describe('Give the instances a public IPv4 address and connect to it (instead of the private one).'),
    labels: nonEmptyList(awsLabelSchema, 'labels'),
  },
  { error: MAPPING },
);

export const awsProviderSchema = z.strictObject(
  {
    name: name().describe('Unique among providers.'),
    driver: z.literal('aws'),
    region: nonEmptyString().describe('The AWS region, e.g. eu-west-1.'),
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
    name: name(),
    'min-ready': intBetween(0, MAX_SERVERS)
      .optional()
      .describe(`Nodes of this label to keep ready; at most ${MAX_SERVERS}.`),
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
