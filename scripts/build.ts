/**
 * `npm run build`: what the package ships, in dist/ (run by `npm pack` through `prepack`).
 *
 * - dist/{shared,functions,cli,client,lib}: the sources compiled by tsc (tsconfig.build.json) to ES modules
 *   with their .d.ts, imports rewritten from .ts to .js; the CLI, the client library (`metastatic/client`)
 *   and the CDK constructs (`metastatic/cdk`) run from here when installed.
 * - dist/lambda/<name>/: each pool function's Lambda bundle (lib/lambdaBundle.ts), which the constructs
 *   use as they are: a CDK app of the user's needs no esbuild and bundles nothing at synth.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { POOL_FUNCTION_NAMES, writeBundle } from '../lib/lambdaBundle.ts';

const root = fileURLToPath(new URL('..', import.meta.url));
const dist = join(root, 'dist');
const started = Date.now();

rmSync(dist, { recursive: true, force: true });
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
execFileSync(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
process.stderr.write(`build: compiled the sources into dist/ (${Date.now() - started} ms)\n`);

for (const name of POOL_FUNCTION_NAMES) {
  const outDir = join(dist, 'lambda', name);
  mkdirSync(outDir, { recursive: true });
  writeBundle(name, outDir); // from the sources: this tree has no prebuilt bundle to copy
  process.stderr.write(`build: bundled the ${name} function into dist/lambda/${name}/\n`);
}
process.stderr.write(`build: done in ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
