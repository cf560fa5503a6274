/**
 * The Lambda bundles: each pool function (functions/<name>/index.ts) bundled with esbuild as
 * lib/lambdaBundle.ts does it (platform node, CommonJS, minified, bundled with the
 * AWS SDK, source map without sources content, only native `*.node` addons external), plus a bare
 * handler that imports the same SDK clients and does nothing, built the same way, as the baseline.
 * Reports each bundle's size (bytes and gzip bytes) and its module-initialisation time: a fresh
 * `node -e` that times `require(<bundle>)`, run N times per bundle, bundles interleaved, median taken.
 * Everything is written to a temporary directory, removed at the end.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { gzipSync } from 'node:zlib';
import { type BuildOptions, build, type Metafile } from 'esbuild';
import { LAMBDA_BUNDLE_OPTIONS, POOL_FUNCTION_NAMES } from '../lib/lambdaBundle.ts';
import { median, round, table } from './common.ts';

const run = promisify(execFile);

export const BUNDLES = {
  /** Timed requires per bundle (after one untimed run each, which warms the file cache). */
  initRuns: 12,
  target: 'node22',
} as const;

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** The baseline: the SDK clients the pool functions use, kept (the SDK declares no side effects), never constructed. */
const BARE_HANDLER = `
import { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { EC2Client } from '@aws-sdk/client-ec2';
import { EventBridgeClient } from '@aws-sdk/client-eventbridge';
import { SQSClient } from '@aws-sdk/client-sqs';

export const clients = [DynamoDBClient, SQSClient, EC2Client, EventBridgeClient];
export const handler = async (): Promise<void> => {};
`;

export interface BundleFigures {
  readonly name: string;
  readonly bytes: number;
  readonly gzipBytes: number;
  readonly sourceMapBytes: number;
  /** Median time of `require(<bundle>)` in a fresh node, ms. */
  readonly initMs: number;
  readonly initMsMin: number;
  readonly initMsMax: number;
  /** Versus the bare handler (1 for the bare handler itself). */
  readonly sizeRatio: number;
  readonly gzipRatio: number;
  readonly initRatio: number;
  /** Output bytes by npm package (`(project)` for this repository's code), largest first. */
  readonly packages: Record<string, number>;
  /** The packages that add the most output bytes over the bare handler, largest first. */
  readonly largestAdditions: Record<string, number>;
}

export interface BundlesFigures {
  readonly target: string;
  readonly initRuns: number;
  readonly node: string;
  readonly bundles: BundleFigures[];
}

/** The pool functions' bundling options (lib/lambdaBundle.ts), for the Node.js that runs the bench. */
const common: BuildOptions = {
  ...LAMBDA_BUNDLE_OPTIONS,
  external: [...LAMBDA_BUNDLE_OPTIONS.external],
  target: BUNDLES.target,
  absWorkingDir: ROOT,
  metafile: true,
};

interface Built {
  readonly name: string;
  readonly file: string;
  readonly packages: Map<string, number>;
}

/** Output bytes of one bundle by npm package, from esbuild's metafile. */
function packagesOf(metafile: Metafile | undefined): Map<string, number> {
  const byPackage = new Map<string, number>();
  const output = Object.values(metafile?.outputs ?? {}).find((o) => o.entryPoint !== undefined);
  for (const [path, input] of Object.entries(output?.inputs ?? {})) {
    const name = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(path)?.[1] ?? '(project)';
    byPackage.set(name, (byPackage.get(name) ?? 0) + input.bytesInOutput);
  }
  return byPackage;
}

const largestFirst = (entries: Iterable<[string, number]>, n: number) =>
  Object.fromEntries([...entries].sort((a, b) => b[1] - a[1]).slice(0, n));

async function buildAll(dir: string): Promise<Built[]> {
  const bareFile = join(dir, 'bare', 'index.js');
  const bare = await build({
    ...common,
    stdin: { contents: BARE_HANDLER, resolveDir: ROOT, sourcefile: 'bare-handler.ts', loader: 'ts' },
    outfile: bareFile,
  });
  const out: Built[] = [{ name: 'bare SDK handler', file: bareFile, packages: packagesOf(bare.metafile) }];
  for (const name of POOL_FUNCTION_NAMES) {
    const file = join(dir, name, 'index.js');
    const result = await build({
      ...common,
      entryPoints: [join(ROOT, 'functions', name, 'index.ts')],
      outfile: file,
    });
    out.push({ name, file, packages: packagesOf(result.metafile) });
  }
  return out;
}

