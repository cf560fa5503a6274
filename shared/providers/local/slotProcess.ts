/**
 * What a session on a local backing node runs: a command through `/bin/sh -c`, or an interactive shell,
 * in the slot's working directory with the slot's environment, streamed over the SSH channel byte for
 * byte, its exit status (or the signal that killed it) returned as OpenSSH's sshd does.
 *
 * Each process is started in a process group of its own (detached: setsid), so that ending a session
 * ends everything it started: SIGHUP to the group, SIGKILL a moment later to what is left. A process
 * that leaves the group (setsid, a double fork into a new session) escapes this, as it escapes sshd's
 * SIGHUP; local nodes are the user's own machine and user, so this is a convenience, not a jail.
 *
 * A pty (`ssh -t`, an interactive `ssh`) is made without a native module by util-linux `script`
 * (`script -qfec CMD /dev/null`): the command runs on a real pseudo-terminal whose size is set from the
 * client's pty request (later window changes are not passed on). Without `script` (not Linux), a pty
 * request falls back to pipes.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import type { ServerChannel } from 'ssh2';

/** How long a session's processes have between SIGHUP and SIGKILL. */
export const KILL_GRACE_MS = 1_000;

export interface PtyInfo {
  readonly term: string;
  readonly rows: number;
  readonly cols: number;
}

let scriptAvailable: boolean | undefined;

/** Whether util-linux `script` (with -e, -f, -c) is here; checked once. */
export function hasScript(): boolean {
  scriptAvailable ??= spawnSync('script', ['-qfec', 'true', '/dev/null'], { stdio: 'ignore' }).status === 0;
  return scriptAvailable;
}

/** A single-quoted shell word. */
function quote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

/** The program and arguments for `command` (undefined: an interactive shell), with or without a pty. */
export function commandLine(command: string | undefined, pty: PtyInfo | undefined): [string, string[]] {
  if (pty && hasScript()) {
    const rows = Math.max(0, Math.min(pty.rows, 10_000));
    const cols = Math.max(0, Math.min(pty.cols, 10_000));
    const size = rows > 0 && cols > 0 ? `stty rows ${rows} cols ${cols} 2>/dev/null; ` : '';
    const inner = command === undefined ? 'exec /bin/sh -i' : `exec /bin/sh -c ${quote(command)}`;
    return ['script', ['-qfec', `${size}${inner}`, '/dev/null']];
  }
  // Without a terminal, as sshd does: the shell reads commands from the channel, non-interactive.
  return command === undefined ? ['/bin/sh', []] : ['/bin/sh', ['-c', command]];
}

/** Signals every process of a group; false once the group is gone. */
export function signalGroup(pgid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pgid, signal);
    return true;
  } catch {
    return false;
  }
}

/** Ends a process group: SIGHUP, then SIGKILL after KILL_GRACE_MS to whatever is left. */
export function endGroup(pgid: number): void {
  if (!signalGroup(pgid, 'SIGHUP')) return;
  signalGroup(pgid, 'SIGCONT'); // a stopped process handles its SIGHUP only once it runs
  setTimeout(() => signalGroup(pgid, 'SIGKILL'), KILL_GRACE_MS).unref();
}

export interface SlotProcessOptions {
  readonly cwd: string;
  readonly env: NodeJS.ProcessEnv;
  /** Called with the group id once started, and again (with the same id) when it should be forgotten. */
  readonly track: (pgid: number, started: boolean) => void;
  /** How the program is started in a contained slot (slotIsolation.ts); unset: as it is. */
  readonly wrap?: (file: string, args: readonly string[]) => [string, string[]];
}

/**
 * Runs `command` (a shell when undefined) for a session channel: stdin from the channel, stdout and
 * stderr to it; once the process and its output pipes closed and its output is written to the channel,
 * the exit status or signal, then EOF and close. Ending the channel (the client went, the slot was released) ends the process group.
 */
export function runOnChannel(
  channel: ServerChannel,
  command: string | undefined,
  pty: PtyInfo | undefined,
  options: SlotProcessOptions,
): ChildProcess | undefined {
  const [program, programArgs] = commandLine(command, pty);
  const [file, args] = options.wrap ? options.wrap(program, programArgs) : [program, programArgs];
  const env = pty ? { ...options.env, TERM: pty.term || 'xterm', SHELL: '/bin/sh' } : options.env;
  let child: ChildProcess;
  try {
    child = spawn(file, args, { cwd: options.cwd, env, detached: true, stdio: 'pipe' });
  } catch (err) {
    channel.stderr.write(`metastatic: cannot start ${file}: ${(err as Error).message}\n`);
    channel.exit(127);
    channel.end();
    return undefined;
  }
  const pgid = child.pid;
  if (pgid === undefined) {
    child.once('error', (err) => {
      channel.stderr.write(`metastatic: cannot start ${file}: ${err.message}\n`);
      channel.exit(127);
      channel.end();
    });
    return undefined;
  }
  options.track(pgid, true);
  child.stdin?.on('error', () => {}); // the command may exit without reading its input
  channel.pipe(child.stdin as NodeJS.WritableStream);
  child.stdout?.pipe(channel, { end: false });
  child.stderr?.pipe(channel.stderr, { end: false });
  let closed = false;
  child.once('close', (code, signal) => {
    closed = true;
    // Whatever it left behind in its group (`sleep 100 &`) ends with the session.
    endGroup(pgid);
    options.track(pgid, false);
    // stderr is a stream of its own, which may still hold output waiting for the client's window:
    // ending the channel before it is written loses its tail (seen under load: a large `cat >&2` came
    // back short). The status and EOF follow once it is; stdout's own buffer is flushed by end().
    channel.stderr.end(() => {
      if (signal) channel.exit(signal.replace(/^SIG/, ''), false, '');
      else channel.exit(code ?? 255);
      channel.end();
    });
  });
  channel.once('close', () => {
    if (closed) return;
    endGroup(pgid);
    options.track(pgid, false);
  });
  return child;
}
