import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { CreateSecretCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { CreateQueueCommand, ReceiveMessageCommand, SQSClient } from '@aws-sdk/client-sqs';
import { sign } from '@octokit/webhooks-methods';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { motoClientConfig, motoClientEnv } from '../../cli/rehearse/motoEnv.ts';
import { ensureTable } from '../../shared/runtime/engines.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { jobPayload } from '../../testkit/githubPool.ts';
import { describeWithMoto, type Moto, startMoto } from '../../testkit/moto.ts';

/**
 * The github function's entry point (functions/github) as Lambda runs it: configured only through its
 * environment, its secrets in Secrets Manager, its table and request queue, all on moto_server. A function
 * URL request signed with the secret becomes a request message; the schedule with the stack's placeholder
 * still in the App-key secret fails saying what to do; an event of no known shape is refused.
 * (Runs in a worker of its own: vitest.config.ts ISOLATED; the environment is the process's.)
 */

const REGION = 'us-east-1';
const SECRET = 'entry secret';

describeWithMoto('the github function entry point', () => {
  let moto: Moto;
  let queueUrl: string;
  let sqs: SQSClient;

  beforeAll(async () => {
    moto = await startMoto();
    const client = motoClientConfig(moto.endpoint, REGION);
    await ensureTable(new DynamoDBClient(client), 'github-entry');
    sqs = new SQSClient(client);
    queueUrl = (await sqs.send(new CreateQueueCommand({ QueueName: 'requests' }))).QueueUrl as string;
    const secrets = new SecretsManagerClient(client);
    const webhookArn = (
      await secrets.send(new CreateSecretCommand({ Name: 'webhook', SecretString: SECRET }))
    ).ARN as string;
    // What the stack creates: a random placeholder, until the user puts the App's key.
    const keyArn = (
      await secrets.send(new CreateSecretCommand({ Name: 'app-key', SecretString: 'Xq3placeholder9' }))
    ).ARN as string;
    const config = `${baseConfig({ slots: 2 })}
github:
  app-id: 1
  installation-id: 77
  queued-scan-interval: 0
  routes:
    - runs-on: [self-hosted, linux, small]
      label: small-node
`;
    Object.assign(process.env, {
      ...motoClientEnv(moto.endpoint, REGION),
      TABLE_NAME: 'github-entry',
      DYNAMODB_ENDPOINT: moto.endpoint,
      METASTATIC_CONFIG: config,
      POOL_ID: 'entry',
      POWERTOOLS_LOG_LEVEL: 'SILENT',
      POWERTOOLS_METRICS_DISABLED: 'true',
      REQUEST_QUEUE_URL: queueUrl,
      GITHUB_WEBHOOK_SECRET_ARN: webhookArn,
      GITHUB_APP_KEY_SECRET_ARN: keyArn,
      GITHUB_JIT_PARAMETER_PATH: '/metastatic/entry/github/jit',
    });
  }, 60_000);

  afterAll(async () => {
    await moto?.stop();
  });

  it('turns a signed webhook into a request message on the request queue', async () => {
    const { handler } = await import('../../functions/github/index.ts');
    const body = jobPayload('queued', 4242);
    const answer = (await handler({
      version: '2.0',
      rawPath: '/',
      headers: {
        'x-github-event': 'workflow_job',
        'x-github-delivery': 'entry-1',
        'x-hub-signature-256': await sign(SECRET, body),
      },
      body,
      isBase64Encoded: false,
      requestContext: { http: { method: 'POST', path: '/' } },
    })) as { statusCode: number; body: string };
    expect(answer.statusCode).toBe(202);
    const got = await sqs.send(new ReceiveMessageCommand({ QueueUrl: queueUrl, MaxNumberOfMessages: 10 }));
    expect(got.Messages?.map((m) => JSON.parse(m.Body ?? '{}'))).toEqual([
      {
        kind: 'request',
        id: 'github-job-4242',
        labels: ['small-node'],
        requestor: 'github:Codertocat/Hello-World',
        lease: 600,
      },
    ]);
  });

  it("fails its schedule, saying what to do, while the App-key secret holds the stack's placeholder", async () => {
    const { handler } = await import('../../functions/github/index.ts');
    await expect(handler({ 'detail-type': 'Scheduled Event', source: 'aws.events' })).rejects.toThrow(
      /holds no PEM private key: put the GitHub App's key in it/,
    );
  });

  it('refuses an event of no known shape', async () => {
    const { handler } = await import('../../functions/github/index.ts');
    await expect(handler({ hello: 'world' })).rejects.toThrow(
      /takes a function URL request, an SQS batch or its schedule/,
    );
  });
});
