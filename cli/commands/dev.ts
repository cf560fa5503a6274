import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { cliCommand } from '../../client/cliCommand.ts';
import { GithubBridge } from '../../client/githubBridge.ts';
import { PoolClient } from '../../client/poolClient.ts';
import { formatConfigErrors, parseConfig } from '../../shared/config/load.ts';
import type { Log } from '../../shared/core/log.ts';
import type { GithubSettings } from '../../shared/core/model.ts';
import { configHash } from '../../shared/runtime/embeddedInfo.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { consoleLog, type Level } from '../consoleLog.ts';
import { CliError } from '../errors.ts';
import { whenOutputCloses } from '../output.ts';
import { packageRoot } from '../packageInfo.ts';
import { terminalText } from '../terminal.ts';

const exampleConfig = join(packageRoot(), 'examples', 'local.yaml');

export interface DevOptions {
  readonly config?: string;
  readonly reaperInterval: number;
  readonly logLevel: Level;
  readonly logJson?: boolean;
}

/** `metastatic dev`: runs the pool on this machine until SIGINT or SIGTERM. */
export async function dev(stateDir: string, opts: DevOptions): Promise<void> {
  const configPath = resolve(
    opts.config ?? (existsSync('metastatic.yaml') ? 'metastatic.yaml' : exampleConfig),
  );
  // Read once: the pool acts with this text until it stops, and dev.json records its hash, so that an
  // operator verb can tell the user when the file was edited since (it is not read again).
  let text: string;
  try {
    text = await readFile(configPath, 'utf8');
  } catch (err) {
    throw new CliError(`cannot read the configuration ${configPath}: ${(err as Error).message}`);
  }
  const loaded = parseConfig(text, configPath);
  if (!loaded.ok) throw new CliError(`invalid configuration:\n${formatConfigErrors(loaded.errors)}`);
  const log = consoleLog(opts.logLevel, opts.logJson);
  for (const n of loaded.config.notices) log.warn(`${configPath}: ${n.path}: ${n.message}`);
  const pool = await EmbeddedPool.start({
    config: loaded.config,
    configPath,
    configHash: configHash(text),
    stateDir,
    reaperInterval: opts.reaperInterval,
    log,
  });
  const github = await startGithub(pool, stateDir, loaded.config.github, log);
  const labels = [...loaded.config.metastaticLabelNames].join(', ');
  process.stderr.write(
    [
      `metastatic pool running (config ${configPath})`,
      `  state dir       ${pool.info.stateDir}`,
      `  DynamoDB        ${pool.info.dynamodbEndpoint}  table ${pool.info.tableName}`,
      `  SQS             ${pool.info.sqsEndpoint}`,
      `  request queue   ${pool.info.requestQueueUrl}`,
      `  labels          ${labels}`,
      `  reaper every    ${opts.reaperInterval}s`,
      ...(github ? [`  GitHub webhook  ${github.url}  (workflow_job events; docs/github.md)`] : []),
      `Try it from another shell:  ${cliCommand()} request ${[...loaded.config.metastaticLabelNames][0] ?? 'LABEL'} --wait`,
      'Ctrl-C stops the pool and every backing process.',
      '',
    ]
      .map(terminalText)
      .join('\n'),
  );
  await new Promise<void>((done) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      process.stderr.write(`\n${signal}: stopping the pool...\n`);
      (github?.close() ?? Promise.resolve())
        .then(() => pool.stop())
        .then(done, (err) => {
          process.stderr.write(terminalText(`error while stopping: ${(err as Error).message}\n`));
          done();
        });
    };
    process.once('SIGINT', () => stop('SIGINT'));
    process.once('SIGTERM', () => stop('SIGTERM'));
    whenOutputCloses(() => stop('output closed'));
  });
  process.stderr.write('stopped.\n');
}

/**
 * The GitHub bridge (client/githubBridge.ts), when the configuration has an enabled `github` section: a
 * client of the pool like any other, started once the pool runs; its URL is printed and put in dev.json.
 */
async function startGithub(
  pool: EmbeddedPool,
  stateDir: string,
  settings: GithubSettings | undefined,
  log: Log,
): Promise<{ readonly url: string; close(): Promise<void> } | undefined> {
  if (!settings?.enabled) return undefined;
  const client = await PoolClient.connect({ stateDir });
  try {
    const bridge = await GithubBridge.start(settings, client, log);
    await pool.recordGithubWebhook(bridge.url);
    return { url: bridge.url, close: () => bridge.close().finally(() => client.close()) };
  } catch (err) {
    client.close();
    await pool.stop();
    throw new CliError(`github: ${(err as Error).message}`);
  }
}
