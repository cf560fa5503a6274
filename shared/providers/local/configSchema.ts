import { z } from 'zod';
import { contractKeys } from '../../fields/contractFields.ts';
import {
  attributes,
  authorizedKeys,
  host,
  hourlyCost,
  intBetween,
  MAPPING,
  MAX_ATTRIBUTES_BYTES,
  MAX_ATTRIBUTES_DEPTH,
  MAX_AUTHORIZED_KEYS,
  MAX_BOOT_SECONDS,
  MAX_SERVERS,
  name,
  nonEmptyList,
  seconds,
} from '../../fields/fields.ts';

/**
 * The `local` driver's provider section (backing nodes are local child processes: `metastatic dev`),
 * registered in shared/providers/drivers.ts.
 */

export const localLabelSchema = z.strictObject(
  {
    name: name().describe('A backing label; unique within the pool.'),
    'boot-delay': seconds(MAX_BOOT_SECONDS)
      .default(0)
      .describe('Seconds before the process accepts connections; at most a day.'),
    attributes: attributes()
      .default({})
      .describe(
        `Attributes the backing node reports. At most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, nested at most ${MAX_ATTRIBUTES_DEPTH} levels, numbers DynamoDB can store.`,
      ),
    'hourly-cost': hourlyCost()
      .optional()
      .describe('What one backing node costs an hour: requests by shape go to the cheapest slot that fits.'),
    ...contractKeys,
  },
  { error: MAPPING },
);

export const localPoolSchema = z.strictObject(
  {
    name: name().describe('Unique within the provider.'),
    'max-servers': intBetween(1, MAX_SERVERS)
      .optional()
      .describe(`Backing nodes this pool may run at once; unset = unlimited; at most ${MAX_SERVERS}.`),
    'authorized-keys': authorizedKeys()
      .default([])
      .describe(
        `OpenSSH public key lines ("ssh-ed25519 AAAA... comment") whose holders may log in to this pool's backing nodes, besides the embedded pool's own client key; at most ${MAX_AUTHORIZED_KEYS}.`,
      ),
    isolation: z
      .enum(['auto', 'contain', 'none'], { error: 'one of auto, contain, none' })
      .default('auto')
      .describe(
        "Whether each slot's jobs run contained: their own /home/slot<N>, /tmp and processes, and as root a uid of their own and the slot label's cores and memory as cgroup limits. auto: as root where metastatic dev runs as root on Linux, else without root (user and mount namespaces: the same uid, no limits; said once), else not; contain: as root always (a backing node that cannot fails); none: as the user who runs metastatic dev, sharing everything.",
      ),
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
