import { z } from 'zod';
import {
  authorizedKeys,
  contractKeys,
  DEFAULT_AWS_USERNAME,
  MAX_AUTHORIZED_KEYS,
  perSlotUsers,
  username,
} from '../../fields/contractFields.ts';
import {
  bool,
  hourlyCost,
  intBetween,
  MAPPING,
  MAX_SERVERS,
  MAX_TEMPLATE_VERSION,
  MAX_VOLUME_SIZE,
  name,
  nonEmptyList,
  nonEmptyString,
} from '../../fields/fields.ts';

// ---- driver: aws (backing nodes are EC2 instances) -------------------------------------------------
// Keys follow Nodepool's AWS driver where it has them. Rules across keys ("exactly one of instance-type
// and instance-types", ...) are checked in awsRules.ts, like every other cross-field rule in rules.ts.

const stringList = (what: string) => nonEmptyList(nonEmptyString(), what);

export const EBS_VOLUME_TYPES = ['gp3', 'gp2', 'io2', 'io1', 'st1', 'sc1', 'standard'] as const;

/**
 * How a backing node's SSH host keys are learned before its nodes are handed out (docs/aws.md, "Host
 * keys"): from EC2's console output (no network path needed), by an SSH scan from the functions (needs
 * one), or not at all.
 */
export const HOST_KEY_SOURCES = ['console', 'scan', 'none'] as const;
export type HostKeySource = (typeof HOST_KEY_SOURCES)[number];
const HOST_KEYS_HELP =
  "How the instances' SSH host keys, which every node carries, are learned before their nodes are handed out: " +
  'console (what cloud-init prints to the serial console, read with GetConsoleOutput; the backing node waits for them within boot-timeout), ' +
  'scan (an SSH handshake from the functions; needs a network path to the instances), or none (nodes carry no host keys).';
const hostKeys = () =>
  z.enum(HOST_KEY_SOURCES, { error: `one of ${HOST_KEY_SOURCES.join(', ')}` }).optional();

const TAG_KEY = 'a tag key of 1 to 128 characters';
const TAG_VALUE = 'a tag value of at most 256 characters';

/**
 * A label's own tags: EC2 allows 50 per resource, and metastatic sets five (four `metastatic:` keys and
 * `Name`, which a label's `Name` replaces, so that one does not count). More would fail every launch.
 */
export const MAX_USER_TAGS = 45;
/** User data: EC2 takes at most 16 KB, counted before base64; more would fail every launch. */
export const MAX_USERDATA_BYTES = 16_384;
const USERDATA = `a string of at most ${MAX_USERDATA_BYTES} bytes`;

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
      .string({ error: USERDATA })
      // Characters for the JSON schema's maxLength; the check that counts is in bytes, below.
      .max(MAX_USERDATA_BYTES, { error: USERDATA })
      .superRefine((value, ctx) => {
        const bytes = new TextEncoder().encode(value).length;
        if (bytes > MAX_USERDATA_BYTES) {
          ctx.addIssue({
            code: 'custom',
            message: `at most ${MAX_USERDATA_BYTES} bytes of UTF-8 (EC2's limit before base64)`,
            params: { got: `${bytes} bytes` },
          });
        }
      })
      .optional()
      .describe(`User data (plain text; sent base64-encoded); at most ${MAX_USERDATA_BYTES} bytes.`),
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
      .superRefine((value, ctx) => {
        const counted = Object.keys(value).filter((key) => key !== 'Name').length;
        if (counted > MAX_USER_TAGS) {
          ctx.addIssue({
            code: 'custom',
            message: `at most ${MAX_USER_TAGS} tags besides Name (EC2 allows 50 and metastatic sets 5)`,
            params: { got: String(counted) },
          });
        }
      })
      .default({})
      .describe(
        `Extra tags for the instance and its volumes (keys "aws:..." and "metastatic:..." are reserved); at most ${MAX_USER_TAGS} besides Name.`,
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
    username: username()
      .default(DEFAULT_AWS_USERNAME)
      .describe(
        `Whom jobs log in as on its nodes (Nodepool's username): the image's user that gets the pool's authorized-keys. Default ${DEFAULT_AWS_USERNAME} (Amazon Linux, RHEL, SUSE, Fedora); ubuntu on Ubuntu, admin on Debian.`,
      ),
    'per-slot-users': perSlotUsers(),
    isolation: z
      .enum(['none', 'contain'], { error: 'one of none, contain' })
      .default('none')
      .describe(
        "Whether each slot's jobs are contained (needs per-slot-users): the slot users are made at boot by the slot program, each session is held by its slot's cgroup (the metastatic label's cores and memory, a pids cap), has its own /tmp, /var/tmp and /dev/shm (pam_namespace), sees only its own processes (/proc hidepid=2) and cannot reach the instance metadata service (nftables or iptables) unless slot-imds; slot users log in only with the pool's keys. The image needs cloud-init, sshd with PAM and sshd_config.d, pam_namespace, util-linux, and nft or iptables. none: per-slot-users' separate users only.",
      ),
    'slot-imds': bool()
      .default(false)
      .describe(
        "With isolation: contain, let the slot users reach the instance metadata service (and so the instance profile's credentials). Default false: refused to them.",
      ),
    ...contractKeys,
    'host-keys': hostKeys().describe(`${HOST_KEYS_HELP} Default: the pool's value.`),
    'hourly-cost': hourlyCost()
      .optional()
      .describe(
        "What one instance costs an hour: requests by shape go to the cheapest slot that fits. Default: the instance type's on-demand price in us-east-1, where known.",
      ),
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
    'authorized-keys': authorizedKeys()
      .optional()
      .describe(
        `OpenSSH public keys (of the CI system) put on every instance the pool launches, through cloud-init in its user data, for each label's username (or each slot's user with per-slot-users); at most ${MAX_AUTHORIZED_KEYS}. The image needs cloud-init.`,
      ),
    'host-keys': hostKeys().describe(
      `${HOST_KEYS_HELP} Default: scan when the functions reach the instances (they run in the instances' VPC, or public-ipv4), else console.`,
    ),
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

export type AwsProviderConfig = z.infer<typeof awsProviderSchema>;
export type AwsPoolConfig = z.infer<typeof awsPoolSchema>;
export type AwsLabelConfig = z.infer<typeof awsLabelSchema>;