/** One fresh node process that requires the bundle and prints how long that took (ms). */
async function initOnce(file: string): Promise<number> {
  const script =
    'const t=process.hrtime.bigint();' +
    `require(${JSON.stringify(file)});` +
    'console.log(Number(process.hrtime.bigint()-t)/1e6)';
  const env: NodeJS.ProcessEnv = { ...process.env, AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' };
  delete env.NODE_OPTIONS; // nothing of this process's loaders (tsx) in the child
  const { stdout } = await run(process.execPath, ['-e', script], { env, cwd: tmpdir() });
  const ms = Number.parseFloat(stdout.trim().split('\n').pop() ?? '');
  if (!Number.isFinite(ms)) throw new Error(`bundles: could not read the init time of ${file}: ${stdout}`);
  return ms;
}

export async function measureBundles(progress: (line: string) => void): Promise<BundlesFigures> {
  const dir = await mkdtemp(join(tmpdir(), 'metastatic-bench-bundles-'));
  try {
    progress(`bundles: building ${POOL_FUNCTION_NAMES.join(', ')} and a bare SDK handler with esbuild...`);
    const built = await buildAll(dir);
    const sizes = await Promise.all(
      built.map(async (b) => {
        const code = await readFile(b.file);
        return {
          bytes: code.length,
          gzipBytes: gzipSync(code).length,
          sourceMapBytes: (await stat(`${b.file}.map`)).size,
        };
      }),
    );
    progress(`bundles: ${BUNDLES.initRuns} timed requires per bundle in fresh node processes...`);
    const times: number[][] = built.map(() => []);
    for (const b of built) await initOnce(b.file); // warm the file cache; not counted
    for (let i = 0; i < BUNDLES.initRuns; i++) {
      // Rotate the order so no bundle always runs right after another.
      for (let j = 0; j < built.length; j++) {
        const k = (i + j) % built.length;
        (times[k] as number[]).push(await initOnce((built[k] as { file: string }).file));
      }
    }
    const base = { ...(sizes[0] as (typeof sizes)[number]), initMs: median(times[0] as number[]) };
    const basePackages = (built[0] as Built).packages;
    return {
      target: BUNDLES.target,
      initRuns: BUNDLES.initRuns,
      node: process.version,
      bundles: built.map((b, k) => {
        const s = sizes[k] as (typeof sizes)[number];
        const t = times[k] as number[];
        const initMs = median(t);
        return {
          name: b.name,
          bytes: s.bytes,
          gzipBytes: s.gzipBytes,
          sourceMapBytes: s.sourceMapBytes,
          initMs: round(initMs, 1),
          initMsMin: round(Math.min(...t), 1),
          initMsMax: round(Math.max(...t), 1),
          sizeRatio: round(s.bytes / base.bytes, 2),
          gzipRatio: round(s.gzipBytes / base.gzipBytes, 2),
          initRatio: round(initMs / base.initMs, 2),
          packages: largestFirst(b.packages, b.packages.size),
          largestAdditions: largestFirst(
            [...b.packages].map(([p, bytes]): [string, number] => [p, bytes - (basePackages.get(p) ?? 0)]),
            6,
          ),
        };
      }),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const kb = (bytes: number) => `${(bytes / 1024).toFixed(0)} KiB`;

export function bundlesReport(f: BundlesFigures): string {
  const rows = f.bundles.map((b) => [
    b.name,
    `${b.bytes} (${kb(b.bytes)})`,
    `${b.gzipBytes} (${kb(b.gzipBytes)})`,
    `${b.sizeRatio.toFixed(2)} / ${b.gzipRatio.toFixed(2)}`,
    `${b.initMs.toFixed(1)} (${b.initMsMin.toFixed(0)}-${b.initMsMax.toFixed(0)})`,
    b.initRatio.toFixed(2),
  ]);
  const additions = f.bundles.slice(1).map(
    (b) =>
      `  ${b.name}: ${Object.entries(b.largestAdditions)
        .map(([p, bytes]) => `${p} +${kb(bytes)}`)
        .join(', ')}`,
  );
  return [
    `Lambda bundles (esbuild ${f.target}, cjs, minified, SDK bundled; init = require() in a fresh node ${f.node}, ` +
      `median of ${f.initRuns})`,
    table(rows, [
      'bundle',
      'bytes',
      'gzip bytes',
      'size ratio (raw / gzip)',
      'init ms (min-max)',
      'init ratio',
    ]),
    'largest additions over the bare SDK handler (output bytes by package):',
    ...additions,
  ].join('\n');
}
