/**
 * Reading a configuration file: YAML -> schema (schema.ts) -> cross-field rules and resolution
 * (resolve.ts). Every error found is reported, each with its YAML path and, where the document allows,
 * the 1-based line and column it refers to.
 */
import { readFile } from 'node:fs/promises';
import { type Document, isMap, isNode, isScalar, isSeq, LineCounter, parseDocument, visit } from 'yaml';
import type { z } from 'zod';
import type { ResolvedConfig } from '../core/model.ts';
import { formatPath, type PathIssue, type PathSegment } from '../fields/paths.ts';
import type { FunctionsNetwork } from '../providers/aws/networkRules.ts';
import type { BackingDriver } from '../providers/driver.ts';
import { BACKING_DRIVERS, DRIVERS } from '../providers/drivers.ts';
import { resolveConfig } from './resolve.ts';
import { checkConfigRules } from './rules.ts';
import { type ConfigFile, configSchema, knownKeysAt } from './schema.ts';

export interface ConfigError {
  /** The file the error is in (as given to parseConfig / loadConfigFile). */
  readonly file?: string;
  /** YAML path, e.g. `providers[1].pools[0].labels[0].max-parallel-jobs`; '' for the whole document. */
  readonly path: string;
  /** 1-based. */
  readonly line?: number;
  /** 1-based. */
  readonly column?: number;
  readonly message: string;
}

export type ConfigResult =
  | { readonly ok: true; readonly config: ResolvedConfig; readonly raw: ConfigFile }
  | { readonly ok: false; readonly errors: ConfigError[] };

/** Thrown by the *OrThrow helpers; `message` is the formatted error list. */
export class ConfigInvalidError extends Error {
  readonly errors: readonly ConfigError[];

  constructor(errors: readonly ConfigError[]) {
    super(`invalid configuration:\n${formatConfigErrors(errors)}`);
    this.name = 'ConfigInvalidError';
    this.errors = errors;
  }
}

/** One line per error: `<file>:<line>:<col>: <path>: <message>`. */
export function formatConfigErrors(errors: readonly ConfigError[]): string {
  return errors
    .map((error) => {
      let where = error.file ?? '<config>';
      if (error.line !== undefined) where += `:${error.line}:${error.column ?? 1}`;
      return error.path === '' ? `${where}: ${error.message}` : `${where}: ${error.path}: ${error.message}`;
    })
    .join('\n');
}

/**
 * `network`: where the functions run, for the rules that depend on it (networkRules.ts: synth and
 * `metastatic validate` give it; without it those rules are not checked).
 */
export function parseConfig(text: string, fileName: string, network?: FunctionsNetwork): ConfigResult {
  const lineCounter = new LineCounter();
  // Duplicate keys are found below, in linear time: yaml's own check compares each key of a mapping with
  // every earlier one (half a minute for a mapping of 40,000 keys).
  const doc = parseDocument(text, { lineCounter, prettyErrors: false, uniqueKeys: false });
  const syntaxErrors = [
    ...doc.errors.map((error) => ({ offset: error.pos[0], message: error.message })),
    ...duplicateKeyOffsets(doc).map((offset) => ({ offset, message: 'Map keys must be unique' })),
  ].sort((a, b) => a.offset - b.offset);
  if (syntaxErrors.length > 0) {
    return {
      ok: false,
      errors: syntaxErrors.map((error) => {
        const { line, col } = lineCounter.linePos(error.offset);
        return {
          file: fileName,
          path: '',
          line,
          column: col,
          message: `YAML syntax error: ${error.message}`,
        };
      }),
    };
  }

  let data: unknown;
  try {
    data = doc.toJS({ maxAliasCount: 1000 });
  } catch (error) {
    return { ok: false, errors: [{ file: fileName, path: '', message: `invalid YAML: ${String(error)}` }] };
  }

  const issues: PathIssue[] = [];
  const parsed = configSchema.safeParse(data, { reportInput: true, error: fallbackPhrase });
  if (!parsed.success) {
    for (const issue of parsed.error.issues) issues.push(...describeIssue(issue, data));
  }
  issues.push(...checkConfigRules(data));
  const warnings: PathIssue[] = [];
  for (const driver of Object.values<BackingDriver>(BACKING_DRIVERS)) {
    const found = driver.deploymentRules?.(data, network);
    issues.push(...(found?.errors ?? []));
    warnings.push(...(found?.warnings ?? []));
  }

  if (!parsed.success || issues.length > 0) {
    const seen = new Set<string>();
    const errors: ConfigError[] = [];
    for (const issue of issues) {
      const path = formatPath(issue.path);
      const key = `${path}\n${issue.message}`;
      if (seen.has(key)) continue;
      seen.add(key);
      const pos = locate(doc, lineCounter, issue);
      errors.push({ file: fileName, path, ...pos, message: issue.message });
    }
    // Document order; errors without a position last (Array.prototype.sort is stable).
    errors.sort(
      (a, b) =>
        (a.line ?? Number.POSITIVE_INFINITY) - (b.line ?? Number.POSITIVE_INFINITY) ||
        (a.column ?? 0) - (b.column ?? 0),
    );
    return { ok: false, errors };
  }
  // A backing driver's section passed that driver's schema: it has the shape every one has.
  const file = parsed.data as ConfigFile;
  const config = resolveConfig(file);
  if (warnings.length === 0) return { ok: true, config, raw: file };
  const notices = warnings.map((w) => ({ path: formatPath(w.path), message: w.message }));
  return { ok: true, config: { ...config, notices: [...config.notices, ...notices] }, raw: file };
}

