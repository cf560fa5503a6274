import { type CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { PoolNotFoundError } from './errors.ts';

/** What a client needs from a deployed pool: the stack outputs of lib/metastaticStack.ts. */
export interface StackInfo {
  readonly stackName: string;
  readonly region: string;
  readonly requestQueueUrl: string;
  readonly fulfilQueueUrl: string;
  readonly tableName: string;
  readonly eventBusName: string;
  readonly poolId: string;
}

const required = ['RequestQueueUrl', 'FulfilQueueUrl', 'TableName', 'EventBusName', 'PoolId'] as const;

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
      `stack ${stackName} is not a metastatic pool: missing output(s) ${missing.join(', ')}`,
    );
  }
  return {
    stackName,
    region,
    requestQueueUrl: outputs.RequestQueueUrl as string,
    fulfilQueueUrl: outputs.FulfilQueueUrl as string,
    tableName: outputs.TableName as string,
    eventBusName: outputs.EventBusName as string,
    poolId: outputs.PoolId as string,
  };
}
