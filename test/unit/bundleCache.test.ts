import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BundleCache } from '../../lib/bundleCache.ts';

/** The Lambda bundles kept across processes (lib/bundleCache.ts), on a repository of two sources. */
describe('the bundle cache', () => {
  let root: string;
  let cache: BundleCache;
  const files = [
    { name: 'index.js', contents: Buffer.from('exports.handler = 1;\n') },
    { name: 'index.js.map', contents: Buffer.from('{}') },
  ];
  /** A file written a minute ago (a build started now may keep it). */
  const source = (path: string, text: string) => {
    writeFileSync(join(root, path), text);
    const past = new Date(Date.now() - 60_000);
    utimesSync(join(root, path), past, past);
  };

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'metastatic-bundles-'));
    mkdirSync(join(root, 'node_modules'));
    source('a.ts', 'export const a = 1;\n');
    source('b.ts', 'export const b = 2;\n');
    source('node_modules/.package-lock.json', '{}');
    cache = new BundleCache(root, join(root, 'node_modules', '.cache'), ['node_modules/.package-lock.json']);
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  it('gives back what was built while no input changed, and nothing for a function never built', () => {
    expect(cache.get('request')).toBeUndefined();
    cache.put('request', ['a.ts', 'b.ts', 'node_modules/x/index.js'], files, Date.now());
    expect(cache.get('request')).toEqual(files);
    expect(cache.get('fulfil')).toBeUndefined();
  });

  it('is stale once an input, or the installed packages, changed', () => {
    cache.put('request', ['a.ts', 'b.ts'], files, Date.now());
    source('b.ts', 'export const b = 22;\n'); // another size
    expect(cache.get('request')).toBeUndefined();
    cache.put('request', ['a.ts', 'b.ts'], files, Date.now());
    expect(cache.get('request')).toEqual(files);
    source('node_modules/.package-lock.json', '{"x":1}');
    expect(cache.get('request')).toBeUndefined();
    cache.put('request', ['a.ts', 'b.ts'], files, Date.now());
    rmSync(join(root, 'a.ts'));
    expect(cache.get('request')).toBeUndefined();
  });

  it('keeps no build whose input was saved while it ran (it may hold either version)', () => {
    writeFileSync(join(root, 'a.ts'), 'export const a = 3;\n'); // mtime: now
    cache.put('request', ['a.ts', 'b.ts'], files, Date.now());
    expect(cache.get('request')).toBeUndefined();
  });

  it('only builds again where it cannot write (a read-only or odd checkout): no error, nothing kept', () => {
    writeFileSync(join(root, 'not-a-dir'), ''); // a file where the cache would go: every write fails, root too
    const there = new BundleCache(root, join(root, 'not-a-dir', 'cache'), []);
    expect(() => there.put('request', ['a.ts'], files, Date.now())).not.toThrow();
    expect(there.get('request')).toBeUndefined();
  });
});
