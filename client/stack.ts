import { type CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { STACK_OUTPUTS } from '../shared/runtime/stackOutputs.ts';
import { PoolNotFoundError } from './errors.ts';

/** What a client needs from a deployed pool: the stack outputs MetastaticPool publishes (lib/metastaticPool.ts). */
export interface StackInfo {
  readonly stackName: string;
  readonly region: string;
  readonly requestQueueUrl: string;
  /** Where lease renewals go; absent from a stack deployed before it had a lease queue (then: the request queue). */
  readonly leaseQueueUrl?: string;
  readonly fulfilQueueUrl: string;
  readonly tableName: string;
  readonly eventBusName: string;
  readonly poolId: string;
}

/** The outputs every pool has published; the lease queue's came later (a stack without it still works). */
const required = Object.values(STACK_OUTPUTS).filter((k) => k !== STACK_OUTPUTS.leaseQueueUrl);

/** Reads a deployed pool's outputs; names what is missing when the stack is not a metastatic pool. */
export async function readStack(
  cfn: CloudFormationClient,
  stackName: string,
  region: string,
): Promise<StackInfo> {
  let outputs: Record<string, string>;
  try {
    const out = await cfn.send(new DescribeStacksCommand({ StackName: stackName }));
    const stack = out.Stacks?.[0];
    if (!stack) throw new PoolNotFoundError(`stack ${stackName} not found in ${region}`);
    outputs = Object.fromEntries(
      (stack.Outputs ?? [])
        .filter((o) => o.OutputKey && o.OutputValue)
        .map((o) => [o.OutputKey, o.OutputValue]),
    ) as Record<string, string>;
  } catch (err) {
    if (err instanceof PoolNotFoundError) throw err;
    throw new PoolNotFoundError(`cannot read stack ${stackName} in ${region}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const missing = required.filter((k) => !outputs[k]);
  if (missing.length > 0) {
    throw new PoolNotFoundError(
      `stack ${stackName} is not a metastatic pool: missing output(s) ${missing.join(', ')} ` +
        '(a MetastaticPool publishes them in its stack unless built with stackOutputs: false)',
    );
  }
  return {
    stackName,
    region,
    requestQueueUrl: outputs[STACK_OUTPUTS.requestQueueUrl] as string,
    ...(outputs[STACK_OUTPUTS.leaseQueueUrl] ? { leaseQueueUrl: outputs[STACK_OUTPUTS.leaseQueueUrl] } : {}),
    fulfilQueueUrl: outputs[STACK_OUTPUTS.fulfilQueueUrl] as string,
    tableName: outputs[STACK_OUTPUTS.tableName] as string,
    eventBusName: outputs[STACK_OUTPUTS.eventBusName] as string,
    poolId: outputs[STACK_OUTPUTS.poolId] as string,
  };
}
