import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmod, copyFile, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import ssh2 from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newEd25519PrivateKey } from '../../shared/providers/local/hostKey.ts';
import { alive, startDev, stopDev, until } from '../../testkit/processes.ts';

/**
 * A node a job can use, through the real OpenSSH client against one `metastatic dev` (shared by every
 * test here: a request of two nodes on one backing node, slots 0 and 1): commands run for real with their
 * exit status, bytes pass unchanged both ways, scp works, each slot has its own directory and
 * environment, only the dev client key gets in, the host is verified from the node's record, and
 * `metastatic ssh` does all of that and refuses what it must. The release test comes last: it ends slot 0.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: Buffer;
}

/** Runs a program with an argument array (no shell), `input` on its stdin; resolves with everything. */
function run(
  file: string,
  args: readonly string[],
  input?: Buffer | string,
  timeoutMs = 60_000,
  env: NodeJS.ProcessEnv = process.env,
): Promise<Run> {
  return new Promise((done, fail) => {
    const child = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'], env });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.on('error', fail);
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      done({ code, signal, stdout: Buffer.concat(out), stderr: Buffer.concat(err) });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
}

interface Node {
  id: string;
  state: string;
  host: string;
  port: number;
  slot: number;
  username: string | null;
  hostKeys: string[];
}

describe('logging in to a node of metastatic dev', { timeout: 240_000 }, () => {
  let stateDir: string;
  let work: string;
  let cliTmp: string;
  let dev: ChildProcess;
  let devLog = () => '';
  let nodes: Node[];
  let clientKey: string;
  let knownHosts: string;

  /** The CLI, with a temporary directory of its own (what `metastatic ssh` leaves there is checked). */
  const cli = (args: string[], input?: Buffer | string) =>
    run(process.execPath, [bin, '--state-dir', stateDir, ...args], input, 60_000, {
      ...process.env,
      TMPDIR: cliTmp,
    });
  /** The real OpenSSH client to `node`, verifying its host from `hosts`, with `identity`. */
  const ssh = (node: Node, command: string[], input?: Buffer | string, opts: Partial<SshOpts> = {}) =>
    run('ssh', [...sshOptions(node, { identity: clientKey, knownHosts, ...opts }), ...command], input);

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-access-'));
    work = await mkdtemp(join(tmpdir(), 'metastatic-access-work-'));
    cliTmp = await mkdtemp(join(tmpdir(), 'metastatic-access-tmp-'));
    // What an operator's shell may hold: none of it may reach a job (issue 42).
    const started = await startDev(bin, stateDir, ['-c', join(root, 'examples', 'local.yaml')], {
      ...process.env,
      AWS_SECRET_ACCESS_KEY: 'operator-secret',
      TMUX: '/tmp/tmux-0/default,1,0',
      npm_config_cache: '/nowhere',
      SSH_AUTH_SOCK: '/tmp/agent.sock',
    });
    dev = started.process;
    devLog = started.log;
    const out = await cli(['request', 'small-node', 'small-node', '--id', 'job', '--wait', '--json']);
    expect(out.code, out.stderr.toString() + devLog()).toBe(0);
    nodes = JSON.parse(out.stdout.toString()).nodes as Node[];
    clientKey = join(stateDir, 'client_ed25519');
    knownHosts = join(work, 'known_hosts');
    const [n] = nodes;
    if (!n) throw new Error('no node');
    await writeFile(knownHosts, n.hostKeys.map((k) => `[${n.host}]:${n.port} ${k}\n`).join(''), {
      mode: 0o600,
    });
  });

  afterAll(async () => {
    await stopDev(dev);
    await rm(stateDir, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
    await rm(cliTmp, { recursive: true, force: true });
  });

  const node = (slot: number): Node => {
    const n = nodes.find((x) => x.slot === slot);
    if (!n) throw new Error(`no node on slot ${slot}`);
    return n;
  };

  it('records a private client key and a user per slot on one backing node', async () => {
    expect((await stat(clientKey)).mode & 0o777).toBe(0o600);
    expect((await readFile(`${clientKey}.pub`, 'utf8')).startsWith('ssh-ed25519 ')).toBe(true);
    expect(nodes.map((n) => [n.slot, n.username]).sort()).toEqual([
      [0, 'slot0'],
      [1, 'slot1'],
    ]);
    expect(node(0).port).toBe(node(1).port);
    const listed = JSON.parse((await cli(['list', 'nodes', '--json'])).stdout.toString()) as Node[];
    expect(listed.map((n) => n.username).sort()).toEqual(['slot0', 'slot1']);
  });

  it("returns the command's exit status, and a signal as OpenSSH does (255)", async () => {
    expect((await ssh(node(0), ['exit 3'])).code).toBe(3);
    expect((await ssh(node(0), ['false'])).code).toBe(1);
    expect((await ssh(node(0), ['true'])).code).toBe(0);
    // sshd reports a command killed by a signal as exit-signal; the OpenSSH client then exits 255.
    expect((await ssh(node(0), ['kill -TERM $$'])).code).toBe(255);
  });

  it('reports the signal by name to a client that reads exit-signal (ssh2)', async () => {
    const n = node(0);
    const privateKey = await readFile(clientKey, 'utf8');
    const signal = await new Promise<unknown>((done, fail) => {
      const client = new ssh2.Client();
      client.on('error', fail);
      client.on('ready', () =>
        client.exec('kill -KILL $$', (err, channel) => {
          if (err) return fail(err);
          channel.on('exit', (_code: unknown, name: unknown) => done(name));
          channel.on('close', () => client.end());
          channel.resume();
        }),
      );
      client.connect({ host: n.host, port: n.port, username: 'slot0', privateKey });
    });
    expect(signal).toBe('SIGKILL');
  });

  it.each([
    ['stderr', '>&2'],
    ['stdout', ''],
  ] as const)(
    "keeps a command's whole %s for a client that reads it only after the command ended (ssh2)",
    async (stream, redirect) => {
      // The command writes more than the client's window holds and exits at once; the client reads
      // nothing for a second, so the rest waits in the server. It must all arrive, then the status.
      const n = node(0);
      const privateKey = await readFile(clientKey, 'utf8');
      const size = 4 * 1024 * 1024;
      const got = await new Promise<{ bytes: number; code: unknown }>((done, fail) => {
        const client = new ssh2.Client();
        client.on('error', fail);
        client.on('ready', () =>
          client.exec(`head -c ${size} /dev/zero ${redirect}; exit 7`, (err, channel) => {
            if (err) return fail(err);
            const slow = stream === 'stderr' ? channel.stderr : channel;
            const other = stream === 'stderr' ? channel : channel.stderr;
            let bytes = 0;
            let code: unknown;
            slow.pause();
            slow.on('data', (d: Buffer) => {
              bytes += d.length;
            });
            channel.on('exit', (c: unknown) => {
              code = c;
            });
            // Counted once the client has read all it received (the stream ends after the channel closed).
            slow.on('end', () => {
              client.end();
              done({ bytes, code });
            });
            other.resume();
            setTimeout(() => slow.resume(), 1000);
          }),
        );
        client.connect({ host: n.host, port: n.port, username: 'slot0', privateKey });
      });
      expect(got).toEqual({ bytes: size, code: 7 });
    },
  );

  it('streams stdin, stdout and stderr byte for byte, binary and large', async () => {
    const data = randomBytes(3 * 1024 * 1024);
    const echoed = await ssh(node(0), ['cat'], data);
    expect(echoed.code).toBe(0);
    expect(echoed.stdout.equals(data)).toBe(true);
    expect(echoed.stderr.length).toBe(0);
    const toStderr = await ssh(node(0), ['cat >&2'], data);
    expect(toStderr.code).toBe(0);
    expect(toStderr.stderr.equals(data)).toBe(true);
    expect(toStderr.stdout.length).toBe(0);
  });

  it('copies files to and from a node with scp', async () => {
    const data = randomBytes(300_000);
    const local = join(work, 'up.bin');
    await writeFile(local, data);
    const n = node(0);
    const scpArgs = sshOptions(n, { identity: clientKey, knownHosts }, '-P').slice(0, -1); // no host
    const up = await run('scp', [...scpArgs, local, `${n.username}@${n.host}:up.bin`]);
    expect(up.code, up.stderr.toString()).toBe(0);
    const sum = await ssh(n, ['sha256sum up.bin']);
    const localSum = (await run('sha256sum', [local])).stdout.toString().split(' ')[0];
    expect(sum.stdout.toString().split(' ')[0]).toBe(localSum);
    const back = join(work, 'down.bin');
    const down = await run('scp', [...scpArgs, `${n.username}@${n.host}:up.bin`, back]);
    expect(down.code, down.stderr.toString()).toBe(0);
    expect((await readFile(back)).equals(data)).toBe(true);
  });

  it('gives each slot its own private directory and environment', async () => {
    await ssh(node(0), ['echo mine > slot0-file']);
    const inSlot = async (slot: number) =>
      (
        await ssh(node(slot), ['echo "$PWD $HOME $METASTATIC_NODE_ID $METASTATIC_SLOT"; ls; stat -c %a .'])
      ).stdout
        .toString()
        .trim()
        .split('\n');
    const [line0, ...rest0] = await inSlot(0);
    const [line1, ...rest1] = await inSlot(1);
    const [pwd0, home0, id0, slot0] = (line0 ?? '').split(' ');
    const [pwd1, home1, id1, slot1] = (line1 ?? '').split(' ');
    expect([id0, slot0, id1, slot1]).toEqual([node(0).id, '0', node(1).id, '1']);
    expect(pwd0).not.toBe(pwd1);
    expect([home0, home1]).toEqual([pwd0, pwd1]);
    expect(rest0).toContain('slot0-file');
    expect(rest1).not.toContain('slot0-file');
    expect(rest0.at(-1)).toBe('700');
    expect(rest1.at(-1)).toBe('700');
  });

  it("gives a job a login's environment as sshd does, nothing of dev's own", async () => {
    // The client's LANG and LC_* are left out but one, sent; AWS_PROFILE it may not set.
    const client = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(LANG|LC_)/.test(k)));
    const envOf = async (tty: boolean) => {
      const extra = ['-o', 'SendEnv=LC_PAPER', '-o', 'SetEnv=AWS_PROFILE=x'];
      const opts = { identity: clientKey, knownHosts, tty, extra };
      const out = await run('ssh', [...sshOptions(node(0), opts), 'env'], undefined, 60_000, {
        ...client,
        LC_PAPER: 'C',
      });
      expect(out.code, out.stderr.toString()).toBe(0);
      const vars = out.stdout
        .toString()
        .split(/\r?\n/)
        .flatMap((line) => {
          const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line);
          // What a shell exports of its own (bash as /bin/sh), not the node's.
          return m?.[1] && !['_', 'SHLVL', 'OLDPWD'].includes(m[1]) ? [[m[1], m[2] ?? '']] : [];
        });
      return Object.fromEntries(vars) as Record<string, string>;
    };
    const env = await envOf(false);
    expect(Object.keys(env).sort()).toEqual([
      'HOME',
      'LC_PAPER',
      'LOGNAME',
      'METASTATIC_NODE_ID',
      'METASTATIC_SLOT',
      'PATH',
      'PWD',
      'SHELL',
      'USER',
    ]);
    expect(env).toMatchObject({
      USER: 'slot0',
      LOGNAME: 'slot0',
      SHELL: '/bin/sh',
      PATH: '/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin',
      LC_PAPER: 'C',
      METASTATIC_SLOT: '0',
      METASTATIC_NODE_ID: node(0).id,
    });
    expect(env.HOME).toBe(env.PWD);
    // A pty adds TERM, as sshd does.
    expect(Object.keys(await envOf(true)).sort()).toEqual([...Object.keys(env), 'TERM'].sort());
  });

  it("resolves ~slot<N> from the login directory to the slot's directory, in commands and over sftp", async () => {
    // Ansible finds a user's home the POSIX way, `echo ~slot0`, and uses what comes back for its remote
    // tmp and every `~/` path. No system user is called slot0, so the shell leaves the word as it is: it
    // must then name the slot's directory, not a new directory called "~slot0".
    const n = node(0);
    const out = await ssh(n, [
      'echo ~slot0; cd ~slot0 && pwd -P; cd "$HOME" && pwd -P; mkdir -p ~slot0/.ansible/tmp && echo x > ~slot0/.ansible/tmp/f && cat "$HOME/.ansible/tmp/f"',
    ]);
    expect(out.code, out.stderr.toString()).toBe(0);
    const [word, viaTilde, home, content] = out.stdout.toString().trim().split('\n');
    expect(word).toBe('~slot0');
    expect(viaTilde).toBe(home);
    expect(content).toBe('x');
    const local = join(work, 'tilde.bin');
    await writeFile(local, 'via sftp\n');
    const sftpArgs = sshOptions(n, { identity: clientKey, knownHosts }, '-P');
    const put = await run('sftp', ['-b', '-', ...sftpArgs], `put ${local} ~slot0/tilde.bin\n`);
    expect(put.code, put.stderr.toString()).toBe(0);
    expect((await ssh(n, ['cat "$HOME/tilde.bin"; rm "$HOME/tilde.bin"'])).stdout.toString()).toBe(
      'via sftp\n',
    );
  });

  it('gives an interactive session a pty', async () => {
    const out = await ssh(node(1), ['tty; exit 4'], undefined, { tty: true });
    expect(out.code).toBe(4);
    expect(out.stdout.toString()).toMatch(/^\/dev\/pts\/\d+/);
  });

  it('refuses other keys, no key, passwords and other users', async () => {
    const other = join(work, 'other_key');
    await writeFile(other, newEd25519PrivateKey(), { mode: 0o600 });
    const refused = /Permission denied \(publickey\)/;
    const wrongKey = await ssh(node(0), ['true'], undefined, { identity: other });
    expect(wrongKey.code).toBe(255);
    expect(wrongKey.stderr.toString()).toMatch(refused);
    const noKey = await ssh(node(0), ['true'], undefined, { identity: '/dev/null' });
    expect(noKey.code).toBe(255);
    expect(noKey.stderr.toString()).toMatch(refused);
    const password = await ssh(node(0), ['true'], undefined, {
      extra: ['-o', 'PreferredAuthentications=password,keyboard-interactive,none'],
    });
    expect(password.code).toBe(255);
    expect(password.stderr.toString()).toMatch(refused);
    const wrongUser = await ssh(node(0), ['true'], undefined, { user: 'root' });
    expect(wrongUser.code).toBe(255);
    expect(wrongUser.stderr.toString()).toMatch(refused);
  });

  it('is verified with StrictHostKeyChecking=yes from its record; another host key is refused', async () => {
    expect((await ssh(node(0), ['true'])).code).toBe(0);
    const wrong = join(work, 'wrong_known_hosts');
    const n = node(0);
    const otherKey = ssh2.utils.parseKey(newEd25519PrivateKey());
    if (otherKey instanceof Error) throw otherKey;
    await writeFile(
      wrong,
      `[${n.host}]:${n.port} ssh-ed25519 ${otherKey.getPublicSSH().toString('base64')}\n`,
    );
    const out = await ssh(n, ['true'], undefined, { knownHosts: wrong });
    expect(out.code).toBe(255);
    expect(out.stderr.toString()).toMatch(
      /REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed/,
    );
  });

  it("metastatic ssh runs the command on the node and exits with the command's status", async () => {
    const out = await cli(['ssh', node(1).id, '--', 'echo', '"$METASTATIC_NODE_ID"', ';', 'exit', '5']);
    expect(out.code, out.stderr.toString()).toBe(5);
    expect(out.stdout.toString()).toBe(`${node(1).id}\n`);
    const data = randomBytes(100_000);
    const cat = await cli(['ssh', node(1).id, '--', 'cat'], data);
    expect(cat.code).toBe(0);
    expect(cat.stdout.equals(data)).toBe(true);
    // No known_hosts of the call is left behind.
    expect(await readdir(cliTmp)).toEqual([]);
  });

  it('metastatic ssh refuses an unknown node and a key others can read, with the reason', async () => {
    const unknown = await cli(['ssh', 'no-such-request/0', '--', 'true']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr.toString()).toContain('no node no-such-request/0');
    const noIndex = await cli(['ssh', 'job/7', '--', 'true']);
    expect(noIndex.code).toBe(1);
    expect(noIndex.stderr.toString()).toContain('no node job/7');
    const loose = join(work, 'loose_key');
    await copyFile(clientKey, loose);
    await chmod(loose, 0o644);
    const out = await cli(['ssh', node(0).id, '--identity', loose, '--', 'true']);
    expect(out.code).toBe(1);
    expect(out.stderr.toString()).toContain(`permissions 0644 for identity ${loose} are too open`);
  });

  it('metastatic ssh waits for a node still pending, then runs the command', async () => {
    // Both slots of the first backing node are taken: this node waits for a new one to boot.
    const sent = await cli(['request', 'small-node', '--id', 'later', '--json']);
    expect(sent.code, sent.stderr.toString()).toBe(0);
    await until('the request to be recorded', async () => {
      const out = await cli(['list', 'requests', '--json']);
      return (
        (JSON.parse(out.stdout.toString()) as { id: string }[]).some((r) => r.id === 'later') || undefined
      );
    });
    const out = await cli(['ssh', 'later/0', '--timeout', '60', '--', 'echo', '$METASTATIC_NODE_ID']);
    expect(out.code, out.stderr.toString()).toBe(0);
    expect(out.stdout.toString()).toBe('later/0\n');
    const ready = await cli(['ssh', 'later/0', '--timeout', '0', '--', 'true']);
    expect(ready.code).toBe(0);
  });

  it('a released node refuses new sessions and its running processes end', async () => {
    const n = node(0);
    const running = ssh(n, ['echo $$ > job.pid; exec sleep 300']);
    const pidFile = await until('the job to start', async () => {
      const out = await ssh(node(0), ['cat job.pid 2>/dev/null']);
      const text = out.stdout.toString().trim();
      return text ? Number(text) : undefined;
    });
    expect(alive(pidFile)).toBe(true);
    const released = await cli(['release', n.id]);
    expect(released.code, released.stderr.toString()).toBe(0);
    const ended = await running;
    expect(ended.code).toBe(255); // the connection was closed under it
    await until('the job to end', () => (alive(pidFile) ? undefined : true), 10_000);
    const after = await ssh(n, ['true']);
    expect(after.code).toBe(255);
    expect(after.stderr.toString()).toMatch(/Permission denied \(publickey\)/);
    const cliAfter = await cli(['ssh', n.id, '--', 'true']);
    expect(cliAfter.code).toBe(1);
    expect(cliAfter.stderr.toString()).toContain(`node ${n.id} is released`);
    // The other slot is untouched.
    expect((await ssh(node(1), ['true'])).code).toBe(0);
  });
});

interface SshOpts {
  identity: string;
  knownHosts: string;
  user?: string;
  tty?: boolean;
  extra?: string[];
}

/** OpenSSH options as `metastatic ssh` passes them, for a test to vary one; the host comes last. */
function sshOptions(node: Node, o: SshOpts, portFlag = '-p'): string[] {
  return [
    portFlag,
    String(node.port),
    '-i',
    o.identity,
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'StrictHostKeyChecking=yes',
    '-o',
    `UserKnownHostsFile=${o.knownHosts}`,
    '-o',
    'GlobalKnownHostsFile=/dev/null',
    '-o',
    'BatchMode=yes',
    '-o',
    'LogLevel=ERROR',
    ...(o.tty ? ['-tt'] : []),
    ...(o.extra ?? []),
    `${o.user ?? node.username}@${node.host}`,
  ];
}
