import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
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

/** The version of a package installed in this repository (to install the same one, from npm's cache). */
export function installedVersion(name: string): string {
  return (
    JSON.parse(readFileSync(join(ROOT, 'node_modules', name, 'package.json'), 'utf8')) as { version: string }
  ).version;
}

/**
 * `npm pack` (which runs `prepack`: npm run build) into `work`, then `npm install` of the tarball, and of
 * `also` (names of packages installed here, at the same versions), into a new project `work/app`.
 */
export async function packAndInstall(work: string, also: readonly string[] = []): Promise<InstalledPackage> {
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
    [
      'install',
      '--prefer-offline',
      '--no-audit',
      '--no-fund',
      tarball,
      ...also.map((name) => `${name}@${installedVersion(name)}`),
    ],
    { cwd: app, maxBuffer: 64 * 1024 * 1024 },
  );
  return {
    app,
    tarball,
    files: info.files.map((f) => f.path),
    bin: join(app, 'node_modules', 'metastatic', 'bin', 'metastatic.mjs'),
  };
}
