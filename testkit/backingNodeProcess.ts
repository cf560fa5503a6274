import { type ChildProcess, type SpawnOptions, spawn } from 'node:child_process';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import ssh2 from 'ssh2';
import { ed25519PublicKeyOf, newEd25519PrivateKey } from '../shared/providers/local/hostKey.ts';
import { formatLiveSlots } from '../shared/providers/local/liveSlots.ts';
import { backingNodeScript } from '../shared/providers/local/supervisor.ts';

/**
 * One local backing node process on files of a test's own, without a pool: a directory with its
 * authorized key (a new one) and live-slots file, the process started on them, and logins to its slots
 * with ssh2. For tests and benchmarks of what a backing node does by itself (a connection flood, slot
 * containment).
 */
export interface NodeFiles {
  readonly dir: string;
  readonly privateKey: string;
  /** Writes the live-slots file (slot -> node id); send the process SIGHUP to have it read at once. */
  readonly live: (slots: Record<number, string>) => Promise<void>;
}

/** A new directory with a client key and the live slots given. */
export async function nodeFiles(prefix: string, slots: Record<number, string>): Promise<NodeFiles> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  const privateKey = newEd25519PrivateKey();
  await writeFile(join(dir, 'node.authorized_keys'), `${ed25519PublicKeyOf(privateKey)}\n`, { mode: 0o600 });
  const live = (s: Record<number, string>) =>
    writeFile(join(dir, 'node.live'), formatLiveSlots(s), { mode: 0o600 });
  await live(slots);
  return { dir, privateKey, live };
}

export interface StartedNode {
  readonly process: ChildProcess;
  /** Its SSH port once it said READY; undefined when it exited before. */
  readonly port: number | undefined;
  /** Everything it wrote to stderr so far. */
  readonly stderr: () => string;
}

/**
 * Starts backing node `id` on `files` (state file `node.json`) with `args` besides its identity,
 * under `ulimit -n` when given; resolves once it says READY or exits.
 */
export async function startBackingNode(
  files: NodeFiles,
  id: string,
  args: readonly string[] = [],
  options: {
    readonly descriptors?: number;
    readonly env?: NodeJS.ProcessEnv;
    /** Run as this uid and gid (no supplementary groups) instead of this process's. */
    readonly as?: { readonly uid: number; readonly gid: number };
  } = {},
): Promise<StartedNode> {
  const argv = [
    await backingNodeScript(),
    ...['--id', id, '--resource', `r-${id}`, '--state-file', join(files.dir, 'node.json')],
    ...args,
  ];
  const spawnOptions: SpawnOptions = {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: options.env ?? process.env,
    ...(options.as ? { uid: options.as.uid, gid: options.as.gid } : {}),
  };
  const proc =
    options.descriptors === undefined
      ? spawn(process.execPath, argv, spawnOptions)
      : spawn(
          '/bin/sh',
          ['-c', `ulimit -n ${options.descriptors} && exec "$0" "$@"`, process.execPath, ...argv],
          spawnOptions,
        );
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => {
    stderr += d;
  });
  const port = await new Promise<number | undefined>((resolve) => {
    let out = '';
    proc.stdout?.on('data', (d: Buffer) => {
      out += d;
      const ready = /READY (\d+)/.exec(out);
      if (ready) resolve(Number(ready[1]));
    });
    proc.once('exit', () => resolve(undefined));
  });
  return { process: proc, port, stderr: () => stderr };
}

/** What a command run on a slot gave: its exit status (or signal name), stdout and stderr. */
export interface Ran {
  readonly code: unknown;
  readonly stdout: string;
  readonly stderr: string;
}

/** Logs in to slot<N> of the backing node on `port` and runs `command` (a login of its own). */
export function slotExec(port: number, privateKey: string, slot: number, command: string): Promise<Ran> {
  return new Promise((done, fail) => {
    const client = new ssh2.Client();
    let ready = false;
    client.on('error', fail);
    client.on('close', () => ready || fail(new Error(`slot${slot}: closed before logging in`)));
    client.on('ready', () =>
      client.exec(command, (err, channel) => {
        ready = true;
        if (err) return fail(err);
        let stdout = '';
        let stderr = '';
        let code: unknown;
        channel.on('data', (d: Buffer) => {
          stdout += d;
        });
        channel.stderr.on('data', (d: Buffer) => {
          stderr += d;
        });
        channel.on('exit', (c: unknown, signal: unknown) => {
          code = signal ?? c;
        });
        channel.on('close', () => {
          client.end();
          done({ code, stdout, stderr });
        });
      }),
    );
    client.connect({ host: '127.0.0.1', port, username: `slot${slot}`, privateKey, readyTimeout: 60_000 });
  });
}
