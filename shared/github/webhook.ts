import { verify } from '@octokit/webhooks-methods';
import { z } from 'zod';
import type { GithubRoute } from '../core/model.ts';

/**
 * A GitHub webhook delivery, read as the pool needs it (docs/github.md): its signature checked against
 * each webhook secret (X-Hub-Signature-256, an HMAC-SHA256 of the raw body, compared in constant time by
 * @octokit/webhooks-methods), its `workflow_job` payload checked for the few fields used, and a queued
 * job routed to a metastatic label. Plain data in, a decision out: no call to GitHub or the pool.
 */

/** GitHub caps a payload at 25 MB; a workflow_job is a few KB. Anything larger is refused unread. */
export const MAX_WEBHOOK_BYTES = 1024 * 1024;

/** The fields of a `workflow_job` payload the pool reads (GitHub sends many more; they are ignored). */
export const WorkflowJobPayload = z.object({
  action: z.string().max(64),
  workflow_job: z.object({
    id: z.number().int().positive(),
    run_id: z.number().int().positive(),
    labels: z.array(z.string().max(256)).max(100),
    runner_name: z.string().max(256).nullable().optional(),
  }),
  repository: z.object({
    full_name: z.string().regex(/^[A-Za-z0-9_.-]{1,39}\/[A-Za-z0-9_.-]{1,100}$/, 'an owner/name'),
  }),
  installation: z.object({ id: z.number().int().positive() }).optional(),
});
export type WorkflowJobPayload = z.infer<typeof WorkflowJobPayload>;

/** What a delivery asks of the pool. */
export type JobEvent =
  | {
      readonly kind: 'queued';
      readonly jobId: number;
      readonly repository: string;
      readonly installationId?: number;
      readonly route: GithubRoute;
    }
  | { readonly kind: 'in_progress'; readonly jobId: number; readonly runnerName?: string }
  | { readonly kind: 'completed'; readonly jobId: number; readonly runnerName?: string };

/** The answer to a delivery: an HTTP status, why, and what it asks of the pool (none when refused or ignored). */
export interface DeliveryVerdict {
  readonly status: number;
  readonly reason: string;
  readonly event?: JobEvent;
}

/** The request id of a job: every delivery about the job names the same request, so none makes two. */
export function jobRequestId(jobId: number): string {
  return `github-job-${jobId}`;
}

/** The first route whose runs-on holds every label of the job (GitHub compares labels case-insensitively). */
export function routeOf(routes: readonly GithubRoute[], labels: readonly string[]): GithubRoute | undefined {
  const wanted = labels.map((l) => l.toLowerCase());
  if (wanted.length === 0) return undefined;
  return routes.find((r) => {
    const offered = new Set(r.runsOn.map((l) => l.toLowerCase()));
    return wanted.every((l) => offered.has(l));
  });
}

/** Whether `signature` (the X-Hub-Signature-256 header) signs `body` with one of `secrets`. */
export async function signedByOneOf(
  secrets: readonly string[],
  body: Buffer,
  signature: string | undefined,
): Promise<boolean> {
  if (!signature || !/^sha256=[0-9a-f]{64}$/.test(signature)) return false;
  const text = body.toString('utf8');
  // Not-UTF-8 bytes would be signed as what they decode to: such a body is no GitHub payload.
  if (!Buffer.from(text, 'utf8').equals(body)) return false;
  for (const secret of secrets) {
    if (await verify(secret, text, signature)) return true;
  }
  return false;
}

/**
 * The verdict on one delivery, its signature already checked: 202 for what the pool acts on or ignores
 * on purpose (an unrouted job, an action it does not need), 400 for a payload it cannot read (GitHub
 * shows the reason in the delivery's log; redelivering it will not help).
 */
export function readDelivery(
  eventName: string | undefined,
  body: Buffer,
  routes: readonly GithubRoute[],
): DeliveryVerdict {
  if (eventName === 'ping') return { status: 200, reason: 'pong' };
  if (eventName !== 'workflow_job')
    return { status: 202, reason: `ignored: a ${eventName ?? 'nameless'} event` };
  let raw: unknown;
  try {
    raw = JSON.parse(body.toString('utf8'));
  } catch {
    return { status: 400, reason: 'the body is not JSON' };
  }
  const parsed = WorkflowJobPayload.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    return {
      status: 400,
      reason: `not a workflow_job payload: ${issue?.path.join('.') || 'body'}: ${issue?.message}`,
    };
  }
  const p = parsed.data;
  const jobId = p.workflow_job.id;
  const runnerName = p.workflow_job.runner_name ?? undefined;
  if (p.action !== 'queued' && p.action !== 'in_progress' && p.action !== 'completed') {
    return { status: 202, reason: `ignored: action ${p.action}` };
  }
  // Every action of a job no route covers is someone else's (a completed one too: never recorded).
  const route = routeOf(routes, p.workflow_job.labels);
  if (!route) {
    return {
      status: 202,
      reason: `ignored: no route covers runs-on ${JSON.stringify(p.workflow_job.labels)}`,
    };
  }
  switch (p.action) {
    case 'queued': {
      const event: JobEvent = {
        kind: 'queued',
        jobId,
        repository: p.repository.full_name,
        ...(p.installation ? { installationId: p.installation.id } : {}),
        route,
      };
      return { status: 202, reason: `job ${jobId}: requesting a ${route.label} node`, event };
    }
    case 'in_progress':
      return {
        status: 202,
        reason: `job ${jobId} in progress`,
        event: { kind: 'in_progress', jobId, ...(runnerName ? { runnerName } : {}) },
      };
    case 'completed':
      return {
        status: 202,
        reason: `job ${jobId} completed`,
        event: { kind: 'completed', jobId, ...(runnerName ? { runnerName } : {}) },
      };
  }
}

/**
 * Ids seen lately (delivery ids, X-GitHub-Delivery: a replay is answered, not acted on; completed jobs),
 * the oldest forgotten first.
 */
export class RecentDeliveries {
  private readonly seen = new Set<string>();

  constructor(private readonly capacity = 10_000) {}

  /** Whether `id` was seen lately. */
  has(id: string): boolean {
    return this.seen.has(id);
  }

  /** True the first time an id is seen (then remembered), false for a repeat. */
  first(id: string): boolean {
    if (this.seen.has(id)) return false;
    this.seen.add(id);
    if (this.seen.size > this.capacity) {
      const oldest = this.seen.values().next().value;
      if (oldest !== undefined) this.seen.delete(oldest);
    }
    return true;
  }
}
