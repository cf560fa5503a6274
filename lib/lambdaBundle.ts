import { chmodSync, cpSync, existsSync, readdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BundleCache, type BundleFile } from './bundleCache.ts';

/**
 * The Lambda functions of the pool: each has its entry point at `functions/<name>/index.ts`. The package
 * ships a bundle of each; a stack deploys `github` only when its configuration has an enabled `github`
 * section (lib/poolGithub.ts).
 */
export const POOL_FUNCTION_NAMES = ['request', 'fulfil', 'reaper', 'github'] as const;
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
 * package needs no esbuild). A bundle built from the sources is kept in memory for the process (an app
 * with several pools, or pools with different configurations, which are different assets, would
 * otherwise run esbuild for each) and on disk for the next process while no source changed
 * (bundleCache.ts).
 */
export function writeBundle(name: PoolFunctionName, outDir: string): void {
  const prebuilt = prebuiltBundleDir(name);
  if (prebuilt) {
    cpSync(prebuilt, outDir, { recursive: true });
    makeReadableByAll(outDir);
    return;
  }
  let files = builtBundles.get(name);
  if (!files) {
    files = buildBundle(name);
    builtBundles.set(name, files);
  }
  for (const file of files) writeFileSync(join(outDir, file.name), file.contents);
  makeReadableByAll(outDir);
}

const builtBundles = new Map<PoolFunctionName, readonly BundleFile[]>();

/**
 * The repository's bundles on disk. What decides a build besides its inputs: the installed packages,
 * this file's options, and the settings esbuild reads (tsconfig.json, package.json).
 */
function repositoryCache(root: string): BundleCache {
  return new BundleCache(root, join(root, 'node_modules', '.cache', 'metastatic', 'lambda'), [
    'node_modules/.package-lock.json',
    'lib/lambdaBundle.ts',
    'tsconfig.json',
    'package.json',
  ]);
}

function buildBundle(name: PoolFunctionName): readonly BundleFile[] {
  const entry = functionEntry(name);
  if (!entry) {
    throw new Error(
      `no bundle of the ${name} function: the package has no dist/lambda/${name} (run npm run build)`,
    );
  }
  const root = fileURLToPath(new URL('..', import.meta.url));
  const cache = repositoryCache(root);
  const cached = cache.get(name);
  if (cached) return cached;
  const started = Date.now();
  const esbuild = createRequire(import.meta.url)('esbuild') as typeof import('esbuild');
  const out = esbuild.buildSync({
    ...LAMBDA_BUNDLE_OPTIONS,
    external: [...LAMBDA_BUNDLE_OPTIONS.external],
    entryPoints: [entry],
    absWorkingDir: root,
    metafile: true,
    // Not written: the files are kept to be written into every asset that needs them. The source map's
    // reference in index.js is its base name, so it holds wherever they are written.
    write: false,
    outfile: join(dirname(entry), BUNDLE_FILE),
  });
  const files = out.outputFiles.map((f) => ({ name: basename(f.path), contents: f.contents }));
  cache.put(name, Object.keys(out.metafile.inputs), files, started);
  return files;
}

/**
 * Sets every file under `dir` to 0644 and every folder to 0755, whatever the umask of the process that
 * wrote them. The CDK CLI zips each file with its mode, and Lambda runs the code as a user other than the
 * package's owner: under `umask 077` (hardened hosts, some CI images) esbuild's output and a plain
 * `writeFileSync(..., { mode: 0o644 })` come out 0600, with the same asset hash, and every invocation
 * fails with EACCES. A mode given at creation is masked by the umask; chmod is not.
 */
export function makeReadableByAll(dir: string): void {
  chmodSync(dir, 0o755);
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) makeReadableByAll(path);
    else if (entry.isFile()) chmodSync(path, 0o644);
  }
}
