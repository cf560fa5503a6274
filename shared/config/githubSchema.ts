import { z } from 'zod';
import { MAX_LEASE, MIN_LEASE } from '../core/leases.ts';
import type { GithubSettings } from '../core/model.ts';
import { bool, intBetween, MAPPING, name, nonEmptyList, nonEmptyString } from '../fields/fields.ts';
import { asRecord, asString, type PathIssue } from '../fields/paths.ts';

/**
 * The top-level `github` section (docs/github.md): GitHub Actions jobs run in packed slots. A
 * `workflow_job` webhook whose job's `runs-on` labels a route covers becomes a request for the route's
 * metastatic label; once its node is ready, a just-in-time runner is started on it as the slot's user,
 * and the node is released when the runner exits. Secrets are never in the file: the App's private key
 * and the webhook secrets are read from files (0600) named here.
 */

export const DEFAULT_GITHUB_API = 'https://api.github.com';
/** The runner command's default: the actions runner in the slot user's home, given its JIT config. */
export const DEFAULT_RUNNER_COMMAND = './actions-runner/run.sh --jitconfig "$METASTATIC_JITCONFIG"';
export const MAX_ROUTES = 100;
/** GitHub's own limit on a runner's labels. */
export const MAX_RUNNER_LABELS = 100;
export const DEFAULT_IDLE_TIMEOUT = 600;
export const DEFAULT_RECONCILE_INTERVAL = 120;
/** Every 10 minutes: a scan costs about 2 calls per repository (docs/github.md, Costs). */
export const DEFAULT_QUEUED_SCAN_INTERVAL = 600;

/** A GitHub label (runs-on): GitHub takes up to 100 characters, compared case-insensitively. */
const runnerLabel = () =>
  z
    .string({ error: 'a label of 1-100 characters, no comma or control character' })
    .regex(/^[^,\p{Cc}]{1,100}$/u, { error: 'a label of 1-100 characters, no comma or control character' });

const GITHUB_LOGIN = 'a GitHub organization name: 1-39 characters of A-Z a-z 0-9 -';
const ABSOLUTE_URL = 'an http or https URL';

export const githubRouteSchema = z.strictObject(
  {
    'runs-on': nonEmptyList(runnerLabel(), 'runs-on')
      .refine((l) => l.length <= MAX_RUNNER_LABELS, { error: `at most ${MAX_RUNNER_LABELS} labels` })
      .describe(
        "The runner's labels: a job whose runs-on labels are all among these (case-insensitively) gets a runner with them.",
      ),
    label: name().describe('The metastatic label whose node runs the job.'),
    lease: intBetween(MIN_LEASE, MAX_LEASE)
      .default(3600)
      .describe(
        `Seconds the node is held without a renewal (the bridge renews it while the runner runs); ${MIN_LEASE}-${MAX_LEASE}, default 3600.`,
      ),
  },
  { error: MAPPING },
);

