import { randomBytes } from 'node:crypto';
import { createAppAuth } from '@octokit/auth-app';
import { Octokit } from '@octokit/core';
import type { components } from '@octokit/openapi-types';
import { retry } from '@octokit/plugin-retry';
import { throttling } from '@octokit/plugin-throttling';
import Bottleneck from 'bottleneck';
import type { GithubSettings } from '../core/model.ts';

/**
 * The GitHub API calls the pool makes, as its GitHub App, through @octokit/core: an installation token
 * (@octokit/auth-app signs the App's JWT and caches each installation's token until shortly before it
 * expires, so one token serves every job of the hour), a just-in-time runner configuration per job
 * (`generate-jitconfig`, for the organization when `organization` is set, else for the job's repository),
 * and, once per reconcile interval, the App's delivery log and a redelivery of each workflow_job delivery
 * that never reached the pool (a lost webhook). On the steady path a job costs one call, plus one token an
 * hour per installation.
 *
 * Rate limits are GitHub's rules, kept by @octokit/plugin-throttling: a call answered with a primary or
 * secondary rate limit is tried again after the wait GitHub names (`retry-after`, `x-ratelimit-reset`),
 * up to MAX_RATE_LIMIT_RETRIES times and only while that wait is at most MAX_RATE_LIMIT_WAIT_S; a 5xx is
 * tried again by @octokit/plugin-retry (a 4xx is an answer, not tried again). Beyond that the call fails, the job's run with it, and its node
 * is released (GitHub keeps the job queued).
 */

export const MAX_RATE_LIMIT_RETRIES = 3;
export const MAX_RATE_LIMIT_WAIT_S = 60;
/**
 * Writes (each generate-jitconfig is a POST) start at most this often. GitHub's secondary limit is 900
 * points a minute, 5 for a POST: 180 a minute. plugin-throttling's own default, one a second at most one
 * at a time, would start the runners of a burst of 1,000 queued jobs over 17 minutes; this, in 6.
 */
export const WRITE_INTERVAL_MS = 340;
/**
 * The writes of this process, spaced for `processes` writing at once (Lambda's containers of the github
 * function: each spaces its own, so together they stay within GitHub's limit). One group per spacing.
 */
const writeGroups = new Map<number, Bottleneck.Group>();
function writesFor(processes: number): Bottleneck.Group {
  let group = writeGroups.get(processes);
  if (!group) {
    group = new Bottleneck.Group({
      id: `metastatic-github-write-${processes}`,
      maxConcurrent: Math.max(1, Math.floor(10 / processes)),
      minTime: WRITE_INTERVAL_MS * processes,
    });
    writeGroups.set(processes, group);
  }
  return group;
}

const GithubClient = Octokit.plugin(throttling, retry);
type GithubClient = InstanceType<typeof GithubClient>;

export interface JitRunner {
  readonly runnerId: number;
  readonly encodedJitConfig: string;
}

export type DeliveryItem = components['schemas']['hook-delivery-item'];

export class GithubApi {
  /** One client per installation (its token cached inside), and one for the App itself (its JWT). */
  private readonly clients = new Map<number | 'app', GithubClient>();
  /** Calls made to GitHub, by what they were: the figures docs/github.md reports. */
  readonly calls = { tokens: 0, jitConfigs: 0, deliveryLists: 0, redeliveries: 0, scans: 0, rateLimited: 0 };
  /**
   * Installation tokens, as @octokit/auth-app's own cache keeps them (59 minutes: GitHub's hour, less one),
   * counted as they are made.
   */
  private readonly tokens = tokenCache(() => {
    this.calls.tokens += 1;
  });

  constructor(
    private readonly settings: GithubSettings,
    private readonly privateKey: string,
    /** How many processes call GitHub for this App at once (the github function's containers): 1 in dev. */
    private readonly writers = 1,
  ) {}

