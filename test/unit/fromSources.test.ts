import { execFileSync } from 'node:child_process';
import {
  appendFileSync,
  cpSync,
  existsSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  utimesSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

/**
 * bin/fromSources.mjs, which the CLI of a clone runs the sources through: on a copy of the sources (so
 * the repository's own build and the tests running beside this one are not touched), a build is reused
 * while nothing it was built from changed, and never once a source did.
 */
const root = resolve(import.meta.dirname, '..', '..');
const copy = mkdtempSync(join(tmpdir(), 'metastatic-sources-'));
const cache = join(copy, 'cache');
for (const dir of ['cli', 'client', 'shared', 'bin'])
  cpSync(join(root, dir), join(copy, dir), { recursive: true });
cpSync(join(root, 'package.json'), join(copy, 'package.json'));
symlinkSync(join(root, 'node_modules'), join(copy, 'node_modules'), 'dir');
// Copied files are new: older mtimes, as a checkout's, so a build is recorded (see the next test).
const past = new Date(Date.now() - 60_000);
execFileSync('find', [
  copy,
  '-path',
  join(copy, 'node_modules'),
  '-prune',
  '-o',
  '-type',
  'f',
  '-exec',
  'touch',
  '-d',
  past.toISOString(),
  '{}',
  '+',
]);

const { sourceBuild } = (await import(join(copy, 'bin', 'fromSources.mjs'))) as {
  sourceBuild(root?: string, cache?: string): Promise<string>;
};
const version = (dir: string) =>
  execFileSync(process.execPath, [join(dir, 'main.js'), '--version'], { encoding: 'utf8' }).trim();

afterAll(() => rmSync(copy, { recursive: true, force: true }));

describe('the CLI built from the sources', { timeout: 60_000 }, () => {
  let first: string;

  it('is built once and reused while no source changed', async () => {
    first = await sourceBuild(copy, cache);
    expect(existsSync(join(first, 'main.js'))).toBe(true);
    expect(existsSync(join(first, 'backingNode.js'))).toBe(true);
    expect(await sourceBuild(copy, cache)).toBe(first);
    expect(version(first)).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('is rebuilt when a source it was built from changes, and the earlier build stays for whoever runs it', async () => {
    appendFileSync(join(copy, 'cli', 'packageInfo.ts'), '\nexport const EDITED = 1;\n');
    utimesSync(join(copy, 'cli', 'packageInfo.ts'), past, new Date(past.getTime() + 1000));
    const second = await sourceBuild(copy, cache);
    expect(second).not.toBe(first);
    expect(existsSync(join(first, 'main.js'))).toBe(true);
    expect(await sourceBuild(copy, cache)).toBe(second);
  });

  it('is not recorded when a source was saved during the build, so the next command builds again', async () => {
    const recorded = readFileSync(join(cache, 'current.json'), 'utf8');
    appendFileSync(join(copy, 'cli', 'packageInfo.ts'), '\nexport const EDITED_AGAIN = 2;\n');
    const during = await sourceBuild(copy, cache); // the file's mtime is now: it may have changed mid-build
    expect(during).toMatch(/tmp-/);
    expect(version(during)).toMatch(/^\d+\.\d+\.\d+/);
    // The record still names the earlier build, whose inputs no longer match: the next command rebuilds.
    expect(readFileSync(join(cache, 'current.json'), 'utf8')).toBe(recorded);
  });
});
