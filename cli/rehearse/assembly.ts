import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, join } from 'node:path';
import { FUNCTION_CONFIG_FILE } from '../../shared/runtime/functionConfig.ts';
import { STACK_OUTPUTS } from '../../shared/runtime/stackOutputs.ts';
import { RehearsalError } from './errors.ts';

/**
 * What the rehearsal reads from the cloud assembly `cdk synth` wrote (and, for moto, changes in its
 * templates, never in the functions' code): the stacks with their environments and templates, which of
 * them hold a pool (the outputs MetastaticPool publishes), the functions' code directories, the
 * configuration shipped in them, and whether that code is what its asset hash names.
 */

type Json = Record<string, unknown>;

export interface Template {
  Resources?: Record<string, { Type: string; Properties?: Json }>;
  Outputs?: Record<string, { Value: unknown }>;
  [key: string]: unknown;
}

export interface AssemblyStack {
  /** The artifact id (what `cdk deploy` is given). */
  readonly id: string;
  /** The CloudFormation stack name. */
  readonly stackName: string;
  /** Undefined for an environment-agnostic stack. */
  readonly account?: string;
  readonly region?: string;
  readonly templateFile: string;
  readonly template: Template;
}

interface Manifest {
  artifacts?: Record<
    string,
    {
      type: string;
      environment?: string;
      displayName?: string;
      properties?: { templateFile?: string; stackName?: string };
    }
  >;
}

/** The stacks at the top of an assembly (stacks inside a Stage are not looked at). */
export function readAssembly(dir: string): AssemblyStack[] {
  const manifestFile = join(dir, 'manifest.json');
  if (!existsSync(manifestFile)) {
    throw new RehearsalError(`${dir} is not a cloud assembly (no manifest.json): give the app's cdk.out`);
  }
  const manifest = JSON.parse(readFileSync(manifestFile, 'utf8')) as Manifest;
  const stacks: AssemblyStack[] = [];
  for (const [id, artifact] of Object.entries(manifest.artifacts ?? {})) {
    if (artifact.type !== 'aws:cloudformation:stack' || !artifact.properties?.templateFile) continue;
    const env = /^aws:\/\/([^/]+)\/(.+)$/.exec(artifact.environment ?? '');
    const account = env?.[1] && env[1] !== 'unknown-account' ? env[1] : undefined;
    const region = env?.[2] && env[2] !== 'unknown-region' ? env[2] : undefined;
    const templateFile = join(dir, artifact.properties.templateFile);
    stacks.push({
      id,
      stackName: artifact.properties.stackName ?? artifact.displayName ?? id,
      ...(account ? { account } : {}),
      ...(region ? { region } : {}),
      templateFile,
      template: JSON.parse(readFileSync(templateFile, 'utf8')) as Template,
    });
  }
  return stacks;
}

/** Whether a stack holds a pool: it has every output MetastaticPool publishes. */
export function holdsPool(stack: AssemblyStack): boolean {
  const outputs = stack.template.Outputs ?? {};
  return Object.values(STACK_OUTPUTS).every((key) => key in outputs);
}

/**
 * The one stack of the app to rehearse: the one named, or the only one that holds a pool. Errors name the
 * stacks there are.
 */
export function choosePoolStack(stacks: readonly AssemblyStack[], wanted?: string): AssemblyStack {
  const pools = stacks.filter(holdsPool);
  const names = (list: readonly AssemblyStack[]) => list.map((s) => s.stackName).join(', ') || 'none';
  if (wanted !== undefined) {
    const found = stacks.find((s) => s.stackName === wanted || s.id === wanted);
    if (!found) throw new RehearsalError(`the app has no stack ${wanted} (its stacks: ${names(stacks)})`);
    if (!holdsPool(found)) {
      throw new RehearsalError(
        `stack ${wanted} holds no MetastaticPool that publishes its outputs (stacks that do: ${names(pools)})`,
      );
    }
    return found;
  }
  const [only, ...more] = pools;
  if (!only) {
    throw new RehearsalError(
      `the app has no stack with a MetastaticPool that publishes its outputs (its stacks: ${names(stacks)})`,
    );
  }
  if (more.length > 0) {
    throw new RehearsalError(`the app has several pool stacks (${names(pools)}): name the one to rehearse`);
  }
  return only;
}

/** A function of the template and its code directory in the assembly (`asset.<hash>`). */
export interface FunctionCode {
  readonly logicalId: string;
  readonly codeDir: string;
}

/** The functions whose code is an asset of this assembly. */
export function functionCode(dir: string, template: Template): FunctionCode[] {
  const out: FunctionCode[] = [];
  for (const [logicalId, resource] of Object.entries(template.Resources ?? {})) {
    if (resource.Type !== 'AWS::Lambda::Function') continue;
    const key = (resource.Properties?.Code as { S3Key?: unknown } | undefined)?.S3Key;
    if (typeof key !== 'string') continue;
    const codeDir = join(dir, `asset.${key.replace(/\.zip$/, '')}`);
    if (existsSync(codeDir)) out.push({ logicalId, codeDir });
  }
  return out;
}

