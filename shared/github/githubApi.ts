import { createAppAuth } from '@octokit/auth-app';
import type { components } from '@octokit/openapi-types';
import { request as octokitRequest } from '@octokit/request';
import type { GithubSettings } from '../config/model.ts';

/**
 * The GitHub API calls the pool makes, as its GitHub App: an installation token (@octokit/auth-app signs
 * the App's JWT and caches each installation's token until shortly before it expires, so one token serves
 * every job of the hour), a just-in-time runner configuration per job (`generate-jitconfig`, for the
 * organization when `organization` is set, else for the job's repository), and, once per reconcile
 * interval, the App's delivery log and a redelivery of each workflow_job delivery that never reached the
 * pool (a lost webhook). On the steady path a job costs one call, plus one token an hour per installation.
 */

export interface JitRunner {
  readonly runnerId: number;
  readonly encodedJitConfig: string;
}

export class GithubApi {
  private readonly request: typeof octokitRequest;
  private readonly auth: ReturnType<typeof createAppAuth>;
  /** Calls made to GitHub, by what they were: the figures docs/github.md reports. */
  readonly calls = { tokens: 0, jitConfigs: 0, deliveryLists: 0, redeliveries: 0 };

  constructor(
    private readonly settings: GithubSettings,
    privateKey: string,
  ) {
    this.request = octokitRequest.defaults({
      baseUrl: settings.apiUrl,
      headers: { 'x-github-api-version': '2022-11-28' },
    });
    const counted = this.request.defaults({
      request: {
        hook: (send: typeof octokitRequest, options: { url?: string }) => {
          if (String(options.url).includes('/access_tokens')) this.calls.tokens += 1;
          return send(options as Parameters<typeof octokitRequest>[0]);
        },
      },
    });
    this.auth = createAppAuth({ appId: settings.appId, privateKey, request: counted });
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
    const { token } = await this.auth({ type: 'installation', installationId });
    const body = {
      name: args.name,
      runner_group_id: this.settings.runnerGroupId,
      labels: [...args.labels],
      work_folder: '_work',
      headers: { authorization: `token ${token}` },
    };
    this.calls.jitConfigs += 1;
    const { organization } = this.settings;
    const [owner, repo] = args.repository.split('/');
    const answer = organization
      ? await this.request('POST /orgs/{org}/actions/runners/generate-jitconfig', {
          org: organization,
          ...body,
        })
      : await this.request('POST /repos/{owner}/{repo}/actions/runners/generate-jitconfig', {
          owner: owner ?? '',
          repo: repo ?? '',
          ...body,
        });
    return { runnerId: answer.data.runner.id, encodedJitConfig: answer.data.encoded_jit_config };
  }

  /** The newest page of the App's webhook deliveries (the App's JWT: no installation token). */
  async deliveries(): Promise<DeliveryItem[]> {
    const { token } = await this.auth({ type: 'app' });
    this.calls.deliveryLists += 1;
    const answer = await this.request('GET /app/hook/deliveries', {
      per_page: 100,
      headers: { authorization: `bearer ${token}` },
    });
    return answer.data;
  }

  /** Asks GitHub to deliver a delivery again (to the App's webhook URL). */
  async redeliver(id: number): Promise<void> {
    const { token } = await this.auth({ type: 'app' });
    this.calls.redeliveries += 1;
    await this.request('POST /app/hook/deliveries/{delivery_id}/attempts', {
      delivery_id: id,
      headers: { authorization: `bearer ${token}` },
    });
  }
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

export type DeliveryItem = components['schemas']['hook-delivery-item'];

/** The labels a runner of a route is registered with: its runs-on, less what GitHub gives every self-hosted runner. */
export function runnerLabels(runsOn: readonly string[], fallback: string): string[] {
  const own = runsOn.filter((l) => l.toLowerCase() !== 'self-hosted');
  return own.length > 0 ? own : [fallback];
}
