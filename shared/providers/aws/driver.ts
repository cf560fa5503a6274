import type { BackingDriver, Machine } from '../driver.ts';
import { checkAwsRules, checkAwsUserData, checkConsoleHostKeys } from './configRules.ts';
import { awsProviderSchema } from './configSchema.ts';
import { type InstanceTypeFacts, instanceTypeFacts } from './instanceTypes.ts';
import { checkFunctionsNetwork } from './networkRules.ts';

/** Whether `id` is an EC2 instance id (`i-` and 8 or 17 hex digits). */
export function isEc2InstanceId(id: string): boolean {
  return /^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$/.test(id);
}

/**
 * What a backing node of an aws label gives and costs. A label with several instance-types takes the
 * smallest of each size and the highest price among them, since any of them may be launched.
 */
function machineOf(options: Readonly<Record<string, unknown>>): Machine {
  const types = [
    options['instance-type'],
    ...(Array.isArray(options['instance-types']) ? options['instance-types'] : []),
  ].filter((t): t is string => typeof t === 'string');
  const facts = types.map(instanceTypeFacts);
  if (facts.length === 0 || !facts.every((f) => f !== undefined)) return {};
  const all = facts as InstanceTypeFacts[];
  return {
    vcpus: Math.min(...all.map((f) => f.vcpus)),
    memoryMiB: Math.min(...all.map((f) => f.memoryMiB)),
    hourlyCost: Math.max(...all.map((f) => f.hourlyCost)),
  };
}

/** `aws`: backing nodes are EC2 instances (ec2Provider.ts). */
export const awsDriver = {
  schema: awsProviderSchema,
  rules: (provider, path, slotsOf) => [
    ...checkAwsRules(provider, path),
    ...checkAwsUserData(provider, path, slotsOf),
  ],
  deploymentRules: (data, network) => {
    const keys = checkConsoleHostKeys(data, network);
    return {
      errors: [...(network ? checkFunctionsNetwork(data, network) : []), ...keys.errors],
      warnings: keys.warnings,
    };
  },
  machine: machineOf,
  ownsResource: isEc2InstanceId,
  embeddedOnly: false,
} satisfies BackingDriver;
