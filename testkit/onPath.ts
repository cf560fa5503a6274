import { accessSync, constants, statSync } from 'node:fs';
import { delimiter, join } from 'node:path';

/**
 * Where `command` is on PATH (an executable file), or undefined. Tests that need an external program
 * (moto_server, ansible-playbook) look it up this way instead of running it with `--help`: the Python
 * programs take seconds of CPU to start, and beside a busy neighbour a probe with a timeout once
 * reported an installed moto_server as missing. A program that is present but broken fails where it is
 * started, with its own error.
 */
export function onPath(command: string, path = process.env.PATH ?? ''): string | undefined {
  for (const dir of path.split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, command);
    try {
      if (!statSync(candidate).isFile()) continue;
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}
