import { cpSync, existsSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CloudFormationClient } from '@aws-sdk/client-cloudformation';
import { EC2Client } from '@aws-sdk/client-ec2';
import {
  EventBridgeClient,
  ListTargetsByRuleCommand,
  RemoveTargetsCommand,
} from '@aws-sdk/client-eventbridge';
import { SQSClient } from '@aws-sdk/client-sqs';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import { packageRoot } from '../packageInfo.ts';
import {
  type AssemblyStack,
  type AssetCheck,
  choosePoolStack,
  patchTemplateForMoto,
  readAssembly,
  shippedConfig,
  verifyAssetHashes,
  writeTemplate,
} from './assembly.ts';
import { findCdkCli, runCdk } from './cdkCli.ts';
import { type DeployedPool, describePool } from './deployed.ts';
import { RehearsalError } from './errors.ts';
import { deleteLeftover, LEFTOVER_STATES, stackStatus } from './leftoverStacks.ts';
import { motoClientConfig, motoEnv } from './motoEnv.ts';
import { connectMotoServer, type MotoServer, motoAccount, startMotoServer } from './motoServer.ts';
import { awsLabelSettings, createNetwork, type RehearsalNetwork, reachabilityWarnings } from './network.ts';
import type { RehearsalEvent, RehearsalOptions } from './rehearsalOptions.ts';

const TOOLKIT_STACK = 'CDKToolkit';

/** The SDK clients of the rehearsal, all pointed at moto. */
export interface RehearsalClients {
  readonly ec2: EC2Client;
  readonly events: EventBridgeClient;
  readonly sqs: SQSClient;
  readonly cfn: CloudFormationClient;
}

/** A CDK app deployed to moto: what the rehearsal then runs (rehearsal.ts). */
export interface DeployedApp {
  readonly moto: MotoServer;
  readonly account: string;
  readonly region: string;
  /** A temporary directory (the assembly is in it), removed when the rehearsal closes. */
  readonly workDir: string;
  readonly assemblyDir: string;
  readonly stack: AssemblyStack;
  readonly config: ResolvedConfig;
  readonly network: RehearsalNetwork;
  readonly pool: DeployedPool;
  /** Whether the functions' code is what `cdk deploy` uploads under its asset hash (verifyAssetHashes). */
  readonly assets: AssetCheck;
  readonly cdkCli: string;
  readonly clients: RehearsalClients;
}

/**
 * Starts moto (or checks the one given), synthesizes the app (or copies its assembly), makes in moto what
 * its configuration names, patches the templates for moto (never the functions' code), bootstraps and
 * deploys as `cdk deploy` would, describes the pool deployed and checks its functions' code against
 * their asset hashes. The reaper schedule's target is removed: moto would fail every
 * PutEvents on it, and the rehearsal plays the schedule itself. On failure, moto (when started here) is
 * stopped and the work directory removed.
 */
