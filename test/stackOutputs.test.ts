import { CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { mockClient } from 'aws-sdk-client-mock';
import { afterEach, describe, expect, it } from 'vitest';
import { readStack } from '../cli/stack.ts';

const cfn = mockClient(CloudFormationClient);
afterEach(() => cfn.reset());

const outputs = (keys: string[]) => keys.map((k) => ({ OutputKey: k, OutputValue: `value-of-${k}` }));

describe('metastatic --stack: reading a deployed pool', () => {
  it('maps the stack outputs to what the CLI needs', async () => {
    cfn.on(DescribeStacksCommand, { StackName: 'ci-pool' }).resolves({
      Stacks: [
        {
          StackName: 'ci-pool',
          CreationTime: new Date(),
          StackStatus: 'CREATE_COMPLETE',
          Outputs: outputs(['RequestQueueUrl', 'FulfilQueueUrl', 'TableName', 'EventBusName', 'PoolId']),
        },
      ],
    });
    const info = await readStack(new CloudFormationClient({ region: 'eu-west-1' }), 'ci-pool', 'eu-west-1');
    expect(info).toEqual({
      stackName: 'ci-pool',
      region: 'eu-west-1',
      requestQueueUrl: 'value-of-RequestQueueUrl',
      fulfilQueueUrl: 'value-of-FulfilQueueUrl',
      tableName: 'value-of-TableName',
      eventBusName: 'value-of-EventBusName',
      poolId: 'value-of-PoolId',
    });
  });

  it('names the outputs missing from a stack that is not a pool', async () => {
    cfn.on(DescribeStacksCommand).resolves({
      Stacks: [
        {
          StackName: 'other',
          CreationTime: new Date(),
          StackStatus: 'CREATE_COMPLETE',
          Outputs: outputs(['TableName']),
        },
      ],
    });
    await expect(
      readStack(new CloudFormationClient({ region: 'eu-west-1' }), 'other', 'eu-west-1'),
    ).rejects.toThrow(
      'stack other is not a metastatic pool: missing output(s) RequestQueueUrl, FulfilQueueUrl, EventBusName, PoolId',
    );
  });

  it('reports an unknown stack with its region', async () => {
    cfn.on(DescribeStacksCommand).rejects(new Error('Stack with id nope does not exist'));
    await expect(
      readStack(new CloudFormationClient({ region: 'eu-west-1' }), 'nope', 'eu-west-1'),
    ).rejects.toThrow('cannot read stack nope in eu-west-1: Stack with id nope does not exist');
  });
});
