import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const execFileP = promisify(execFile);
const ROOT = resolve(import.meta.dirname, '..');

/** The package as a user gets it: the packed tarball installed into an empty project. */
export interface InstalledPackage {
  /** The project directory; the package is in node_modules/metastatic. */
  readonly app: string;
  readonly tarball: string;
  /** The paths in the tarball, as npm pack lists them. */
  readonly files: readonly string[];
  /** The installed CLI's entry point (run it with `node`). */
  readonly bin: string;
}

/**
 * `npm pack` (which runs `prepack`: npm run build) into `work`, then `npm install` of the tarball into a
 * new project `work/app`. The packages named in `also` (the user's own dependencies: aws-cdk-lib,
 * constructs, @types/node) are the ones installed in this repository, linked into the app's node_modules
 * after the install: the same versions and files npm would install, without unpacking aws-cdk-lib's
 * 160 MB again (a quarter of the package test's time on a 2-core machine). The package's own dependencies
 * are installed by npm from the tarball's package.json, as a user's install does, but with no install script
 * run (`--ignore-scripts`): the package must work without any, as it does where npm runs none (npm's
 * `allowScripts`, an `ignore-scripts=true` in a hardened CI's .npmrc, a host without a C++ compiler).
 * Its dependencies ask for three (classic-level, dynalite's LevelDB, finds its prebuilt binary without
 * one; ssh2's crypto binding and its optional cpu-features would be compiled with node-gyp, and ssh2 uses
 * Node's own crypto without them). Compiling them is also most of an install's time: measured here, 34 CPU-s
 * and 78 s with the scripts, 14 CPU-s and 12 s without, for code the package does not need.
 */
export async function packAndInstall(work: string, also: readonly string[] = []): Promise<InstalledPackage> {
  await typecheckEnded();
  const packed = await execFileP('npm', ['pack', '--json', '--pack-destination', work], {
    cwd: ROOT,
    maxBuffer: 64 * 1024 * 1024,
  });
  const [info] = JSON.parse(packed.stdout) as Array<{ filename: string; files: Array<{ path: string }> }>;
  if (!info) throw new Error(`npm pack printed no tarball: ${packed.stdout}`);
  const app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(
    join(app, 'package.json'),
    JSON.stringify({ name: 'my-pool', private: true, type: 'module' }),
  );
  const tarball = join(work, info.filename);
  await execFileP(
    'npm',
    ['install', '--prefer-offline', '--ignore-scripts', '--no-audit', '--no-fund', tarball],
    {
      cwd: app,
      maxBuffer: 64 * 1024 * 1024,
    },
  );
  for (const name of also) {
    const link = join(app, 'node_modules', name);
    if (existsSync(link)) continue; // installed with the package already (a dependency of a dependency)
    mkdirSync(dirname(link), { recursive: true });
    symlinkSync(join(ROOT, 'node_modules', name), link, 'dir');
  }
  return {
    app,
    tarball,
    files: info.files.map((f) => f.path),
    bin: join(app, 'node_modules', 'metastatic', 'bin', 'metastatic.mjs'),
  };
}

/**
 * In `npm test` the type check runs beside the suite (scripts/test.mjs) and builds dist/ as it checks:
 * `npm pack`, which builds dist/ too, waits until it has ended (METASTATIC_TYPECHECK_DONE names the file
 * it then writes), so that two compilers never write the same outputs. Elsewhere nothing to wait for.
 */
async function typecheckEnded(): Promise<void> {
  const done = process.env.METASTATIC_TYPECHECK_DONE;
  if (!done) return;
  const deadline = Date.now() + 300_000;
  while (!existsSync(done)) {
    if (Date.now() > deadline) throw new Error(`the type check did not end within 300 s (${done})`);
    await sleep(250);
  }
}
