import { type EC2Client, TerminateInstancesCommand } from '@aws-sdk/client-ec2';
import { RetryableError } from '../../core/errors.ts';
import { type CallPolicy, ec2Call, type RetryBudget } from './ec2Calls.ts';
import { classifyEc2Error, describeEc2Error, ec2ErrorMessage } from './ec2Errors.ts';

/** TerminateInstances takes at most this many ids. */
export const TERMINATE_BATCH_SIZE = 1000;

/**
 * Terminates the instances (ids of instances, see isEc2InstanceId), in TerminateInstances calls of at
 * most TERMINATE_BATCH_SIZE ids. Idempotent: an instance that is gone counts as terminated. EC2 fails
 * the whole call when one id is unknown, so the ids its message names are left out and the call is made
 * again with the rest (one at a time when the message names none of them).
 */
export async function terminateInstances(
  client: EC2Client,
  policy: CallPolicy,
  ids: readonly string[],
  budget: RetryBudget,
): Promise<void> {
  for (let start = 0; start < ids.length; start += TERMINATE_BATCH_SIZE) {
    await terminateBatch(client, policy, ids.slice(start, start + TERMINATE_BATCH_SIZE), budget);
  }
}

async function terminateBatch(
  client: EC2Client,
  policy: CallPolicy,
  ids: readonly string[],
  budget: RetryBudget,
): Promise<void> {
  let remaining = [...ids];
  while (remaining.length > 0) {
    try {
      await ec2Call(policy, 'TerminateInstances', budget, () =>
        client.send(new TerminateInstancesCommand({ InstanceIds: remaining })),
      );
      policy.log.info('ec2 instances terminating', { instanceIds: remaining });
      return;
    } catch (err) {
      if (err instanceof RetryableError) throw err;
      if (classifyEc2Error(err) !== 'not-found') {
        throw new Error(`TerminateInstances failed: ${describeEc2Error(err)}`, { cause: err });
      }
      // The whole call fails when one id is gone; its message names the missing ones.
      if (remaining.length === 1) return;
      const missing = new Set(ec2ErrorMessage(err).match(/i-[0-9a-f]+/g) ?? []);
      const rest = remaining.filter((id) => !missing.has(id));
      if (rest.length === remaining.length) {
        for (const id of remaining) await terminateBatch(client, policy, [id], budget);
        return;
      }
      remaining = rest;
    }
  }
}
