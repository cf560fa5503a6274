import '../../testkit/loopbackOnly.mjs';
import { createHash } from 'node:crypto';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { CloudFormationClient, DescribeStacksCommand } from '@aws-sdk/client-cloudformation';
import { mockClient } from 'aws-sdk-client-mock';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { connect } from '../../cli/client.ts';
import { readStack } from '../../cli/stack.ts';

const cfn = mockClient(CloudFormationClient);
afterEach(() => cfn.reset());
afterAll(() => cfn.restore());

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

describe('metastatic --stack: talking to a deployed pool', () => {
  it('sends to the endpoint the environment names (AWS_ENDPOINT_URL), not to the queue URL host', async () => {
    // A stack's queue URL names the regional host (https://sqs.eu-west-1.amazonaws.com/...) while
    // AWS_ENDPOINT_URL names a VPC endpoint or an AWS-protocol server (moto): the message must go to
    // the endpoint. (Outside localhost nothing resolves here: see support/loopbackOnly.mjs.)
    const received: { headers: IncomingHttpHeaders; body: Record<string, unknown> }[] = [];
    const server = createServer((req, res) => {
      let text = '';
      req.on('data', (chunk: Buffer) => {
        text += chunk.toString();
      });
      req.on('end', () => {
        const body = JSON.parse(text) as Record<string, unknown>;
        received.push({ headers: req.headers, body });
        const md5 = createHash('md5')
          .update(String(body.MessageBody ?? ''))
          .digest('hex');
        res.setHeader('content-type', 'application/x-amz-json-1.0');
        res.end(JSON.stringify({ MessageId: 'm-1', MD5OfMessageBody: md5 }));
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const saved = { ...process.env };
    const restoreEnv = () => {
      for (const k of Object.keys(process.env)) if (!(k in saved)) delete process.env[k];
      Object.assign(process.env, saved);
    };
    Object.assign(process.env, {
      AWS_ENDPOINT_URL: `http://localhost:${(server.address() as AddressInfo).port}`,
      AWS_ACCESS_KEY_ID: 'testing',
      AWS_SECRET_ACCESS_KEY: 'testing',
    });
    const queueUrl = 'https://sqs.eu-west-1.amazonaws.com/123456789012/ci-pool-RequestQueue';
    cfn.on(DescribeStacksCommand).resolves({
      Stacks: [
        {
          StackName: 'ci-pool',
          CreationTime: new Date(),
          StackStatus: 'CREATE_COMPLETE',
          Outputs: [
            ...outputs(['FulfilQueueUrl', 'TableName', 'EventBusName', 'PoolId']),
            { OutputKey: 'RequestQueueUrl', OutputValue: queueUrl },
          ],
        },
      ],
    });
    try {
      const client = await connect({ stateDir: '/nonexistent', stack: 'ci-pool', region: 'eu-west-1' });
      try {
        await client.send({ kind: 'release', nodeId: 'r-1/0' });
      } finally {
        client.close();
      }
      expect(received).toHaveLength(1);
      expect(received[0]?.headers['x-amz-target']).toBe('AmazonSQS.SendMessage');
      expect(received[0]?.body).toEqual({
        QueueUrl: queueUrl,
        MessageBody: JSON.stringify({ kind: 'release', nodeId: 'r-1/0' }),
      });
    } finally {
      restoreEnv();
      await new Promise((done) => server.close(done));
    }
  });
});
