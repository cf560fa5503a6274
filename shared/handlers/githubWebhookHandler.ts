import type { Log } from '../core/log.ts';
import type { PoolMessage } from '../core/messages.ts';
import type { GithubSettings } from '../core/model.ts';
import {
  type DeliveryVerdict,
  type JobEvent,
  jobRequestId,
  MAX_WEBHOOK_BYTES,
  readDelivery,
  signedByOneOf,
} from '../github/webhook.ts';
import type { GithubItems } from '../store/githubItems.ts';

/**
 * GitHub's `workflow_job` webhook on AWS (docs/github.md, "On AWS"): a Lambda function URL request
 * (payload format 2.0) checked as `metastatic dev`'s listener checks it (shared/github/webhook.ts), then
 * turned into messages on the pool's request queue. Nothing else is on its path: no GitHub, EC2 or SSM
 * call; two small conditional writes to the table (the delivery id, so a replay is dropped; the job, so
 * the runner's start knows where it runs and a late `queued` after `completed` makes no request).
 *
 *   queued       a request `github-job-<id>` for the route's label, its lease `idle-timeout` (the runner
 *                must take the job within it)
 *   in_progress  a renewal of that request by the route's lease (the job's longest run)
 *   completed    a cancel of the request (a request not placed yet, or not received yet, ends), and a
 *                release of its node when a runner was started for it
 */

/** What Lambda passes for a function URL request (payload format 2.0), as far as it is read. */
export interface FunctionUrlRequest {
  readonly headers?: Readonly<Record<string, string | undefined>>;
  readonly body?: string;
  readonly isBase64Encoded?: boolean;
  readonly requestContext: { readonly http: { readonly method: string; readonly path?: string } };
}

export interface FunctionUrlResponse {
  readonly statusCode: number;
  readonly headers: Record<string, string>;
  readonly body: string;
}

export interface GithubWebhookDeps {
  readonly settings: GithubSettings;
  /** The webhook secrets (one, or two while rotating), cached by the caller. */
  readonly secrets: () => Promise<readonly string[]>;
  readonly items: GithubItems;
  /** Sends messages to the request queue; throws when any was not sent. */
  readonly send: (messages: readonly PoolMessage[]) => Promise<void>;
  readonly log: Log;
}

export function makeGithubWebhookHandler(
  deps: GithubWebhookDeps,
): (event: FunctionUrlRequest) => Promise<FunctionUrlResponse> {
  const unrouted = new Set<string>();
  return async (event) => {
    const method = event.requestContext.http.method;
    if (method !== 'POST') return reply(405, 'POST a GitHub webhook delivery');
    const body =
      event.body === undefined
        ? Buffer.alloc(0)
        : Buffer.from(event.body, event.isBase64Encoded ? 'base64' : 'utf8');
    if (body.length > MAX_WEBHOOK_BYTES)
      return reply(413, `a delivery is at most ${MAX_WEBHOOK_BYTES} bytes`);
    const header = (name: string) => event.headers?.[name];
    const delivery = header('x-github-delivery');
    if (!(await signedByOneOf(await deps.secrets(), body, header('x-hub-signature-256')))) {
      deps.log.warn('github webhook: refused a delivery without a valid signature', { delivery });
      return reply(401, 'no valid X-Hub-Signature-256');
    }
    const verdict = readDelivery(header('x-github-event'), body, deps.settings.routes);
    if (verdict.status >= 400) {
      deps.log.warn(`github webhook: refused delivery ${delivery}: ${verdict.reason}`);
      return reply(verdict.status, verdict.reason);
    }
    if (verdict.reason.startsWith('ignored: no route') && !unrouted.has(verdict.reason)) {
      unrouted.add(verdict.reason);
      deps.log.info(`github webhook: ${verdict.reason} (said once per container)`);
    }
    if (!verdict.event) return reply(verdict.status, verdict.reason);
    if (delivery && !(await deps.items.firstDelivery(delivery))) {
      return reply(200, `delivery ${delivery} seen already`);
    }
    try {
      return reply(verdict.status, await act(deps, verdict.event, verdict));
    } catch (err) {
      // Not acted on: forgotten, so that GitHub's redelivery (by hand, or the reconcile's) is acted on.
      if (delivery) await deps.items.forgetDelivery(delivery).catch(() => undefined);
      deps.log.error('github webhook: could not act on a delivery', { delivery, error: err as Error });
      return reply(500, 'could not act on the delivery; GitHub may deliver it again');
    }
  };
}

/** What acting on a job needs: the settings, the table's github items, the request queue. */
export type JobActions = Pick<GithubWebhookDeps, 'settings' | 'items' | 'send'>;

/**
 * A queued job: recorded (a job seen completed first gets none), and its request sent (lease
 * `idle-timeout`). Returns why it got none, or undefined when it was requested.
 */
export async function requestJob(
  deps: JobActions,
  event: Extract<JobEvent, { kind: 'queued' }>,
): Promise<string | undefined> {
  const { route } = event;
  const outcome = await deps.items.jobQueued({
    jobId: event.jobId,
    repository: event.repository,
    ...(event.installationId === undefined ? {} : { installationId: event.installationId }),
    runsOn: [...route.runsOn],
    label: route.label,
    lease: route.lease,
  });
  if (outcome === 'completed')
    return `job ${event.jobId}: queued after it completed (out of order); no runner`;
  await deps.send([
    {
      kind: 'request',
      id: jobRequestId(event.jobId),
      labels: [route.label],
      requestor: `github:${event.repository}`,
      lease: Math.min(deps.settings.idleTimeout, route.lease),
    },
  ]);
  return undefined;
}

async function act(deps: GithubWebhookDeps, event: JobEvent, verdict: DeliveryVerdict): Promise<string> {
  const id = jobRequestId(event.jobId);
  if (event.kind === 'queued') {
    return (await requestJob(deps, event)) ?? verdict.reason;
  }
  if (event.kind === 'in_progress') {
    const job = await deps.items.job(event.jobId);
    if (job?.state !== 'queued') return `job ${event.jobId} in progress: not one of the pool's`;
    await deps.send([{ kind: 'renew', id, lease: job.lease }]);
    return `job ${event.jobId} in progress: its node's lease is now ${job.lease}s`;
  }
  const job = await deps.items.jobCompleted(event.jobId);
  const messages: PoolMessage[] = [
    { kind: 'cancel', id, reason: `GitHub says job ${event.jobId} completed` },
  ];
  // Its runner was started: the node is released now (the job is over, whoever ran it), not only when
  // the runner's command ends (that end releases it too, whichever comes first).
  if (job?.runner?.commandId) messages.push({ kind: 'release', id });
  await deps.send(messages);
  return verdict.reason;
}

function reply(statusCode: number, message: string): FunctionUrlResponse {
  return { statusCode, headers: { 'content-type': 'text/plain; charset=utf-8' }, body: `${message}\n` };
}
