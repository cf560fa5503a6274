import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * The package's root: the nearest directory above this module with a package.json. The same from the
 * sources (`cli/`) and from the build (`dist/cli/`), in this repository and in an installed package.
 */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error('metastatic: no package.json above the CLI');
    dir = parent;
  }
  return dir;
}

/** The package's version: package.json is the one place it is kept. */
export function packageVersion(): string {
  const manifest = JSON.parse(readFileSync(join(packageRoot(), 'package.json'), 'utf8')) as {
    version?: unknown;
  };
  return String(manifest.version);
}
