// The CLI of this repository, built from its TypeScript sources on demand and kept until a source changes.
//
// In a clone, bin/metastatic.mjs runs the sources, never a dist/ left from an earlier build. Running them
// through tsx costs every command ~1 s of CPU in module loading and transforms (hundreds of modules);
// the same sources bundled by esbuild (code split, so what a command does not use is still not loaded)
// start in about half of that, and so do the local backing node processes `metastatic dev` starts.
// The bundle is rebuilt whenever one of the files it was built from changed (path, size or mtime, from
// esbuild's own list of inputs), the installed packages changed, or this file did: it is never stale.
// Not part of the package: the installed CLI runs dist/.
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const REPOSITORY = fileURLToPath(new URL('..', import.meta.url));
/** Entry points; the chunks they share sit beside them, so `new URL('./backingNode.js', import.meta.url)` holds. */
const ENTRIES = {
  main: 'cli/main.ts',
  backingNode: 'shared/providers/local/backingNode.ts',
  // A deployed function's process in `metastatic rehearse` (cli/rehearse/lambdaRuntime.ts).
  lambdaWorker: 'cli/rehearse/lambdaWorker.ts',
};
/**
 * Loaded from node_modules as they are: native addons (ssh2's crypto, cpu-features, dynalite's LevelDB),
 * packages that read files beside their own code, and the build tools.
 */
const EXTERNAL = [
  'ssh2',
  'cpu-features',
  'dynalite',
  'fauxqs',
  'tsx',
  'esbuild',
  'typescript',
  'aws-cdk-lib',
  'constructs',
];
/** What else a build depends on: the installed packages (npm rewrites this file on every install) and this file. */
const ALSO = ['node_modules/.package-lock.json', 'bin/fromSources.mjs'];
/** Builds older than this, other than the current one, are removed (a running pool may still use its own). */
const KEEP_MS = 24 * 3600 * 1000;

/** `[path, size, mtimeMs]` of a file relative to `root`, or undefined when it is gone. */
function fingerprint(root, path) {
  try {
    const s = statSync(join(root, path));
    return [path, s.size, s.mtimeMs];
  } catch {
    return undefined;
  }
}

function current(root, cache) {
  try {
    const manifest = JSON.parse(readFileSync(join(cache, 'current.json'), 'utf8'));
    for (const [path, size, mtimeMs] of manifest.inputs) {
      const now = fingerprint(root, path);
      if (!now || now[1] !== size || now[2] !== mtimeMs) return undefined;
    }
    statSync(join(cache, manifest.dir, 'main.js'));
    return join(cache, manifest.dir);
  } catch {
    return undefined;
  }
}

async function build(root, cache) {
  const esbuild = createRequire(import.meta.url)('esbuild');
  mkdirSync(cache, { recursive: true });
  for (const dir of [dirname(cache), cache]) chmodSync(dir, 0o755); // whatever the umask (see below)
  const tmp = join(cache, `tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  const started = Date.now();
  try {
    const result = await esbuild.build({
      absWorkingDir: root,
      entryPoints: ENTRIES,
      outdir: tmp,
      bundle: true,
      splitting: true,
      format: 'esm',
      platform: 'node',
      // The ES module builds of dependencies that have one (the AWS SDK's dist-es): named exports as
      // written, where their CommonJS builds define them through getters esbuild's interop misses.
      mainFields: ['module', 'main'],
      target: 'node20',
      external: EXTERNAL,
      // CommonJS dependencies bundled into ES modules still call require() for Node's built-ins.
      banner: {
        js: "import { createRequire as __metastaticRequire } from 'node:module'; const require = __metastaticRequire(import.meta.url);",
      },
      sourcemap: 'linked',
      metafile: true,
      logLevel: 'silent',
    });
    // As readable as the sources it is built from, whatever the umask of the process that built it (the
    // embedded pool holds 077): a backing node run as another user (rootless slots' tests) loads it too.
    chmodSync(tmp, 0o755);
    for (const name of readdirSync(tmp)) chmodSync(join(tmp, name), 0o644);
    const sources = Object.keys(result.metafile.inputs).filter((p) => !p.startsWith('node_modules/'));
    const inputs = [...sources, ...ALSO].map((path) => fingerprint(root, path)).filter(Boolean);
    const dir = createHash('sha256').update(JSON.stringify(inputs)).digest('hex').slice(0, 16);
    // A source saved while esbuild read it: this build may hold either version, so it is used once and
    // not recorded (the next command builds again).
    if (inputs.some(([, , mtimeMs]) => mtimeMs >= started - 1000)) return tmp;
    try {
      renameSync(tmp, join(cache, dir));
    } catch {
      rmSync(tmp, { recursive: true, force: true }); // built at the same time by another command: the same files
    }
    const manifest = join(cache, 'current.json');
    writeFileSync(`${manifest}.${process.pid}`, JSON.stringify({ dir, inputs }));
    renameSync(`${manifest}.${process.pid}`, manifest);
    prune(cache, dir);
    return join(cache, dir);
  } catch (error) {
    rmSync(tmp, { recursive: true, force: true });
    throw error;
  }
}

function prune(cache, keep) {
  for (const name of readdirSync(cache)) {
    if (name === keep || name === 'current.json') continue;
    try {
      const path = join(cache, name);
      if (Date.now() - statSync(path).mtimeMs > KEEP_MS) rmSync(path, { recursive: true, force: true });
    } catch {
      // Removed meanwhile by another command.
    }
  }
}

/**
 * The directory of an up-to-date build of the sources of `root` (this repository unless given):
 * `main.js` (the CLI) and `backingNode.js`, kept in `cache` (`<root>/node_modules/.cache/metastatic/sources`).
 */
export async function sourceBuild(
  root = REPOSITORY,
  cache = join(root, 'node_modules', '.cache', 'metastatic', 'sources'),
) {
  return current(root, cache) ?? (await build(root, cache));
}
