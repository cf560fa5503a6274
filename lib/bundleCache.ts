import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** A file of a bundle: its name in the code package and its bytes. */
export interface BundleFile {
  readonly name: string;
  readonly contents: Uint8Array;
}

/** `[path relative to the repository, size, mtimeMs]`: what says a file is unchanged. */
type Fingerprint = readonly [string, number, number];

/** Builds older than this, other than the current one, are removed. */
const KEEP_MS = 24 * 3600 * 1000;

/**
 * Lambda bundles built from this repository's sources, kept on disk (node_modules/.cache/metastatic/
 * lambda/) so that every process that synthesizes (a `cdk synth`, `npm pack`, each test file that
 * synthesizes a stack) does not run esbuild again for the same sources: 2-3 CPU-s for the three
 * functions, paid once instead of by each. A bundle is used only while every file it was built from is
 * unchanged (path, size, mtime, from esbuild's list of inputs), and so are the installed packages
 * (`node_modules/.package-lock.json`, which npm rewrites on every install) and the files that say how
 * it is built (`also`): never stale, as bin/fromSources.mjs keeps the CLI's build. Used only in this
 * repository: an installed package ships its bundles prebuilt (dist/lambda/).
 */
export class BundleCache {
  constructor(
    /** The repository whose sources are bundled (input paths are relative to it). */
    private readonly root: string,
    /** Where the bundles are kept. */
    private readonly dir: string,
    /** Files that decide the build besides its inputs, relative to `root`. */
    private readonly also: readonly string[],
  ) {}

  /** The function's bundle as last built, if nothing it was built from changed since. */
  get(name: string): BundleFile[] | undefined {
    try {
      const manifest = JSON.parse(readFileSync(join(this.dir, `${name}.json`), 'utf8')) as {
        build: string;
        inputs: Fingerprint[];
        files: string[];
      };
      for (const [path, size, mtimeMs] of manifest.inputs) {
        const now = this.fingerprint(path);
        if (now?.[1] !== size || now[2] !== mtimeMs) return undefined;
      }
      return manifest.files.map((file) => ({
        name: file,
        contents: readFileSync(join(this.dir, manifest.build, file)),
      }));
    } catch {
      return undefined; // none yet, or removed meanwhile: built again
    }
  }

  /**
   * Keeps a bundle built at `started` (ms) from `inputs` (esbuild's metafile inputs, relative to the
   * root). A source saved while esbuild read it may be in either version: such a build is not kept.
   * Best effort: a cache that cannot be written (a read-only checkout) only means building again.
   */
  put(name: string, inputs: readonly string[], files: readonly BundleFile[], started: number): void {
    const fingerprints = [...inputs.filter((p) => !p.startsWith('node_modules/')), ...this.also].map((p) =>
      this.fingerprint(p),
    );
    if (fingerprints.some((f) => f === undefined || f[2] >= started - 1000)) return;
    const build = `${name}-${process.pid}-${randomBytes(4).toString('hex')}`;
    try {
      mkdirSync(join(this.dir, build), { recursive: true });
      for (const f of files) writeFileSync(join(this.dir, build, f.name), f.contents);
      const manifest = join(this.dir, `${name}.json`);
      writeFileSync(
        `${manifest}.${build}`,
        JSON.stringify({ build, inputs: fingerprints, files: files.map((f) => f.name) }),
      );
      renameSync(`${manifest}.${build}`, manifest);
      this.prune(name, build);
    } catch {
      try {
        rmSync(join(this.dir, build), { recursive: true, force: true });
      } catch {
        // Nothing was written.
      }
    }
  }

  private fingerprint(path: string): Fingerprint | undefined {
    try {
      const s = statSync(join(this.root, path));
      return [path, s.size, s.mtimeMs];
    } catch {
      return undefined;
    }
  }

  /** Earlier builds of the function, a day old (a process may still be reading a recent one). */
  private prune(name: string, keep: string): void {
    for (const entry of readdirSync(this.dir)) {
      if (entry === keep || !entry.startsWith(`${name}-`)) continue;
      try {
        const path = join(this.dir, entry);
        if (Date.now() - statSync(path).mtimeMs > KEEP_MS) rmSync(path, { recursive: true, force: true });
      } catch {
        // Removed meanwhile by another process.
      }
    }
  }
}
