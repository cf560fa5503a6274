import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { MOTO_CREDENTIALS } from './motoServer.ts';

/**
 * The environment of every process the rehearsal starts that talks to AWS (the CDK CLI, the functions):
 * moto's endpoint for every service, fake credentials, the region, and nothing of this machine's AWS
 * set-up (no AWS_* or CDK_* variable is passed on, the config and credentials files point nowhere), so
 * nothing can reach a real account even if a client ignored the endpoint.
 */
export function motoEnv(
  endpoint: string,
  region: string,
  extra: Readonly<Record<string, string>> = {},
  base: NodeJS.ProcessEnv = process.env,
): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(base)) {
    if (!/^(AWS_|CDK_)/.test(k)) env[k] = v;
  }
  const nowhere = join(tmpdir(), 'metastatic-rehearse-no-aws-config');
  return {
    ...env,
    ...motoClientEnv(endpoint, region),
    AWS_CONFIG_FILE: nowhere,
    AWS_SHARED_CREDENTIALS_FILE: nowhere,
    AWS_EC2_METADATA_DISABLED: 'true',
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    CDK_DISABLE_VERSION_CHECK: 'true',
    CDK_DISABLE_CLI_TELEMETRY: 'true',
    ...extra,
  };
}

/** What a client of the rehearsed pool needs (and what the rehearsal prints for the user's shell). */
export function motoClientEnv(endpoint: string, region: string): Record<string, string> {
  return {
    AWS_ENDPOINT_URL: endpoint,
    AWS_REGION: region,
    AWS_DEFAULT_REGION: region,
    AWS_ACCESS_KEY_ID: MOTO_CREDENTIALS.accessKeyId,
    AWS_SECRET_ACCESS_KEY: MOTO_CREDENTIALS.secretAccessKey,
  };
}

/** SDK client settings for moto (endpoint, region, fake credentials). */
export function motoClientConfig(endpoint: string, region: string) {
  return { endpoint, region, credentials: MOTO_CREDENTIALS };
}
