import { readFileSync } from 'node:fs';
import type { Template } from 'aws-cdk-lib/assertions';

/** Reading a synthesized CloudFormation template in the CDK tests (test/aws/cdk*.test.ts). */

type Json = Record<string, unknown>;

/** This repository's root. */
export const REPO_ROOT = new URL('..', import.meta.url).pathname;
/** The context of cdk.json (its feature flags): what `cdk synth` gives an app here. */
export const CDK_CONTEXT = JSON.parse(readFileSync(new URL('../cdk.json', import.meta.url), 'utf8'))
  .context as Record<string, unknown>;
/** The account and region the CDK tests' stacks are made for. */
export const TEST_ENV = { account: '123456789012', region: 'eu-west-1' };

export const asList = <T>(value: T | T[]): T[] => (Array.isArray(value) ? value : [value]);

/** `Fn::Join`, `Ref` and `Fn::GetAtt` rendered as text (`<AWS::AccountId>`, `<Table.Arn>`), to compare ARNs. */
export function flatten(value: unknown): string {
  if (typeof value === 'string') return value;
  const o = value as Json;
  if (o.Ref !== undefined) return `<${String(o.Ref)}>`;
  if (o['Fn::GetAtt'] !== undefined) return `<${(o['Fn::GetAtt'] as string[]).join('.')}>`;
  if (o['Fn::Join'] !== undefined) {
    const [sep, parts] = o['Fn::Join'] as [string, unknown[]];
    return parts.map(flatten).join(sep);
  }
  return JSON.stringify(value);
}

/** The logical ids a resource refers to (Ref, Fn::GetAtt, DependsOn). */
export function referencesOf(resource: Json): Set<string> {
  const found = new Set<string>(asList((resource.DependsOn as string | string[] | undefined) ?? []));
  const walk = (value: unknown): void => {
    if (Array.isArray(value)) value.forEach(walk);
    else if (value && typeof value === 'object') {
      const o = value as Json;
      if (typeof o.Ref === 'string') found.add(o.Ref);
      const getAtt = o['Fn::GetAtt'] as string[] | undefined;
      if (getAtt?.[0]) found.add(getAtt[0]);
      Object.values(o).forEach(walk);
    }
  };
  walk(resource.Properties);
  return found;
}

/** A dependency cycle among the template's resources (CloudFormation refuses the stack), if any. */
export function dependencyCycle(template: Template): string[] | undefined {
  const resources = template.toJSON().Resources as Record<string, Json>;
  const state = new Map<string, 'visiting' | 'done'>();
  const path: string[] = [];
  const visit = (id: string): string[] | undefined => {
    if (state.get(id) === 'done' || !resources[id]) return undefined;
    if (state.get(id) === 'visiting') return [...path.slice(path.indexOf(id)), id];
    state.set(id, 'visiting');
    path.push(id);
    for (const ref of referencesOf(resources[id] as Json)) {
      const cycle = visit(ref);
      if (cycle) return cycle;
    }
    path.pop();
    state.set(id, 'done');
    return undefined;
  };
  for (const id of Object.keys(resources)) {
    const cycle = visit(id);
    if (cycle) return cycle;
  }
  return undefined;
}
