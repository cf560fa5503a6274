import { cpSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The Lambda functions of the pool: each has its entry point at `functions/<name>/index.ts`. */
export const POOL_FUNCTION_NAMES = ['request', 'fulfil', 'reaper'] as const;
export type PoolFunctionName = (typeof POOL_FUNCTION_NAMES)[number];

/**
 * How every pool function is bundled, with esbuild: one minified CommonJS file for Node.js 24 with its
 * source map (no sources content) and the AWS SDK inside (the version the code was tested with, not the
 * runtime's). CommonJS: the code has no top-level await or import.meta on the Lambda path, and CJS
 * output needs no createRequire banner for the dependencies that call require() (ssh2, the SDK). The only
 * externals are native addons (ssh2's optional crypto binding, cpu-features): built for this machine, not
 * for Lambda's ARM64, and required inside try/catch, so in Lambda the require fails and ssh2 uses its
 * JavaScript implementation.
 */
export const LAMBDA_BUNDLE_OPTIONS = {
  bundle: true,
  platform: 'node',
  format: 'cjs',
  target: 'node24',
  minify: true,
  sourcemap: true,
  sourcesContent: false,
  external: ['*.node'],
  logLevel: 'warning',
} as const;

/** The bundle file in a function's code package (its handler is `index.handler`). */
export const BUNDLE_FILE = 'index.js';

/**
 * Where the bundles built with the package are (`npm run build` writes `dist/lambda/<name>/`): next to
 * the built `lib/` of an installed package. From this repository's sources there are none, and the
 * function is bundled from its sources at synth.
 */
export function prebuiltBundleDir(name: PoolFunctionName): string | undefined {
  const dir = fileURLToPath(new URL(`../lambda/${name}/`, import.meta.url));
  return existsSync(join(dir, BUNDLE_FILE)) ? dir : undefined;
}

/** The entry point of a function in this repository's sources (undefined in an installed package). */
export function functionEntry(name: PoolFunctionName): string | undefined {
  const entry = fileURLToPath(new URL(`../functions/${name}/index.ts`, import.meta.url));
  return existsSync(entry) ? entry : undefined;
}

/**
 * Writes the function's bundle (`index.js`, `index.js.map`) into `outDir`: a copy of the prebuilt one
 * when the package has it, else built from the sources with esbuild (loaded only then, so an installed
 * package needs no esbuild).
 */
export function writeBundle(name: PoolFunctionName, outDir: string): void {
  const prebuilt = prebuiltBundleDir(name);
  if (prebuilt) {
    cpSync(prebuilt, outDir, { recursive: true });
    return;
  }
  const entry = functionEntry(name);
  if (!entry) {
    throw new Error(
      `no bundle of the ${name} function: the package has no dist/lambda/${name} (run npm run build)`,
    );
  }
  const esbuild = createRequire(import.meta.url)('esbuild') as typeof import('esbuild');
  esbuild.buildSync({
    ...LAMBDA_BUNDLE_OPTIONS,
    external: [...LAMBDA_BUNDLE_OPTIONS.external],
    entryPoints: [entry],
    outfile: join(outDir, BUNDLE_FILE),
  });
}
