/**
 * `scanHostKeys` without loading `ssh2` until a scan is needed: only labels with `host-key-checking`
 * scan, and `ssh2` (with its crypto dependencies) is the largest part of a function's start-up that
 * most pools never use. Same contract as `scanHostKeys` in `hostKeys.ts`.
 */
export async function scanHostKeys(host: string, port: number, timeoutMs: number): Promise<string[]> {
  const { scanHostKeys: scan } = await import('./hostKeys.ts');
  return scan(host, port, timeoutMs);
}
