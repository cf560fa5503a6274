/** Paths into the configuration data, and the issues found at them (before they are located in the YAML). */

export type PathSegment = string | number;

/** An error found on the data, before it is located in the YAML document. */
export interface PathIssue {
  readonly path: readonly PathSegment[];
  readonly message: string;
  /** Locate the key of the last path segment rather than its value (e.g. for an unknown key). */
  readonly atKey?: boolean;
}

/** `providers[1].pools[0].labels[0].max-parallel-jobs` */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const segment of path) {
    if (typeof segment === 'number') out += `[${segment}]`;
    else out += out === '' ? String(segment) : `.${String(segment)}`;
  }
  return out;
}

/** The value as a mapping, or undefined (the rules skip what the schema reports as malformed). */
export function asRecord(value: unknown): Record<string, unknown> | undefined {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
    ? (value as Record<string, unknown>)
    : undefined;
}

/** The value as a non-empty string, or undefined. */
export function asString(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}
