import { readFile } from 'node:fs/promises';
import { request as httpRequest } from 'node:http';
import { resolve } from 'node:path';
import { z } from 'zod';
import { openConnection, type PoolConnection, type PoolTarget } from '../client/connection.ts';
import { systemClock } from '../shared/core/clock.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import { BackingRecord, NodeRecord } from '../shared/core/records.ts';
import { configHash, type EmbeddedInfo } from '../shared/runtime/embeddedInfo.ts';
import { OperatorAnswer, type OperatorCall } from '../shared/runtime/operatorEndpoint.ts';
import { consoleLog } from './consoleLog.ts';
import { CliError } from './errors.ts';
import { printError } from './output.ts';

/**
 * A connection to a running pool as the CLI's commands use it: the client library's (client/connection.ts:
 * the store for reads, the request queue for messages), and the operator verbs, which only the CLI has.
 */
export interface PoolClient extends PoolConnection {
  /** The operator verbs (hold, drain, reap), done with the pool's configuration. */
  operator(): Promise<Operator>;
}

/** A reaper run's report as the CLI reads it (the pool's ReapReport; other fields are passed through). */
export const ReapReportJson = z.looseObject({
  retired: z.array(z.string()),
  stopped: z.array(z.string()),
  failed: z.array(z.string()),
  moved: z.number(),
  orphans: z.array(z.string()),
  reclaimedSlots: z.number(),
  reclaimedPlaces: z.number(),
  conflicts: z.number(),
  errors: z.array(z.string()),
});
export type ReapReportJson = z.infer<typeof ReapReportJson>;

/**
 * What the operator verbs do. Against an embedded pool each is run by the running `metastatic dev`
 * (its operator endpoint): the CLI never starts a backing process, and acts with the configuration dev
 * started with. Against a stack, here, with the configuration given (--stack-config): EC2 instances have
 * no parent process on this machine.
 */
export interface Operator {
  hold(nodeId: string): Promise<NodeRecord>;
  drain(backingId: string): Promise<BackingRecord>;
  reap(): Promise<ReapReportJson>;
}

/** Where the CLI finds the pool: an embedded pool's state dir, or a deployed stack (--stack). */
export interface Target {
  readonly stateDir: string;
  readonly stack?: string;
  readonly region?: string;
  /** The pool's configuration, needed by operator verbs against a deployed stack. */
  readonly config?: string;
}

/** The client library's target for the CLI's. */
export function poolTarget(t: Target): PoolTarget {
  return t.stack ? { stack: t.stack, ...(t.region ? { region: t.region } : {}) } : { stateDir: t.stateDir };
}

export async function connect(target: Target | string): Promise<PoolClient> {
  const t: Target = typeof target === 'string' ? { stateDir: target } : target;
  const connection = await openConnection(poolTarget(t));
  return { ...connection, operator: () => operatorOf(connection, t) };
}

/**
 * Against an embedded pool, the running `metastatic dev` does the work (its operator endpoint). Against a
 * stack, this process, with the configuration given (--stack-config) and the stack's outputs.
 */
async function operatorOf(connection: PoolConnection, t: Target): Promise<Operator> {
  if (connection.pool.kind === 'embedded') {
    const info = connection.pool.info;
    await checkConfiguration(info, t.config);
    const call = (c: OperatorCall) => callPool(info, c);
    return {
      hold: async (id) => NodeRecord.parse(await call({ verb: 'hold', id })),
      drain: async (id) => BackingRecord.parse(await call({ verb: 'drain', id })),
      reap: async () => ReapReportJson.parse(await call({ verb: 'reap' })),
    };
  }
  if (!t.config) {
    throw new CliError('operator verbs against a stack need its configuration: pass --stack-config FILE', 2);
  }
  const info = connection.pool.info;
  const config = await loadConfig(t.config);
  const [{ awsContext }, { holdNode, drainBacking }, { reap }] = await Promise.all([
    import('../shared/runtime/awsContext.ts'),
    import('../shared/usecases/reap/operator.ts'),
    import('../shared/usecases/reap/reap.ts'),
  ]);
  const context = awsContext({
    config,
    store: connection.store,
    region: info.region,
    poolId: info.poolId,
    eventBusName: info.eventBusName,
    clock: systemClock,
    log: consoleLog('warn'),
  });
  return {
    hold: (id) => holdNode(context, id),
    drain: (id) => drainBacking(context, id),
    reap: async () => ReapReportJson.parse(await reap(context)),
  };
}

/**
 * The configuration an operator verb acts with is the running pool's. A file given to the verb
 * (--stack-config) must be that one, or the verb is refused, naming both; the pool's own file edited
 * since it started is only noted (the pool acts with what it read at start, and so does the verb).
 */
async function checkConfiguration(info: EmbeddedInfo, given: string | undefined): Promise<void> {
  const poolFile = info.configPath ?? 'the configuration it started with';
  const hashOf = async (file: string) => configHash(await readFile(file, 'utf8'));
  if (given !== undefined) {
    let same: boolean;
    try {
      same = info.configHash !== undefined && (await hashOf(given)) === info.configHash;
    } catch (err) {
      throw new CliError(`cannot read ${given}: ${(err as Error).message}`, 2);
    }
    if (!same) {
      throw new CliError(
        `${resolve(given)} is not the configuration the running pool uses (${poolFile}, as it was when ` +
          "the pool started): operator verbs act with the running pool's configuration. Leave out " +
          '--stack-config, or restart `metastatic dev` with this file.',
        2,
      );
    }
    return;
  }
  if (info.configPath === undefined || info.configHash === undefined) return;
  const now = await hashOf(info.configPath).catch(() => undefined);
  if (now !== info.configHash) {
    printError(
      `metastatic: note: ${info.configPath} changed since the pool started; the pool, and this ` +
        'command, act with the configuration it started with (restart `metastatic dev` to apply the file)',
    );
  }
}

/** Posts an operator call to the running pool and waits for its answer (as long as the verb runs). */
async function callPool(info: EmbeddedInfo, call: OperatorCall): Promise<unknown> {
  if (!info.operatorUrl || !info.operatorToken) {
    throw new CliError(
      `the pool running on ${info.stateDir} (pid ${info.pid}) is of an earlier version that does not run ` +
        'operator verbs itself; restart it (`metastatic dev`)',
    );
  }
  const body = JSON.stringify(call);
  const { status, text } = await new Promise<{ status: number; text: string }>((done, failed) => {
    const req = httpRequest(
      info.operatorUrl as string,
      {
        method: 'POST',
        headers: {
          authorization: `Bearer ${info.operatorToken}`,
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(body),
        },
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          text += chunk;
        });
        res.on('end', () => done({ status: res.statusCode ?? 0, text }));
        res.on('error', failed);
      },
    );
    req.on('error', failed);
    req.end(body);
  }).catch((err: Error) => {
    throw new CliError(
      `cannot reach the running pool (pid ${info.pid}) at ${info.operatorUrl}: ${err.message}`,
    );
  });
  let answer: OperatorAnswer;
  try {
    answer = OperatorAnswer.parse(JSON.parse(text));
  } catch {
    throw new CliError(
      `the running pool answered ${call.verb} with HTTP ${status} and no answer it could read`,
    );
  }
  if (answer.ok) return answer.result;
  throw new CliError(
    answer.permanent ? answer.message : `the pool could not ${call.verb}: ${answer.message}`,
  );
}

async function loadConfig(path: string): Promise<ResolvedConfig> {
  const { formatConfigErrors, loadConfigFile } = await import('../shared/config/load.ts');
  const loaded = await loadConfigFile(path);
  if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
  return loaded.config;
}
