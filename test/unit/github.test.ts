import { sign } from '@octokit/webhooks-methods';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { type ConfigResult, parseConfig } from '../../shared/config/load.ts';
import { type DeliveryItem, failedDeliveries } from '../../shared/github/githubApi.ts';
import { RecentDeliveries, readDelivery, routeOf, signedByOneOf } from '../../shared/github/webhook.ts';

/** The GitHub bridge's pure parts (issue 43): signatures, routing, payloads, lost deliveries, the section. */

const ROUTES = [
  { runsOn: ['self-hosted', 'Linux', 'small'], label: 'small', lease: 3600 },
  { runsOn: ['self-hosted', 'linux', 'small', 'large'], label: 'large', lease: 3600 },
];

describe('GitHub webhooks', () => {
  it('checks X-Hub-Signature-256 against each secret, and nothing else passes', async () => {
    const body = Buffer.from('{"action":"queued"}');
    const signature = await sign('new', body.toString());
    expect(await signedByOneOf(['old', 'new'], body, signature)).toBe(true);
    expect(await signedByOneOf(['old'], body, signature)).toBe(false);
    expect(await signedByOneOf(['new'], Buffer.from('{"action":"queued" }'), signature)).toBe(false);
    expect(await signedByOneOf(['new'], body, undefined)).toBe(false);
    expect(await signedByOneOf(['new'], body, signature.replace('sha256=', 'sha1='))).toBe(false);
    // Bytes that are not UTF-8 are no GitHub payload, whatever they decode to.
    const bad = Buffer.from([0x7b, 0xff, 0x7d]);
    expect(await signedByOneOf(['new'], bad, await sign('new', bad.toString('utf8')))).toBe(false);
  });

  it('routes a job to the first route whose runs-on holds all its labels, case-insensitively', () => {
    expect(routeOf(ROUTES, ['self-hosted', 'linux', 'small'])?.label).toBe('small');
    expect(routeOf(ROUTES, ['SMALL'])?.label).toBe('small');
    expect(routeOf(ROUTES, ['large', 'linux'])?.label).toBe('large');
    expect(routeOf(ROUTES, ['self-hosted', 'gpu'])).toBeUndefined();
    expect(routeOf(ROUTES, [])).toBeUndefined();
  });

  it('reads only what it needs of a payload, and says what is wrong with one it cannot read', () => {
    const job = { id: 7, run_id: 9, labels: ['small'], runner_name: null, steps: [] };
    const payload = (action: string, extra: object = {}) =>
      Buffer.from(
        JSON.stringify({ action, workflow_job: { ...job, ...extra }, repository: { full_name: 'o/r' } }),
      );
    expect(readDelivery('workflow_job', payload('queued'), ROUTES)).toMatchObject({
      status: 202,
      event: { kind: 'queued', jobId: 7, repository: 'o/r', route: { label: 'small' } },
    });
    expect(
      readDelivery('workflow_job', payload('in_progress', { runner_name: 'r-1' }), ROUTES).event,
    ).toEqual({
      kind: 'in_progress',
      jobId: 7,
      runnerName: 'r-1',
    });
    expect(readDelivery('workflow_job', payload('waiting'), ROUTES)).toEqual({
      status: 202,
      reason: 'ignored: action waiting',
    });
    expect(readDelivery('push', payload('queued'), ROUTES)).toEqual({
      status: 202,
      reason: 'ignored: a push event',
    });
    expect(readDelivery('workflow_job', payload('queued', { id: -1 }), ROUTES)).toMatchObject({
      status: 400,
    });
    const badRepo = Buffer.from(
      JSON.stringify({ action: 'queued', workflow_job: job, repository: { full_name: 'x' } }),
    );
    expect(readDelivery('workflow_job', badRepo, ROUTES).reason).toBe(
      'not a workflow_job payload: repository.full_name: an owner/name',
    );
  });

  it('remembers the last ids it saw, forgetting the oldest first', () => {
    const recent = new RecentDeliveries(2);
    expect([recent.first('a'), recent.first('a'), recent.first('b'), recent.first('c')]).toEqual([
      true,
      false,
      true,
      true,
    ]);
    expect([recent.has('a'), recent.has('b'), recent.has('c')]).toEqual([false, true, true]);
  });

  it("finds the workflow_job deliveries of the App's log that never reached the pool, once each", () => {
    const at = (minutesAgo: number) => new Date(Date.now() - minutesAgo * 60_000).toISOString();
    const item = (
      id: number,
      guid: string,
      status_code: number,
      minutesAgo = 1,
      event = 'workflow_job',
    ): DeliveryItem => ({
      id,
      guid,
      delivered_at: at(minutesAgo),
      redelivery: false,
      duration: 0.1,
      status: status_code === 0 ? 'failed to connect' : 'OK',
      status_code,
      event,
      action: 'queued',
      installation_id: 1,
      repository_id: 1,
    });
    const log = [
      item(6, 'lost', 502), // newest first, as GitHub lists them
      item(5, 'lost', 0),
      item(4, 'redelivered', 202),
      item(3, 'redelivered', 0),
      item(2, 'refused', 400), // the pool read it and said no: another delivery would not help
      item(1, 'old', 0, 90),
      item(0, 'push', 0, 1, 'push'),
    ];
    expect(failedDeliveries(log, Date.now() - 3600_000)).toEqual([{ id: 6, guid: 'lost', action: 'queued' }]);
  });
});

