import type { Log } from '../core/log.ts';
import { type GithubApi, redeliverLost } from '../github/githubApi.ts';
import { QUEUED_SCAN_GRACE_MS, queuedJobs } from '../github/queuedScan.ts';
import { type JobActions, requestJob } from './githubWebhookHandler.ts';

/**
 * The github function's schedule (every `reconcile-interval`, docs/github.md): failed
 * webhook deliveries of the last hour are delivered again (the App's delivery log), and, every
 * `queued-scan-interval`, GitHub's queued jobs are read for ones no webhook ever brought: each routed job
 * queued past a minute that the table does not know gets its request, as its delivery would have. One
 * run scans at a time, whatever the containers: the scan is claimed in the table first.
 */
export interface GithubScheduleDeps extends JobActions {
  readonly api: () => Promise<GithubApi>;
  readonly log: Log;
}

export interface ScheduleReport {
  readonly redelivered: number;
  /** Jobs found queued with no webhook seen, requested now; undefined when no scan was due. */
  readonly requested?: number;
}

export function makeGithubScheduleHandler(
  deps: GithubScheduleDeps,
): (now?: number) => Promise<ScheduleReport> {
  return async (now = Date.now()) => {
    const api = await deps.api();
    const { redelivered } = await redeliverLost(api, deps.log, now);
    const interval = deps.settings.queuedScanInterval * 1000;
    if (interval === 0 || !(await deps.items.claimScan(interval, now))) return { redelivered };
    const jobs = await queuedJobs(api, deps.settings.routes, {
      ...(deps.settings.installationId === undefined ? {} : { installationId: deps.settings.installationId }),
      graceMs: QUEUED_SCAN_GRACE_MS,
      now,
    });
    let requested = 0;
    for (const event of jobs) {
      if (await deps.items.job(event.jobId)) continue; // a webhook brought it: the pool knows it
      deps.log.info(
        `github: job ${event.jobId} of ${event.repository} is queued with no webhook seen; requesting its node`,
      );
      if ((await requestJob(deps, event)) === undefined) requested += 1;
    }
    return { redelivered, requested };
  };
}
