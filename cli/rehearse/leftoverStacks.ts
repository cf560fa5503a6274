import {
  type CloudFormationClient,
  DeleteStackCommand,
  DescribeStacksCommand,
  waitUntilStackDeleteComplete,
} from '@aws-sdk/client-cloudformation';

/**
 * Stacks an earlier attempt left behind: CloudFormation cannot deploy a stack from the states a failed
 * attempt leaves, so the rehearsal deletes such a stack before deploying (deployApp.ts).
 */

/** Stack states a failed earlier attempt leaves, from which CloudFormation cannot deploy: deleted first. */
export const LEFTOVER_STATES = new Set([
  'REVIEW_IN_PROGRESS',
  'ROLLBACK_COMPLETE',
  'ROLLBACK_FAILED',
  'CREATE_FAILED',
  'DELETE_FAILED',
]);

/** The stack's status, or undefined when it does not exist. */
export async function stackStatus(cfn: CloudFormationClient, stackName: string): Promise<string | undefined> {
  try {
    const out = await cfn.send(new DescribeStacksCommand({ StackName: stackName }));
    return out.Stacks?.[0]?.StackStatus;
  } catch (err) {
    if (/does not exist/.test((err as Error).message)) return undefined;
    throw err;
  }
}

/** Deletes a stack a failed attempt left in a state CloudFormation cannot deploy from; true if it did. */
export async function deleteLeftover(cfn: CloudFormationClient, stackName: string): Promise<boolean> {
  const status = await stackStatus(cfn, stackName);
  if (status === undefined || !LEFTOVER_STATES.has(status)) return false;
  await cfn.send(new DeleteStackCommand({ StackName: stackName }));
  await waitUntilStackDeleteComplete(
    { client: cfn, maxWaitTime: 120, minDelay: 1, maxDelay: 2 },
    { StackName: stackName },
  );
  return true;
}