export async function deployApp(options: RehearsalOptions): Promise<DeployedApp> {
  const emit = (e: RehearsalEvent) => options.onEvent?.(e);
  const cwd = resolve(options.cwd);
  // The app's own CDK CLI, else this package's (a clone of the repository has it in its dev dependencies).
  const cdkCli = findCdkCli([cwd, packageRoot()]);
  const appDir = options.app && existsSync(resolve(cwd, options.app)) ? resolve(cwd, options.app) : undefined;
  if (appDir && !statSync(appDir).isDirectory()) {
    throw new RehearsalError(
      `--app ${options.app} is a file: give the command that runs it (e.g. "node ${options.app}")`,
    );
  }
  if (!options.app && !existsSync(join(cwd, 'cdk.json'))) {
    throw new RehearsalError(
      `no CDK app in ${cwd}: run this in your CDK app's directory (where its cdk.json is), or give --app "<command>" (e.g. --app "npx tsx bin/app.ts") or --app <cdk.out directory>`,
    );
  }

  let started = Date.now();
  let moto = options.endpoint
    ? await connectMotoServer(options.endpoint)
    : await startMotoServer({
        ownGroup: true,
        ...(options.port !== undefined ? { port: options.port } : {}),
      });
  emit({
    type: 'step',
    step: 'moto',
    message: moto.owned
      ? `moto_server started on ${moto.endpoint}`
      : `using the moto_server at ${moto.endpoint}`,
    ms: Date.now() - started,
  });
  const workDir = mkdtempSync(join(tmpdir(), 'metastatic-rehearse-'));
  const assemblyDir = join(workDir, 'cdk.out');
  try {
    // The app, synthesized as `cdk synth` would (with moto's account as the default one) or copied.
    started = Date.now();
    const baseRegion = options.context?.region ?? 'us-east-1';
    const cdkEnv = (region: string) => motoEnv(moto.endpoint, region, options.childEnv ?? {});
    if (appDir) {
      cpSync(appDir, assemblyDir, { recursive: true });
      emit({
        type: 'step',
        step: 'synth',
        message: `using the assembly in ${appDir}`,
        ms: Date.now() - started,
      });
    } else {
      const context = Object.entries(options.context ?? {}).flatMap(([k, v]) => ['-c', `${k}=${v}`]);
      await runCdk(
        cdkCli,
        ['synth', '-q', '-o', assemblyDir, ...(options.app ? ['--app', options.app] : []), ...context],
        { cwd, env: cdkEnv(baseRegion) },
      ).catch((err: Error) => {
        throw new RehearsalError(`the app does not synthesize: ${err.message}`, { cause: err });
      });
      emit({
        type: 'step',
        step: 'synth',
        message: `synthesized the app into ${assemblyDir}`,
        ms: Date.now() - started,
      });
    }
    const stacks = readAssembly(assemblyDir);
    const stack = choosePoolStack(stacks, options.stack);
    const shipped = shippedConfig(assemblyDir, stack.template);
    const inVpc = Object.values(stack.template.Resources ?? {}).some(
      (r) => r.Type === 'AWS::Lambda::Function' && r.Properties?.VpcConfig !== undefined,
    );
    const config = parseConfigOrThrow(shipped.text, 'metastatic.yaml', { functionsInVpc: inVpc });
    const region = stack.region ?? awsLabelSettings(config)[0]?.region ?? baseRegion;

    // The account moto answers for must be the stack's (CDK refuses to deploy a stack of another).
    let account = await motoAccount(moto.endpoint, region);
    if (stack.account && stack.account !== account) {
      if (!moto.owned) {
        throw new RehearsalError(
          `stack ${stack.stackName} is for account ${stack.account}, and the moto_server at ${moto.endpoint} ` +
            `answers for ${account}: start it with MOTO_ACCOUNT_ID=${stack.account}, or leave out --endpoint`,
        );
      }
      await moto.stop();
      moto = await startMotoServer({ ownGroup: true, port: moto.port, account: stack.account });
      account = stack.account;
    }
    const clientConfig = { ...motoClientConfig(moto.endpoint, region) };
    const clients: RehearsalClients = {
      ec2: new EC2Client(clientConfig),
      events: new EventBridgeClient(clientConfig),
      sqs: new SQSClient({ ...clientConfig, useQueueUrlAsEndpoint: false }),
      cfn: new CloudFormationClient(clientConfig),
    };

    // What the configuration names in the account, made in moto. The functions' code is left as synth
    // wrote it: their EC2 calls go through the rehearsal's proxy, which translates the ids (ec2Proxy.ts).
    started = Date.now();
    const network = await createNetwork(clients.ec2, config);
    emit({
      type: 'step',
      step: 'network',
      message:
        `made in moto what the configuration names: ${network.made.join('; ') || 'nothing'}` +
        (network.made.length > 0
          ? " (moto's own ids: the functions' EC2 calls go through the rehearsal's EC2 proxy, which names them by your configuration's ids)"
          : ''),
      ms: Date.now() - started,
    });
    for (const warning of reachabilityWarnings(config, inVpc)) emit({ type: 'warning', message: warning });

    for (const s of stacks) {
      if (patchTemplateForMoto(s.template) > 0) writeTemplate(s);
    }

    // Bootstrap (unless moto has it already) and deploy, leftovers of a failed attempt deleted first.
    started = Date.now();
    const env = cdkEnv(region);
    const toolkit = await stackStatus(clients.cfn, TOOLKIT_STACK);
    if (toolkit === undefined || !toolkit.endsWith('_COMPLETE') || LEFTOVER_STATES.has(toolkit)) {
      await deleteLeftover(clients.cfn, TOOLKIT_STACK);
      await runCdk(cdkCli, ['bootstrap', `aws://${account}/${region}`, '--app', assemblyDir], { cwd, env });
      emit({
        type: 'step',
        step: 'bootstrap',
        message: `bootstrapped aws://${account}/${region}`,
        ms: Date.now() - started,
      });
    }
    started = Date.now();
    await deleteLeftover(clients.cfn, stack.stackName);
    await runCdk(
      cdkCli,
      ['deploy', stack.id, '--app', assemblyDir, '--method=direct', '--require-approval', 'never'],
      { cwd, env },
    );
    emit({
      type: 'step',
      step: 'deploy',
      message: `deployed stack ${stack.stackName}`,
      ms: Date.now() - started,
    });

    const pool = await describePool(
      { ...clients, endpoint: moto.endpoint, region },
      stack.stackName,
      assemblyDir,
      stack.template,
    );
    // The code the functions run: what cdk deploy uploaded under each asset's hash, unchanged.
    const assets = verifyAssetHashes(
      Object.values(pool.functions).map((f) => f.codeDir),
      [cwd, packageRoot()],
    );
    for (const problem of assets.problems) {
      emit({
        type: 'warning',
        message: `the functions' code is not verified as what cdk deploy uploads: ${problem}`,
      });
    }
    // The schedule is played here; moto would fail every PutEvents on its Lambda target.
    const targets = await clients.events.send(new ListTargetsByRuleCommand({ Rule: pool.schedule.ruleName }));
    const ids = (targets.Targets ?? []).map((t) => t.Id as string);
    if (ids.length > 0)
      await clients.events.send(new RemoveTargetsCommand({ Rule: pool.schedule.ruleName, Ids: ids }));
    return {
      moto,
      account,
      region,
      workDir,
      assemblyDir,
      stack,
      config,
      network,
      pool,
      assets,
      cdkCli,
      clients,
    };
  } catch (err) {
    await moto.stop();
    rmSync(workDir, { recursive: true, force: true });
    throw err;
  }
}
