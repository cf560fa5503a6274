import { accessSync, constants, readFileSync, realpathSync } from 'node:fs';
import { basename, delimiter, dirname, join, relative, resolve, sep } from 'node:path';

/**
 * The installed package's CLI, run from the project it is installed in. `--no` (`--no-install`) makes npx
 * refuse to install anything: without it, where no `metastatic` is installed npx would download a package
 * of that name from the npm registry, which this project does not publish (anyone may register it).
 */
export const NPX_COMMAND = 'npx --no metastatic';

/** How this process was started: the script node ran (`process.argv[1]`), the working directory, PATH. */
export interface CliStart {
  readonly script: string | undefined;
  readonly cwd: string;
  readonly path: string | undefined;
}

const thisProcess = (): CliStart => ({
  script: process.argv[1],
  cwd: process.cwd(),
  path: process.env.PATH,
});

/**
 * The command that runs this CLI again, from another shell in the same directory, for the commands the
 * CLI suggests ("Try it from another shell: … request small-node --wait"): the way it was started, and
 * never one that could fetch a package from the registry (npx without `--no`):
 * - installed as a dependency of the project the working directory is in (`npx --no metastatic`,
 *   `./node_modules/.bin/metastatic`, `node node_modules/metastatic/bin/metastatic.mjs`): `npx --no metastatic`;
 * - installed globally, its command the first `metastatic` on PATH: `metastatic`;
 * - this repository's (`npm start`, `bin/metastatic`), or anywhere else: the path of the command it was
 *   started by (`bin/metastatic` rather than the `bin/metastatic.mjs` beside it), relative to the working
 *   directory when under it, else absolute;
 * - not started by the CLI at all (a program using the client library): `npx --no metastatic`.
 */
export function cliCommand(start: CliStart = thisProcess()): string {
  if (!start.script) return NPX_COMMAND;
  const script = resolve(start.cwd, start.script);
  let real: string;
  try {
    real = realpathSync(script);
  } catch {
    return NPX_COMMAND;
  }
  const pkg = dirname(dirname(real));
  if (basename(real) !== 'metastatic.mjs' || basename(dirname(real)) !== 'bin' || !isThePackage(pkg)) {
    return NPX_COMMAND;
  }
  // A dependency of the project being worked in: npx finds it in the project's node_modules/.bin.
  const cwds = [start.cwd, realOr(start.cwd)];
  if (projectsOf(script, real).some((project) => cwds.some((cwd) => isWithin(cwd, project)))) {
    return NPX_COMMAND;
  }
  if (basename(script) === 'metastatic' && firstOnPath('metastatic', start) === script) return 'metastatic';
  const wrapper = join(dirname(script), 'metastatic');
  const shown =
    basename(script) === 'metastatic.mjs' && isExecutable(wrapper) && realOr(wrapper) === real
      ? wrapper
      : script;
  if (!isWithin(shown, start.cwd)) return shellWord(shown);
  const rel = relative(start.cwd, shown);
  return shellWord(rel.includes(sep) ? rel : `.${sep}${rel}`);
}

/**
 * The projects whose node_modules the CLI was run from: `<project>/node_modules/.bin/metastatic`, or the
 * package's entry point `<project>/node_modules/metastatic/bin/metastatic.mjs` as run or as resolved (a
 * dependency installed from a directory is a link to it).
 */
function projectsOf(script: string, real: string): string[] {
  const projects: string[] = [];
  const inNodeModules = (dir: string) => basename(dirname(dir)) === 'node_modules';
  if (basename(dirname(script)) === '.bin' && inNodeModules(dirname(script))) {
    projects.push(dirname(dirname(dirname(script))));
  }
  for (const entry of [script, real]) {
    const pkg = dirname(dirname(entry));
    if (basename(entry) === 'metastatic.mjs' && basename(pkg) === 'metastatic' && inNodeModules(pkg)) {
      projects.push(dirname(dirname(pkg)));
    }
  }
  return projects;
}

function realOr(path: string): string {
  try {
    return realpathSync(path);
  } catch {
    return path;
  }
}

function isThePackage(dir: string): boolean {
  try {
    return (
      (JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as { name?: unknown }).name ===
      'metastatic'
    );
  } catch {
    return false;
  }
}

function isWithin(path: string, dir: string): boolean {
  const rel = relative(dir, path);
  return rel === '' || (!rel.startsWith('..') && !rel.startsWith(sep) && resolve(dir, rel) === resolve(path));
}

function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The first executable `name` in the directories of PATH, as the shell would find it. */
function firstOnPath(name: string, start: CliStart): string | undefined {
  for (const dir of (start.path ?? '').split(delimiter)) {
    if (dir === '') continue;
    const candidate = resolve(start.cwd, dir, name);
    if (isExecutable(candidate)) return candidate;
  }
  return undefined;
}

/** A path as one shell word: as it is when it needs no quoting, else in single quotes. */
function shellWord(word: string): string {
  return /^[\w./@%+=:,-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}
