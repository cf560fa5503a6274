import { randomUUID } from 'node:crypto';
import type { SQSRecord } from 'aws-lambda';
import { z } from 'zod';
import { NotReadyYetError } from '../core/errors.ts';
import type { GithubSettings } from '../core/model.ts';
import { POOL_EVENT_SOURCE, PoolEventType } from '../core/observability.ts';
import { type GithubApi, nodeRunner, runnerLabels } from '../github/githubApi.ts';
import { runnerScript } from '../providers/aws/runnerScript.ts';
import type { RunnerChannel } from '../providers/aws/ssmRunners.ts';
import type { GithubItems, GithubJob } from '../store/githubItems.ts';
import type { Context } from '../usecases/context.ts';
import { releaseWhole } from '../usecases/release/leases.ts';
import { makeBatchHandler, type SqsBatchHandler } from './batchHandler.ts';

/**
 * The github queue on AWS (docs/github.md, "On AWS"): EventBridge events, told apart by detail-type.
 *
 * - `Request Fulfilled` of a `github-job-<id>` request (the pool's bus): its node is ready. The start is
 *   claimed for the event (two copies of it start one runner), a JIT configuration is asked of GitHub for
 *   a runner named after the node, put in a SecureString parameter, and the runner started on the
 *   node's instance through SSM Run Command (shared/providers/aws/runnerScript.ts). A job GitHub said completed
 *   meanwhile gets no runner; its node is released.
 * - `EC2 Command Invocation Status-change Notification` (SSM, the default bus): a command ended. When it
 *   ran one of the pool's runners (the table maps its id to the job), the runner exited, whichever way:
 *   the job's node is released (the host's signal, not GitHub's `busy` flag) and the parameter deleted
 *   if the instance never read it.
 *
 * - `Node Released` of a `github-job-<id>` request (the pool's bus): a runner still running on the node
 *   is stopped.
 *
 * Anything else is logged and consumed. A GitHub answer that is no (4xx) ends the job's request (GitHub
 * keeps the job queued); a failure to reach GitHub, SSM or the table fails the record, which comes back.
 */

/**
 * A claim on a runner's start not finished within this is taken over by the next copy of its event: longer
 * than the github function's timeout (lib/, 120 s), so no live handling is overtaken.
 */
export const RUNNER_CLAIM_TAKEOVER_MS = 180_000;

export const SSM_STATUS_DETAIL_TYPE = 'EC2 Command Invocation Status-change Notification';

const FulfilledEvent = z.object({
  id: z.string(),
  source: z.literal(POOL_EVENT_SOURCE),
  'detail-type': z.literal(PoolEventType.requestFulfilled),
  detail: z.object({
    requestId: z.string().regex(/^github-job-\d{1,16}$/),
    nodes: z
      .array(
        z.object({ id: z.string(), backingNodeId: z.string().optional(), username: z.string().optional() }),
      )
      .min(1),
  }),
});

const ReleasedEvent = z.object({
  source: z.literal(POOL_EVENT_SOURCE),
  'detail-type': z.literal(PoolEventType.nodeReleased),
  detail: z.object({ requestId: z.string().regex(/^github-job-\d{1,16}$/), nodeId: z.string() }),
});

const CommandEvent = z.object({
  source: z.literal('aws.ssm'),
  'detail-type': z.literal(SSM_STATUS_DETAIL_TYPE),
  detail: z.object({ 'command-id': z.string(), 'instance-id': z.string().optional(), status: z.string() }),
});

/** SSM's final statuses of a command invocation: anything else (Pending, InProgress, Delayed) is not an end. */
const FINAL_STATUSES = new Set([
  'Success',
  'Failed',
  'Cancelled',
  'TimedOut',
  'Delivery Timed Out',
  'Execution Timed Out',
  'Undeliverable',
  'Terminated',
]);

export interface GithubRunnerDeps {
  readonly settings: GithubSettings;
  readonly api: () => Promise<GithubApi>;
  readonly items: GithubItems;
  readonly channel: RunnerChannel;
  readonly region: string;
  /** Where JIT configurations wait for their instance: `<path>/<request id>`. */
  readonly parameterPath: string;
}

export function makeGithubRunnerHandler(context: Context, deps: GithubRunnerDeps): SqsBatchHandler {
  const recordHandler = async (record: SQSRecord, ctx: Context): Promise<void> => {
    let json: unknown;
    try {
      json = JSON.parse(record.body);
    } catch {
      ctx.log.warn('github queue: not JSON; consumed', { messageId: record.messageId });
      return;
    }
    const fulfilled = FulfilledEvent.safeParse(json);
    if (fulfilled.success) return startRunner(ctx, deps, fulfilled.data);
    const command = CommandEvent.safeParse(json);
    if (command.success) return commandEnded(ctx, deps, command.data.detail);
    const released = ReleasedEvent.safeParse(json);
    if (released.success) return nodeReleased(ctx, deps, released.data.detail.requestId);
    ctx.log.warn('github queue: neither a github request fulfilled nor an SSM command status; consumed', {
      messageId: record.messageId,
    });
  };
  return makeBatchHandler(context, recordHandler, { inOrder: false });
}

