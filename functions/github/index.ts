import type { Context as LambdaContext } from 'aws-lambda';
import { type GithubRuntime, githubRuntimeFromEnv } from '../../shared/runtime/githubRuntime.ts';

/**
 * The github function (docs/github.md, "On AWS"): three kinds of event, told apart by their shape.
 *
 * - a function URL request (payload 2.0): a GitHub `workflow_job` webhook, checked and turned into
 *   messages on the request queue (shared/handlers/githubWebhookHandler.ts);
 * - an SQS batch from the github queue: a `Request Fulfilled` pool event of a `github-job-` request (a
 *   runner is started on its node) or an SSM `EC2 Command Invocation Status-change Notification` (a
 *   runner ended: its node is released) (shared/handlers/githubRunnerHandler.ts);
 * - the schedule's `Scheduled Event`: lost webhooks are redelivered.
 */
let runtime: GithubRuntime | undefined;

export const handler = async (event: unknown, context?: LambdaContext): Promise<unknown> => {
  runtime ??= githubRuntimeFromEnv();
  try {
    return await runtime.handle(event, context);
  } finally {
    runtime.metrics.publishStoredMetrics();
  }
};