  private client(installationId: number | 'app'): GithubClient {
    let client = this.clients.get(installationId);
    if (client) return client;
    const calls = this.calls;
    const retryWhile = (wait: number, _options: unknown, _octokit: unknown, retryCount: number) => {
      calls.rateLimited += 1;
      return retryCount < MAX_RATE_LIMIT_RETRIES && wait <= MAX_RATE_LIMIT_WAIT_S;
    };
    client = new GithubClient({
      baseUrl: this.settings.apiUrl,
      authStrategy: createAppAuth,
      auth: {
        appId: this.settings.appId,
        privateKey: this.privateKey,
        ...(installationId === 'app' ? {} : { installationId }),
        cache: this.tokens,
      },
      request: { headers: { 'x-github-api-version': '2022-11-28' } },
      throttle: {
        onRateLimit: retryWhile,
        onSecondaryRateLimit: retryWhile,
        write: writesFor(this.writers),
      },
      // 409 too: a runner name in use is an answer, not a failure to try again.
      retry: { doNotRetry: [400, 401, 403, 404, 409, 410, 422, 451] },
    });
    this.clients.set(installationId, client);
    return client;
  }

  /**
   * A JIT configuration for a runner named `name` with `labels`, registered for `repository` (owner/name)
   * or the configured organization, in the configured runner group.
   */
  async jitConfig(args: {
    readonly installationId?: number;
    readonly repository: string;
    readonly name: string;
    readonly labels: readonly string[];
  }): Promise<JitRunner> {
    const installationId = this.settings.installationId ?? args.installationId;
    if (installationId === undefined) {
      throw new Error(
        'no installation id: set github.installation-id, or deliver webhooks of an App installation',
      );
    }
    const client = this.client(installationId);
    const body = {
      name: args.name,
      runner_group_id: this.settings.runnerGroupId,
      labels: [...args.labels],
      work_folder: '_work',
    };
    this.calls.jitConfigs += 1;
    const { organization } = this.settings;
    const [owner = '', repo = ''] = args.repository.split('/');
    const answer = organization
      ? await client.request('POST /orgs/{org}/actions/runners/generate-jitconfig', {
          org: organization,
          ...body,
        })
      : await client.request('POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig', {
          owner,
          repo,
          ...body,
        });
    return { runnerId: answer.data.runner.id, encodedJitConfig: answer.data.encoded_jit_config };
  }

  /** The App's installations (the App's JWT). */
  async installations(): Promise<number[]> {
    this.calls.scans += 1;
    const answer = await this.client('app').request('GET /app/installations', { per_page: 100 });
    return answer.data.map((i) => i.id);
  }

  /** The repositories an installation can reach (`owner/name`), the first `perPage`. */
  async repositories(installationId: number, perPage: number): Promise<string[]> {
    this.calls.scans += 1;
    const answer = await this.client(installationId).request('GET /installation/repositories', {
      per_page: perPage,
    });
    return answer.data.repositories.map((r) => r.full_name);
  }

  /** The ids of a repository's workflow runs in a status, the newest `perPage`. */
  async runs(
    installationId: number,
    repository: string,
    status: 'queued' | 'in_progress',
    perPage: number,
  ): Promise<number[]> {
    this.calls.scans += 1;
    const [owner = '', repo = ''] = repository.split('/');
    const answer = await this.client(installationId).request('GET /repos/{owner}/{repo}/actions/runs', {
      owner,
      repo,
      status,
      per_page: perPage,
    });
    return answer.data.workflow_runs.map((r) => Number(r.id));
  }

  /** The jobs of a run's latest attempt: id, status, labels, when created. */
  async runJobs(
    installationId: number,
    repository: string,
    runId: number,
    perPage: number,
  ): Promise<{ id: number; status: string; labels: string[]; created_at: string }[]> {
    this.calls.scans += 1;
    const [owner = '', repo = ''] = repository.split('/');
    const answer = await this.client(installationId).request(
      'GET /repos/{owner}/{repo}/actions/runs/{run_id}/jobs',
      { owner, repo, run_id: runId, filter: 'latest', per_page: perPage },
    );
    return answer.data.jobs.map((j) => ({
      id: Number(j.id),
      status: j.status,
      labels: j.labels,
      created_at: j.created_at,
    }));
  }