/** The pool configuration shipped with the functions (metastatic.yaml beside each bundle), never changed here. */
export function shippedConfig(dir: string, template: Template): { text: string; files: string[] } {
  const files = functionCode(dir, template)
    .map((f) => join(f.codeDir, FUNCTION_CONFIG_FILE))
    .filter((f) => existsSync(f));
  const [first] = files;
  if (!first) throw new RehearsalError(`no function of the stack ships ${FUNCTION_CONFIG_FILE}`);
  return { text: readFileSync(first, 'utf8'), files };
}

/** What verifyAssetHashes found. */
export interface AssetCheck {
  /** The code directories (`asset.<hash>`) whose content hashes to their name. */
  readonly verified: readonly string[];
  /** Those that could not be checked or do not match, each with the reason. */
  readonly problems: readonly string[];
}

/**
 * Checks that each code directory is what `cdk deploy` uploads under its asset hash: the functions'
 * assets are hashed by their output (AssetHashType.OUTPUT, lib/poolFunction.ts), CDK's fingerprint of
 * the directory, so a directory whose content still fingerprints to the hash in its name is byte for
 * byte what synth wrote and what CDK publishes. The fingerprint is computed with the app's aws-cdk-lib
 * (else this package's), as CDK computes it; without one the check is reported as not made.
 */
export function verifyAssetHashes(codeDirs: readonly string[], searchFrom: readonly string[]): AssetCheck {
  let fileSystem: { fingerprint(dir: string, options: object): string } | undefined;
  for (const base of searchFrom) {
    try {
      fileSystem = (
        createRequire(join(base, 'noop.js'))('aws-cdk-lib/core') as { FileSystem: typeof fileSystem }
      ).FileSystem;
      break;
    } catch {
      // not installed there
    }
  }
  const verified: string[] = [];
  const problems: string[] = [];
  for (const dir of [...new Set(codeDirs)]) {
    const name = basename(dir);
    const hash = /^asset\.([0-9a-f]{64})$/.exec(name)?.[1];
    if (!fileSystem) {
      problems.push(`${name}: not checked (no aws-cdk-lib found to compute the fingerprint)`);
    } else if (hash === undefined) {
      problems.push(`${name}: not an asset directory named by its hash`);
    } else {
      // As AssetStaging fingerprints a bundled asset's output (its default exclusion included).
      const fingerprint = fileSystem.fingerprint(dir, { exclude: ['.is_custom_resource'] });
      if (fingerprint === hash) verified.push(name);
      else problems.push(`${name}: its content hashes to ${fingerprint}, not to its name`);
    }
  }
  return { verified, problems };
}

/**
 * moto's CloudFormation creates no `AWS::CloudWatch::Alarm` (it skips the type with a warning), then
 * refuses any `Fn::GetAtt` of one ("references undefined resource"): the pool's dashboard shows its
 * alarms by ARN. Each such reference becomes the ARN the alarm would have (a CloudWatch alarm's ARN is
 * `arn:<partition>:cloudwatch:<region>:<account>:alarm:<name>`; the name stands in as the logical id),
 * and a `Ref` the logical id. Nor does it create an `AWS::Lambda::Url` (the github function's webhook
 * URL): its `FunctionUrl` becomes REHEARSAL_NO_FUNCTION_URL. Only the rehearsal's copy of the template
 * is changed. Returns how many references were replaced.
 */
/** What a rehearsal's `GithubWebhookUrl` output says: moto makes no function URL, so there is none. */
export const REHEARSAL_NO_FUNCTION_URL = 'none in a rehearsal (moto creates no function URL)';

export function patchTemplateForMoto(template: Template): number {
  const ofType = (type: string) =>
    new Set(
      Object.entries(template.Resources ?? {})
        .filter(([, r]) => r.Type === type)
        .map(([id]) => id),
    );
  const alarms = ofType('AWS::CloudWatch::Alarm');
  const urls = ofType('AWS::Lambda::Url');
  let replaced = 0;
  const visit = (value: unknown): unknown => {
    if (Array.isArray(value)) return value.map(visit);
    if (value === null || typeof value !== 'object') return value;
    const o = value as Json;
    const getAtt = o['Fn::GetAtt'];
    if (Array.isArray(getAtt) && alarms.has(getAtt[0] as string) && getAtt[1] === 'Arn') {
      replaced++;
      return {
        'Fn::Join': [
          '',
          [
            'arn:',
            { Ref: 'AWS::Partition' },
            ':cloudwatch:',
            { Ref: 'AWS::Region' },
            ':',
            { Ref: 'AWS::AccountId' },
            `:alarm:${getAtt[0] as string}`,
          ],
        ],
      };
    }
    if (Array.isArray(getAtt) && urls.has(getAtt[0] as string) && getAtt[1] === 'FunctionUrl') {
      replaced++;
      return REHEARSAL_NO_FUNCTION_URL;
    }
    if (typeof o.Ref === 'string' && alarms.has(o.Ref) && Object.keys(o).length === 1) {
      replaced++;
      return o.Ref;
    }
    return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, visit(v)]));
  };
  for (const [id, resource] of Object.entries(template.Resources ?? {})) {
    if (!alarms.has(id) && !urls.has(id)) (template.Resources as Json)[id] = visit(resource);
  }
  if (template.Outputs) template.Outputs = visit(template.Outputs) as Template['Outputs'];
  return replaced;
}

export function writeTemplate(stack: AssemblyStack): void {
  writeFileSync(stack.templateFile, JSON.stringify(stack.template, null, 1));
}