async function startRunner(
  ctx: Context,
  deps: GithubRunnerDeps,
  event: z.infer<typeof FulfilledEvent>,
): Promise<void> {
  const { requestId } = event.detail;
  const jobId = Number(requestId.slice('github-job-'.length));
  const release = (reason: string) => releaseWhole(ctx, requestId, { force: false, reason });
  const job = await deps.items.job(jobId);
  if (!job) {
    ctx.log.warn(`github job ${jobId}: fulfilled, but no webhook recorded the job; its node is released`);
    await release('no GitHub job of this id was recorded');
    return;
  }
  const by = randomUUID();
  const claim = await deps.items.claimRunner(jobId, by, RUNNER_CLAIM_TAKEOVER_MS);
  if (claim === 'completed') {
    ctx.log.info(`github job ${jobId}: completed before its runner started; its node is released`);
    await release(`GitHub says job ${jobId} completed before its runner started`);
    return;
  }
  if (claim === 'busy') {
    // Another copy of the event is starting it: this one comes back, and finds it started (or, should
    // that handling have died, takes its claim over).
    throw new NotReadyYetError(`github job ${jobId}: its runner is being started by another handling`, 60);
  }
  if (claim !== 'claimed') return; // started already, or unknown (released above when unknown)
  try {
    await startClaimed(ctx, deps, event, job, by);
  } catch (err) {
    // Not started: the claim is given back, so that the retry (this record, back) takes it at once.
    await deps.items.dropClaim(jobId, by).catch(() => undefined);
    throw err;
  }
}

/** The runner's start, once claimed for `by`: its JIT configuration, its parameter, its SSM command. */
async function startClaimed(
  ctx: Context,
  deps: GithubRunnerDeps,
  event: z.infer<typeof FulfilledEvent>,
  job: GithubJob,
  by: string,
): Promise<void> {
  const { requestId } = event.detail;
  const jobId = job.jobId;
  const release = (reason: string) => releaseWhole(ctx, requestId, { force: false, reason });
  const node = event.detail.nodes[0] as z.infer<typeof FulfilledEvent>['detail']['nodes'][number];
  // A late copy of the event may come after the node was released (its lease lapsed, the job ended
  // elsewhere): a runner is started only on a node still ready, never on a slot given back.
  const request = await ctx.store.getRequest(requestId);
  if (request?.nodes.find((n) => n.id === node.id)?.state !== 'ready') {
    ctx.log.info(`github job ${jobId}: node ${node.id} is no longer ready; no runner`);
    return;
  }
  const backing = node.backingNodeId ? await ctx.store.getBacking(node.backingNodeId) : undefined;
  const instanceId = backing?.resourceId;
  if (!instanceId || !node.username) {
    throw new Error(`github job ${jobId}: node ${node.id} has no instance or user recorded yet`);
  }
  let runner: Awaited<ReturnType<typeof nodeRunner>>;
  try {
    runner = await nodeRunner(await deps.api(), {
      ...(job.installationId === undefined ? {} : { installationId: job.installationId }),
      repository: job.repository,
      nodeId: node.id,
      labels: runnerLabels(job.runsOn, job.label),
    });
  } catch (err) {
    const status = (err as { status?: number }).status;
    if (status === undefined || status >= 500 || status === 429) throw err;
    ctx.log.warn(`github job ${jobId}: GitHub refused a runner (${status}); its node is released`, {
      error: (err as Error).message,
    });
    await release(`GitHub refused a runner: ${status} ${(err as Error).message}`.slice(0, 256));
    return;
  }
  const parameterName = `${deps.parameterPath}/${requestId}`;
  const commandId = await deps.channel.start({
    instanceId,
    parameterName,
    secret: runner.jit.encodedJitConfig,
    script: runnerScript({
      region: deps.region,
      parameterName,
      user: node.username,
      runnerCommand: deps.settings.runnerCommand,
    }),
    timeoutSeconds: job.lease,
    comment: `metastatic runner ${runner.name} for GitHub job ${jobId}`,
  });
  await deps.items.runnerStarted(jobId, requestId, {
    by,
    name: runner.name,
    instanceId,
    commandId,
  });
  ctx.log.info(
    `github job ${jobId}: runner ${runner.name} started on ${instanceId} (SSM command ${commandId})`,
  );
}

async function commandEnded(
  ctx: Context,
  deps: GithubRunnerDeps,
  detail: z.infer<typeof CommandEvent>['detail'],
): Promise<void> {
  if (!FINAL_STATUSES.has(detail.status)) return;
  const owner = await deps.items.commandOwner(detail['command-id']);
  if (!owner) return; // a command that is not one of the pool's runners
  await deps.items.runnerEnded(owner.jobId);
  await deps.channel.forget(`${deps.parameterPath}/${owner.requestId}`);
  const out = await releaseWhole(ctx, owner.requestId, {
    force: false,
    reason: `its runner ended (SSM: ${detail.status})`,
  });
  ctx.log.info(
    `github job ${owner.jobId}: runner ended (${detail.status}); released ${out.released.length} node(s)`,
  );
}

/**
 * A job's node was released (its lease lapsed: the runner took no job within idle-timeout, or ran past
 * the route's lease; GitHub said the job completed elsewhere; an operator): a runner still running on it
 * is stopped (SSM CancelCommand) and its parameter deleted, so the slot is free for the next node.
 */
async function nodeReleased(ctx: Context, deps: GithubRunnerDeps, requestId: string): Promise<void> {
  const jobId = Number(requestId.slice('github-job-'.length));
  const runner = (await deps.items.job(jobId))?.runner;
  if (!runner?.commandId || !runner.instanceId || runner.endedAt !== undefined) return;
  await deps.channel.stop(runner.commandId, runner.instanceId);
  await deps.channel.forget(`${deps.parameterPath}/${requestId}`);
  ctx.log.info(`github job ${jobId}: its node was released; runner ${runner.name} stopped`);
}