export const githubSchema = z
  .strictObject(
    {
      'api-url': z
        .string({ error: ABSOLUTE_URL })
        .regex(/^https?:\/\/[^\s/]+(\/[^\s]*)?$/, { error: ABSOLUTE_URL })
        .max(2048)
        .default(DEFAULT_GITHUB_API)
        .describe(
          `GitHub's REST API: ${DEFAULT_GITHUB_API}, or GitHub Enterprise Server's https://HOST/api/v3.`,
        ),
      'app-id': intBetween(1, 2 ** 31 - 1).describe("The GitHub App's id."),
      'installation-id': intBetween(1, 2 ** 53 - 1)
        .optional()
        .describe("The App's installation; default: the one each webhook names."),
      'private-key-file': nonEmptyString()
        .optional()
        .describe(
          "A file holding the App's private key (PEM); metastatic dev only (on AWS the stack's secret holds it).",
        ),
      'webhook-secret-files': nonEmptyList(nonEmptyString(), 'webhook-secret-files')
        .refine((l) => l.length <= 2, { error: 'one or two files (two while a secret is rotated)' })
        .optional()
        .describe(
          "Files holding the webhook secret, two while rotating (a delivery signed with either passes); metastatic dev only (on AWS the stack's secret holds it).",
        ),
      organization: z
        .string({ error: GITHUB_LOGIN })
        .regex(/^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$/, { error: GITHUB_LOGIN })
        .optional()
        .describe("Register runners with this organization; default: with each job's repository."),
      'runner-group-id': intBetween(1, 2 ** 31 - 1)
        .default(1)
        .describe('The runner group new runners join (1: the default group).'),
      'runner-command': nonEmptyString()
        .max(4096)
        .default(DEFAULT_RUNNER_COMMAND)
        .describe(
          'What the slot runs, with sh, in its home directory, as its user; $METASTATIC_JITCONFIG holds the encoded JIT configuration.',
        ),
      'idle-timeout': intBetween(30, 86_400)
        .default(DEFAULT_IDLE_TIMEOUT)
        .describe('Seconds a started runner may wait for a job before it is stopped and its slot freed.'),
      'reconcile-interval': intBetween(10, 3600)
        .default(DEFAULT_RECONCILE_INTERVAL)
        .describe(
          "Seconds between looks at the App's webhook deliveries: each workflow_job delivery that never reached the pool in the last hour is delivered again (a lost webhook).",
        ),
      'queued-scan-interval': z
        .union([z.literal(0), intBetween(60, 86_400)], { error: '0 (off), or seconds from 60 to 86400' })
        .default(DEFAULT_QUEUED_SCAN_INTERVAL)
        .describe(
          "Seconds between looks at GitHub's queued jobs for ones whose webhook never came (0: never): each routed job queued longer than a minute with no request gets one.",
        ),
      'webhook-port': intBetween(0, 65_535)
        .default(0)
        .describe('The port of the webhook listener on 127.0.0.1 (metastatic dev); 0: any free one.'),
      enabled: bool().default(true).describe('false: the section is kept but no listener is started.'),
      routes: nonEmptyList(githubRouteSchema, 'routes')
        .refine((l) => l.length <= MAX_ROUTES, { error: `at most ${MAX_ROUTES} routes` })
        .describe("Each job goes to the first route whose runs-on covers the job's labels."),
    },
    { error: MAPPING },
  )
  .describe('GitHub Actions jobs in packed slots (docs/github.md).');

export type GithubFile = z.infer<typeof githubSchema>;

export function githubSettings(file: GithubFile): GithubSettings {
  return {
    apiUrl: file['api-url'].replace(/\/+$/, ''),
    appId: file['app-id'],
    ...(file['installation-id'] === undefined ? {} : { installationId: file['installation-id'] }),
    ...(file['private-key-file'] === undefined ? {} : { privateKeyFile: file['private-key-file'] }),
    ...(file['webhook-secret-files'] === undefined
      ? {}
      : { webhookSecretFiles: file['webhook-secret-files'] }),
    ...(file.organization === undefined ? {} : { organization: file.organization }),
    runnerGroupId: file['runner-group-id'],
    runnerCommand: file['runner-command'],
    idleTimeout: file['idle-timeout'],
    reconcileInterval: file['reconcile-interval'],
    queuedScanInterval: file['queued-scan-interval'],
    webhookPort: file['webhook-port'],
    enabled: file.enabled,
    routes: file.routes.map((r) => ({ runsOn: r['runs-on'], label: r.label, lease: r.lease })),
  };
}

/** Each route's label is a metastatic label some pool offers (on the raw data; field errors are the schema's). */
export function checkGithubRoutes(
  root: Record<string, unknown>,
  metastaticLabels: ReadonlySet<string>,
  complete: boolean,
): PathIssue[] {
  const routes = asRecord(root.github)?.routes;
  if (!Array.isArray(routes) || !complete) return [];
  return routes.flatMap((raw, index) => {
    const label = asString(asRecord(raw)?.label);
    if (label === undefined || metastaticLabels.has(label)) return [];
    return [
      {
        path: ['github', 'routes', index, 'label'],
        message: `no metastatic pool offers the label "${label}"`,
      },
    ];
  });
}
