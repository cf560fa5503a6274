import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { FUNCTION_CONFIG_FILE } from '../../shared/runtime/functionConfig.ts';
import { STACK_OUTPUTS } from '../../shared/runtime/stackOutputs.ts';
import { RehearsalError } from './errors.ts';

/**
 * What the rehearsal reads from (and, for moto, changes in) the cloud assembly `cdk synth` wrote: the
 * stacks with their environments and templates, which of them hold a pool (the outputs MetastaticPool
 * publishes), the functions' code directories and the configuration shipped in them.
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

/** The pool configuration shipped with the functions (metastatic.yaml beside each bundle). */
export function shippedConfig(dir: string, template: Template): { text: string; files: string[] } {
  const files = functionCode(dir, template)
    .map((f) => join(f.codeDir, FUNCTION_CONFIG_FILE))
    .filter((f) => existsSync(f));
  const [first] = files;
  if (!first) throw new RehearsalError(`no function of the stack ships ${FUNCTION_CONFIG_FILE}`);
  return { text: readFileSync(first, 'utf8'), files };
}

/** Rewrites the configuration shipped with every function (0644, as the construct writes it). */
export function replaceShippedConfig(files: readonly string[], text: string): void {
  for (const file of files) {
    writeFileSync(file, text);
    chmodSync(file, 0o644);
  }
}

/**
 * moto's CloudFormation creates no `AWS::CloudWatch::Alarm` (it skips the type with a warning), then
 * refuses any `Fn::GetAtt` of one ("references undefined resource"): the pool's dashboard shows its
 * alarms by ARN. Each such reference becomes the ARN the alarm would have (a CloudWatch alarm's ARN is
 * `arn:<partition>:cloudwatch:<region>:<account>:alarm:<name>`; the name stands in as the logical id),
 * and a `Ref` the logical id. Only the rehearsal's copy of the template is changed. Returns how many
 * references were replaced.
 */
export function patchTemplateForMoto(template: Template): number {
  const alarms = new Set(
    Object.entries(template.Resources ?? {})
      .filter(([, r]) => r.Type === 'AWS::CloudWatch::Alarm')
      .map(([id]) => id),
  );
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
    if (typeof o.Ref === 'string' && alarms.has(o.Ref) && Object.keys(o).length === 1) {
      replaced++;
      return o.Ref;
    }
    return Object.fromEntries(Object.entries(o).map(([k, v]) => [k, visit(v)]));
  };
  for (const [id, resource] of Object.entries(template.Resources ?? {})) {
    if (!alarms.has(id)) (template.Resources as Json)[id] = visit(resource);
  }
  if (template.Outputs) template.Outputs = visit(template.Outputs) as Template['Outputs'];
  return replaced;
}

export function writeTemplate(stack: AssemblyStack): void {
  writeFileSync(stack.templateFile, JSON.stringify(stack.template, null, 1));
}