  /** The newest page of the App's webhook deliveries (the App's JWT: no installation token). */
  async deliveries(): Promise<DeliveryItem[]> {
    this.calls.deliveryLists += 1;
    const answer = await this.client('app').request('GET /app/hook/deliveries', { per_page: 100 });
    return answer.data;
  }

  /** Asks GitHub to deliver a delivery again (to the App's webhook URL). */
  async redeliver(id: number): Promise<void> {
    this.calls.redeliveries += 1;
    await this.client('app').request('POST /app/hook/deliveries/{delivery_id}/attempts', { delivery_id: id });
  }
}

/** A token cache for @octokit/auth-app (its `cache` option): entries live 59 minutes; `made` is told of each new one. */
function tokenCache(made: () => void) {
  const entries = new Map<string, { value: string; until: number }>();
  return {
    get: (key: string): string | undefined => {
      const entry = entries.get(key);
      if (entry && entry.until > Date.now()) return entry.value;
      entries.delete(key);
      return undefined;
    },
    set: (key: string, value: string): void => {
      made();
      entries.set(key, { value, until: Date.now() + 59 * 60_000 });
    },
  };
}

export interface FailedDelivery {
  readonly id: number;
  readonly guid: string;
  readonly action: string | null;
}

/**
 * The App's `workflow_job` deliveries since `since` that never reached the pool (GitHub could not
 * connect, timed out, or got a 5xx) and were not delivered by a later attempt: one page of the App's
 * delivery log (the 100 newest), oldest first.
 */
export function failedDeliveries(items: readonly DeliveryItem[], since: number): FailedDelivery[] {
  const reached = new Set(
    items.filter((d) => d.status_code >= 200 && d.status_code < 500).map((d) => d.guid),
  );
  const out = new Map<string, FailedDelivery>();
  for (const d of items) {
    if (d.event !== 'workflow_job' || reached.has(d.guid) || Date.parse(d.delivered_at) < since) continue;
    if (!out.has(d.guid)) out.set(d.guid, { id: Number(d.id), guid: d.guid, action: d.action });
  }
  return [...out.values()].reverse();
}

/** The labels a runner of a route is registered with: its runs-on, less what GitHub gives every self-hosted runner. */
export function runnerLabels(runsOn: readonly string[], fallback: string): string[] {
  const own = runsOn.filter((l) => l.toLowerCase() !== 'self-hosted');
  return own.length > 0 ? own : [fallback];
}

/**
 * A JIT configuration for the runner of a node: named after the node, or, when GitHub has a runner of that
 * name already (one an earlier try made and never started: it never runs), with a suffix of its own.
 */
export async function nodeRunner(
  api: GithubApi,
  args: {
    readonly installationId?: number;
    readonly repository: string;
    readonly nodeId: string;
    readonly labels: readonly string[];
  },
): Promise<{ readonly name: string; readonly jit: JitRunner }> {
  const { nodeId, ...rest } = args;
  let name = runnerName(nodeId);
  try {
    return { name, jit: await api.jitConfig({ ...rest, name }) };
  } catch (err) {
    if ((err as { status?: number }).status !== 409) throw err;
    name = `${name}-${randomBytes(3).toString('hex')}`;
    return { name, jit: await api.jitConfig({ ...rest, name }) };
  }
}

/** A runner's name: its node's id, `/` made `-` (GitHub runner names are one path segment). */
export function runnerName(nodeId: string): string {
  return nodeId.replaceAll('/', '-');
}

/**
 * Lost webhooks: every workflow_job delivery of the last hour that never reached the pool (GitHub marks
 * a delivery failed after 10 s and does not try again by itself) is delivered again, through the App's
 * delivery log. One call, plus one per lost delivery.
 */
export async function redeliverLost(
  api: GithubApi,
  log: { info(message: string): void },
  now = Date.now(),
): Promise<{ redelivered: number }> {
  const lost = failedDeliveries(await api.deliveries(), now - 3600_000);
  for (const d of lost) {
    log.info(
      `github: delivery ${d.guid} (workflow_job ${d.action ?? ''}) never reached the pool; redelivering`,
    );
    await api.redeliver(d.id);
  }
  return { redelivered: lost.length };
}
