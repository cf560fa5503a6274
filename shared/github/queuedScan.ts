import type { GithubRoute } from '../core/model.ts';
import type { GithubApi } from './githubApi.ts';
import { type JobEvent, routeOf } from './webhook.ts';

/**
 * Queued jobs GitHub never sent a webhook for (docs/github.md, what ends a runner or finds a lost job): GitHub marks a delivery
 * failed and the reconcile redelivers it, but a delivery GitHub never attempted (an outage of its
 * webhooks) leaves no trace in the App's log. Every `queued-scan-interval`, the App's installations (or the
 * configured one), their repositories, the workflow runs of each that are queued or in progress, and the
 * jobs of those runs are read: each job still queued whose labels a route covers and that has waited past
 * `grace` (so that its webhook had its chance) is handed to the pool as its `queued` delivery would have
 * been; what the pool knows already it ignores (the job's request id is the same either way).
 *
 * Calls per scan: 1 (installations) + per installation 1 (its repositories, 100 at most) + per
 * repository 2 (queued and in-progress runs) + per such run 1 (its jobs); installation tokens as cached.
 */

/** How long a job waits for its webhook before a scan requests its node: a minute. */
export const QUEUED_SCAN_GRACE_MS = 60_000;

/** GitHub's page size maximum; a scan reads the first page of each list (the newest runs). */
const PAGE = 100;

export async function queuedJobs(
  api: GithubApi,
  routes: readonly GithubRoute[],
  options: { readonly installationId?: number; readonly graceMs: number; readonly now?: number },
): Promise<Extract<JobEvent, { kind: 'queued' }>[]> {
  const now = options.now ?? Date.now();
  const installations =
    options.installationId === undefined ? await api.installations() : [options.installationId];
  const found: Extract<JobEvent, { kind: 'queued' }>[] = [];
  for (const installationId of installations) {
    for (const repository of await api.repositories(installationId, PAGE)) {
      const runs = [
        ...(await api.runs(installationId, repository, 'queued', PAGE)),
        ...(await api.runs(installationId, repository, 'in_progress', PAGE)),
      ];
      for (const runId of new Set(runs)) {
        for (const job of await api.runJobs(installationId, repository, runId, PAGE)) {
          if (job.status !== 'queued' || now - Date.parse(job.created_at) < options.graceMs) continue;
          const route = routeOf(routes, job.labels);
          if (route) found.push({ kind: 'queued', jobId: job.id, repository, installationId, route });
        }
      }
    }
  }
  return found;
}