/**
 * Where a mapping repeats a key: yaml's rule (`uniqueKeys: true`: scalar keys with the same value are the
 * same key; `1` and `"1"` are not), with a set per mapping instead of a comparison with every earlier key.
 */
function duplicateKeyOffsets(doc: Document): number[] {
  const offsets: number[] = [];
  visit(doc, {
    Map(_, map) {
      const seen = new Set<unknown>();
      for (const { key } of map.items) {
        if (!isScalar(key) || Number.isNaN(key.value)) continue; // NaN equals nothing, itself included
        if (seen.has(key.value)) offsets.push(key.range?.[0] ?? 0);
        else seen.add(key.value);
      }
    },
  });
  return offsets;
}

export async function loadConfigFile(path: string, network?: FunctionsNetwork): Promise<ConfigResult> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    const reason = error instanceof Error ? error.message : String(error);
    return {
      ok: false,
      errors: [{ file: path, path: '', message: `cannot read the configuration: ${reason}` }],
    };
  }
  return parseConfig(text, path, network);
}

export function parseConfigOrThrow(
  text: string,
  fileName: string,
  network?: FunctionsNetwork,
): ResolvedConfig {
  const result = parseConfig(text, fileName, network);
  if (!result.ok) throw new ConfigInvalidError(result.errors);
  return result.config;
}

export async function loadConfigOrThrow(path: string): Promise<ResolvedConfig> {
  const result = await loadConfigFile(path);
  if (!result.ok) throw new ConfigInvalidError(result.errors);
  return result.config;
}

// ---- zod issues -> messages -------------------------------------------------------------------------

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function valueAt(data: unknown, path: readonly PathSegment[]): unknown {
  let value = data;
  for (const segment of path) {
    if (typeof segment === 'number' ? Array.isArray(value) : isRecord(value)) {
      value = (value as Record<PropertyKey, unknown>)[segment];
    } else {
      return undefined;
    }
  }
  return value;
}

/** How a value reads in a message: `got 0`, `got "60"`, `got a list`... */
function describeValue(value: unknown): string {
  if (value === undefined) return 'nothing';
  if (value === null) return 'an empty value';
  if (Array.isArray(value)) return value.length === 0 ? 'an empty list' : 'a list';
  if (typeof value === 'object') return 'a mapping';
  if (typeof value === 'string') {
    const shown = value.length > 40 ? `${value.slice(0, 37)}...` : value;
    return JSON.stringify(shown);
  }
  return String(value);
}

/** `max-parallel-jobs: ` for a key, `configuration: ` for the root, nothing for a list item (the path says it). */
function subject(path: readonly PathSegment[]): string {
  const last = path[path.length - 1];
  if (last === undefined) return 'configuration: ';
  return typeof last === 'string' ? `${last}: ` : '';
}

function editDistance(a: string, b: string): number {
  const previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    let diagonal = previous[0] ?? 0;
    previous[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const above = previous[j] ?? 0;
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      previous[j] = Math.min(above + 1, (previous[j - 1] ?? 0) + 1, diagonal + cost);
      diagonal = above;
    }
  }
  return previous[b.length] ?? 0;
}