describe('the github section of a configuration', () => {
  const base = {
    providers: [
      { name: 'local', driver: 'local', pools: [{ name: 'main', labels: [{ name: 'large' }] }] },
      {
        name: 'meta',
        driver: 'metastatic',
        pools: [{ name: 'main', labels: [{ name: 'small', 'backing-label': 'large' }] }],
      },
    ],
  };
  const github = {
    'app-id': 1,
    'private-key-file': '/keys/app.pem',
    'webhook-secret-files': ['/keys/secret'],
    routes: [{ 'runs-on': ['self-hosted', 'small'], label: 'small' }],
  };
  const parse = (g: object): ConfigResult => parseConfig(stringify({ ...base, github: g }), 'test.yaml');
  const problems = (r: ConfigResult) => (r.ok ? [] : r.errors.map((e) => `${e.path}: ${e.message}`));

  it('resolves with its defaults', () => {
    const r = parse(github);
    expect(r.ok && r.config.github).toEqual({
      apiUrl: 'https://api.github.com',
      appId: 1,
      privateKeyFile: '/keys/app.pem',
      webhookSecretFiles: ['/keys/secret'],
      runnerGroupId: 1,
      runnerCommand: './actions-runner/run.sh --jitconfig "$METASTATIC_JITCONFIG"',
      idleTimeout: 600,
      reconcileInterval: 120,
      queuedScanInterval: 600,
      webhookPort: 0,
      enabled: true,
      routes: [{ runsOn: ['self-hosted', 'small'], label: 'small', lease: 3600 }],
    });
  });

  it('names the YAML path of each mistake', () => {
    expect(problems(parse({ ...github, routes: [{ 'runs-on': ['a,b'], label: 'nope' }] }))).toEqual([
      'github.routes[0].runs-on[0]: expected a label of 1-100 characters, no comma or control character, got "a,b"',
      'github.routes[0].label: no metastatic pool offers the label "nope"',
    ]);
    expect(problems(parse({ ...github, 'webhook-secret-files': ['a', 'b', 'c'] }))).toEqual([
      'github.webhook-secret-files: webhook-secret-files: expected one or two files (two while a secret is rotated), got a list',
    ]);
    expect(problems(parse({ ...github, 'api-url': 'ftp://x' }))[0]).toMatch(/^github\.api-url: /);
    // No secret inline: an unknown key, like any other.
    expect(problems(parse({ ...github, secret: 'inline' }))).toEqual(['github.secret: unknown key "secret"']);
  });
});
