import type { Metrics } from '@aws-lambda-powertools/metrics';
import { SecretsProvider } from '@aws-lambda-powertools/parameters/secrets';
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { SendMessageBatchCommand } from '@aws-sdk/client-sqs';
import { SSMClient } from '@aws-sdk/client-ssm';
import type { Context as LambdaContext, SQSEvent } from 'aws-lambda';
import { z } from 'zod';
import type { PoolMessage } from '../core/messages.ts';
import { GithubApi } from '../github/githubApi.ts';
import { makeGithubRunnerHandler } from '../handlers/githubRunnerHandler.ts';
import { makeGithubScheduleHandler } from '../handlers/githubScheduleHandler.ts';
import { type FunctionUrlRequest, makeGithubWebhookHandler } from '../handlers/githubWebhookHandler.ts';
import { SsmRunnerChannel } from '../providers/aws/ssmRunners.ts';
import { GithubItems } from '../store/githubItems.ts';
import { lambdaRuntimeFromEnv } from './lambdaContext.ts';

/**
 * The github function's runtime (functions/github), made once per container: the pool's Lambda runtime
 * (lambdaContext.ts) plus the App's key and the webhook secrets from Secrets Manager (through Powertools'
 * SecretsProvider, cached SECRET_MAX_AGE_S, so a rotated secret is read within minutes), the github items
 * of the table, SSM, and the request queue.
 */

/** How long a secret read from Secrets Manager is used before it is read again, seconds. */
export const SECRET_MAX_AGE_S = 300;

export const GithubEnv = z.object({
  REQUEST_QUEUE_URL: z.string().min(1),
  GITHUB_WEBHOOK_SECRET_ARN: z.string().min(1),
  GITHUB_APP_KEY_SECRET_ARN: z.string().min(1),
  GITHUB_JIT_PARAMETER_PATH: z.string().regex(/^\/[A-Za-z0-9_.\-/]+[^/]$/),
  /**
   * The most containers of the function handling the github queue at once (its event source's maximum
   * concurrency): each spaces its GitHub writes by that many times WRITE_INTERVAL_MS, so together they
   * keep within GitHub's secondary limit.
   */
  GITHUB_MAX_CONCURRENCY: z.coerce.number().int().min(1).max(100).default(2),
});

export interface GithubRuntime {
  readonly metrics: Metrics;
  handle(event: unknown, context?: LambdaContext): Promise<unknown>;
}

export function githubRuntimeFromEnv(raw: NodeJS.ProcessEnv = process.env): GithubRuntime {
  const rt = lambdaRuntimeFromEnv(raw);
  const parsed = GithubEnv.safeParse(raw);
  if (!parsed.success) {
    throw new Error(
      `invalid github function environment: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`,
    );
  }
  const env = parsed.data;
  const settings = rt.context.config.github;
  if (!settings)
    throw new Error('the pool configuration has no github section: the github function has nothing to do');
  const region = rt.env.AWS_REGION;
  const secrets = new SecretsProvider({ awsSdkV3Client: new SecretsManagerClient({ region }) });
  const secret = async (arn: string) => {
    const value = await secrets.get(arn, { maxAge: SECRET_MAX_AGE_S });
    if (typeof value !== 'string' || value.trim() === '') throw new Error(`the secret ${arn} is empty`);
    return value;
  };
  let api: { key: string; api: GithubApi } | undefined;
  const githubApi = async () => {
    const key = await secret(env.GITHUB_APP_KEY_SECRET_ARN);
    // The stack creates the secret with a random placeholder: say what to do rather than fail signing.
    if (!/-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(key)) {
      throw new Error(
        `the secret ${env.GITHUB_APP_KEY_SECRET_ARN} holds no PEM private key: put the GitHub App's key in it ` +
          '(aws secretsmanager put-secret-value --secret-id <GithubAppKeySecretArn> --secret-string file://app.pem)',
      );
    }
    // A new key (rotated in Secrets Manager): a new client, its token cache with it.
    if (api?.key !== key) api = { key, api: new GithubApi(settings, key, env.GITHUB_MAX_CONCURRENCY) };
    return api.api;
  };
  const items = new GithubItems(
    new DynamoDBClient({
      region,
      ...(rt.env.DYNAMODB_ENDPOINT ? { endpoint: rt.env.DYNAMODB_ENDPOINT } : {}),
    }),
    rt.env.TABLE_NAME,
  );
  const send = (messages: readonly PoolMessage[]) => sendAll(rt.sqs(), env.REQUEST_QUEUE_URL, messages);
  const webhook = makeGithubWebhookHandler({
    settings,
    secrets: async () => webhookSecrets(await secret(env.GITHUB_WEBHOOK_SECRET_ARN)),
    items,
    send,
    log: rt.context.log,
  });
  const schedule = makeGithubScheduleHandler({ settings, items, send, api: githubApi, log: rt.context.log });
  const runners = makeGithubRunnerHandler(rt.context, {
    settings,
    api: githubApi,
    items,
    channel: new SsmRunnerChannel(new SSMClient({ region })),
    region,
    parameterPath: env.GITHUB_JIT_PARAMETER_PATH,
  });
  return {
    metrics: rt.metrics,
    handle: (event, context) => dispatch(event, context, { webhook, runners, schedule }),
  };
}

async function dispatch(
  event: unknown,
  context: LambdaContext | undefined,
  parts: {
    webhook: ReturnType<typeof makeGithubWebhookHandler>;
    runners: ReturnType<typeof makeGithubRunnerHandler>;
    schedule: ReturnType<typeof makeGithubScheduleHandler>;
  },
): Promise<unknown> {
  const e = event as Record<string, unknown>;
  if ((e.requestContext as { http?: unknown } | undefined)?.http)
    return parts.webhook(e as unknown as FunctionUrlRequest);
  if (Array.isArray(e.Records)) return parts.runners(e as unknown as SQSEvent, context);
  if (e['detail-type'] === 'Scheduled Event') return parts.schedule();
  throw new Error('the github function takes a function URL request, an SQS batch or its schedule');
}

/** The secret's value: one webhook secret, or two lines (old and new) while one is rotated. */
export function webhookSecrets(value: string): string[] {
  const lines = value
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '');
  return lines.slice(0, 2);
}

/** Sends every message (SendMessageBatch, 10 at most each); throws when any was not sent. */
export async function sendAll(
  sqs: ReturnType<ReturnType<typeof lambdaRuntimeFromEnv>['sqs']>,
  queueUrl: string,
  messages: readonly PoolMessage[],
): Promise<void> {
  for (let i = 0; i < messages.length; i += 10) {
    const batch = messages.slice(i, i + 10);
    const out = await sqs.send(
      new SendMessageBatchCommand({
        QueueUrl: queueUrl,
        Entries: batch.map((m, j) => ({ Id: String(j), MessageBody: JSON.stringify(m) })),
      }),
    );
    if (out.Failed && out.Failed.length > 0) {
      throw new Error(`the request queue refused ${out.Failed.length} message(s): ${out.Failed[0]?.Message}`);
    }
  }
}
