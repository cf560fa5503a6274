/**
 * `npm run build`: what the package ships, in dist/ (run by `npm pack` through `prepack`).
 *
 * - dist/{shared,cli,client,lib}: the sources compiled by tsc (tsconfig.build.json) to ES modules with
 *   their .d.ts, imports rewritten from .ts to .js; the CLI, the client library (`metastatic/client`) and
 *   the CDK constructs (`metastatic/cdk`) run from here when installed. tsconfig.build.json is a
 *   composite project that `npm run typecheck` (tsc -b) builds too: in `npm test`, the package test's
 *   `npm pack` finds it up to date instead of compiling it again. Outputs of deleted sources are removed,
 *   and a missing output forces a full compile (tsc -b trusts its build info, which does not notice a
 *   deleted output).
 * - dist/lambda/<name>/: each pool function's Lambda bundle (lib/lambdaBundle.ts), which the constructs
 *   use as they are: a CDK app of the user's needs no esbuild and bundles nothing at synth.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { POOL_FUNCTION_NAMES, writeBundle } from '../lib/lambdaBundle.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = join(root, 'dist');
const started = Date.now();

const COMPILED = ['shared', 'cli', 'client', 'lib'];
const OUTPUT = /(\.d)?\.(js|ts)(\.map)?$/;

/** Every file under `dir`, recursively (none when it does not exist). */
function files(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name));
}

// Outputs whose source is gone (renamed or deleted since the last build) would be packed: removed.
for (const output of COMPILED.flatMap((d) => files(join(dist, d)))) {
  const source = join(root, relative(dist, output).replace(OUTPUT, '.ts'));
  if (!existsSync(source)) rmSync(output);
}
const sources = COMPILED.flatMap((d) => files(join(root, d))).filter(
  (f) => f.endsWith('.ts') && !f.endsWith('.d.ts'),
);
const complete = sources.every((f) =>
  ['.js', '.d.ts'].every((ext) => existsSync(join(dist, relative(root, f).replace(/\.ts$/, ext)))),
);
// TypeScript's launcher (bin/tsc, which runs the native compiler), found from its package.json: the
// package exports no path to it.
const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin', 'tsc');
execFileSync(
  process.execPath,
  [tsc, '-b', join(root, 'tsconfig.build.json'), ...(complete ? [] : ['--force'])],
  { stdio: 'inherit' },
);
process.stderr.write(`build: compiled the sources into dist/ (${Date.now() - started} ms)\n`);
rmSync(join(dist, 'lambda'), { recursive: true, force: true });

for (const name of POOL_FUNCTION_NAMES) {
  const outDir = join(dist, 'lambda', name);
  mkdirSync(outDir, { recursive: true });
  writeBundle(name, outDir); // from the sources: this tree has no prebuilt bundle to copy
  process.stderr.write(`build: bundled the ${name} function into dist/lambda/${name}/\n`);
}
process.stderr.write(`build: done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
