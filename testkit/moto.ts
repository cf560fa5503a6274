import { describe } from 'vitest';
import {
  MOTO_CREDENTIALS as CREDENTIALS,
  resetMotoServer,
  startMotoServer,
} from '../cli/rehearse/motoServer.ts';
import { onPath } from './onPath.ts';

/**
 * moto_server, a local server that speaks AWS's wire protocols (EC2 query/XML, DynamoDB, SQS,
 * EventBridge, CloudFormation, S3, IAM): the suites that must prove AWS would accept our requests run
 * the real SDK against it. One server per test file, on a free loopback port (started by the code
 * `metastatic rehearse` starts its own with, cli/rehearse/motoServer.ts); `reset()` between tests.
 *
 * Where moto_server is not installed these suites skip, with one line saying why; with
 * METASTATIC_REQUIRE_MOTO=1 (set by .ci/run) its absence fails the run instead.
 */
export interface Moto {
  /** `http://localhost:PORT`: moto tells services apart by host name, so `localhost`, not 127.0.0.1. */
  readonly endpoint: string;
  readonly port: number;
  /** Forgets every resource (POST /moto-api/reset). */
  reset(): Promise<void>;
  stop(): Promise<void>;
}

/** Credentials moto accepts (any); never real ones. */
export const MOTO_CREDENTIALS = CREDENTIALS;
/** moto's default account id. */
export const MOTO_ACCOUNT = '123456789012';

let availability: string | undefined | null = null;

/** Why moto cannot run here, or undefined when it can. */
export function motoUnavailable(): string | undefined {
  if (availability !== null) return availability;
  availability = onPath('moto_server')
    ? undefined
    : "moto_server is not installed (not on PATH); pip install 'moto[server]==5.2.1'";
  if (availability !== undefined && process.env.METASTATIC_REQUIRE_MOTO === '1') {
    throw new Error(`METASTATIC_REQUIRE_MOTO=1 but ${availability}`);
  }
  return availability;
}

/** `describe` that skips (saying why, once) where moto_server is absent. */
export function describeWithMoto(name: string, body: () => void): void {
  const why = motoUnavailable();
  if (why !== undefined) {
    console.warn(`skipping "${name}": ${why}`);
    // biome-ignore lint/suspicious/noSkippedTests: skipped only where moto_server is absent (never in CI)
    describe.skip(name, body);
    return;
  }
  describe(name, body);
}

/** Starts moto_server on a free loopback port (as `metastatic rehearse` does) and waits until it answers. */
export async function startMoto(options: { env?: Record<string, string> } = {}): Promise<Moto> {
  const why = motoUnavailable();
  if (why !== undefined) throw new Error(why);
  const server = await startMotoServer(options.env ? { env: options.env } : {});
  return {
    endpoint: server.endpoint,
    port: server.port,
    reset: () => resetMotoServer(server.endpoint),
    stop: () => server.stop(),
  };
}