function suggestKey(key: string, known: readonly string[]): string | undefined {
  const normalized = key.toLowerCase().replace(/[_\s]/g, '-');
  const exact = known.find((candidate) => candidate === normalized);
  if (exact) return exact;
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const candidate of known) {
    const distance = editDistance(normalized, candidate);
    if (distance < bestDistance) {
      best = candidate;
      bestDistance = distance;
    }
  }
  return best !== undefined && bestDistance <= Math.min(2, Math.floor(best.length / 3)) ? best : undefined;
}

/** For checks schema.ts gives no phrase of its own (it should give one everywhere). */
function fallbackPhrase(issue: z.core.$ZodRawIssue): string {
  switch (issue.code) {
    case 'invalid_type':
      if (issue.expected === 'object' || issue.expected === 'record') return 'a mapping';
      if (issue.expected === 'array') return 'a list';
      return `a value of type ${issue.expected}`;
    case 'invalid_value':
      return `one of ${issue.values.map((value) => JSON.stringify(value)).join(', ')}`;
    default:
      return 'a valid value';
  }
}

function describeIssue(issue: z.core.$ZodIssue, data: unknown): PathIssue[] {
  const path = issue.path.filter((s): s is PathSegment => typeof s === 'string' || typeof s === 'number');
  const input = 'input' in issue ? issue.input : valueAt(data, path);

  if (issue.code === 'unrecognized_keys') {
    const known = knownKeysAt(path, data) ?? [];
    return issue.keys.map((key) => {
      const suggestion = suggestKey(key, known);
      return {
        path: [...path, key],
        atKey: true,
        message: `unknown key "${key}"${suggestion ? `; did you mean "${suggestion}"?` : ''}`,
      };
    });
  }

  const last = path[path.length - 1];
  const parent = valueAt(data, path.slice(0, -1));
  const missing = typeof last === 'string' && isRecord(parent) && !(last in parent);

  if (issue.code === 'invalid_union' && 'discriminator' in issue && issue.discriminator === 'driver') {
    const choices = DRIVERS.join(', ');
    if (missing) return [{ path, message: `missing required key "driver" (one of ${choices})` }];
    return [{ path, message: `driver must be one of ${choices}, got ${describeValue(valueAt(data, path))}` }];
  }

  if (missing) return [{ path, message: `missing required key "${last}"` }];

  // Every schema in schema.ts phrases its errors as what it expects ("an integer >= 1"); a refinement
  // may say what it found instead of the value (`params.got`: "150010 bytes").
  const expected = issue.message || issue.code;
  const got =
    issue.code === 'custom' && typeof issue.params?.got === 'string'
      ? issue.params.got
      : describeValue(input);
  return [{ path, message: `${subject(path)}expected ${expected}, got ${got}` }];
}

// ---- locating a path in the YAML document -----------------------------------------------------------

function keyText(key: unknown): string | undefined {
  if (isScalar(key)) return String(key.value);
  return typeof key === 'string' || typeof key === 'number' ? String(key) : undefined;
}

function nodeStart(node: unknown): number | undefined {
  if (!isNode(node) || !node.range) return undefined;
  // An empty value (`key:`) has a zero-width range just past the key's line; the key is a better place.
  if (isScalar(node) && node.value === null && node.range[0] === node.range[1]) return undefined;
  return node.range[0];
}

/**
 * The position of the path's node: for a mapping entry its value (its key for an unknown key or an empty
 * value); where the path does not exist (a missing key) the nearest existing ancestor; 1:1 for an empty document.
 */
function locate(doc: Document, lineCounter: LineCounter, issue: PathIssue): { line: number; column: number } {
  const atKey = issue.atKey === true;
  const path = issue.path;
  for (let depth = path.length; depth >= 0; depth--) {
    let offset: number | undefined;
    if (depth === 0) {
      offset = nodeStart(doc.contents);
    } else {
      const container = depth === 1 ? doc.contents : doc.getIn(path.slice(0, depth - 1), true);
      const segment = path[depth - 1];
      if (isMap(container)) {
        const pair = container.items.find((item) => keyText(item.key) === String(segment));
        if (pair) {
          const keyOffset = nodeStart(pair.key);
          offset = atKey && depth === path.length ? keyOffset : (nodeStart(pair.value) ?? keyOffset);
        }
      } else if (isSeq(container) && typeof segment === 'number') {
        offset = nodeStart(container.items[segment]);
      }
    }
    if (offset !== undefined) {
      const { line, col } = lineCounter.linePos(offset);
      return { line, column: col };
    }
  }
  return { line: 1, column: 1 };
}
