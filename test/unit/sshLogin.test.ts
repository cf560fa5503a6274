import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loginAccepted, RUN_EXIT, runError } from '../../cli/commands/run.ts';
import { NodeUnreachableError } from '../../client/errors.ts';
import { runSsh, type SshLogin } from '../../client/openssh.ts';

/**
 * Issue 41, defect 8: `metastatic run` hung on a node that accepts a connection and never speaks (seen
 * on a rehearsal: `running on …`, then nothing for minutes, its lease renewed all along). ssh now has a
 * ConnectTimeout and keepalives, and `run`'s wait for the login is a deadline enforced during an attempt
 * too: past it the attempt is killed and `run` fails (exit 125) instead of running the command.
 */
describe('logging in to a node that never answers', () => {
  let server: Server;
  let login: SshLogin;
  let dir: string;
  let key: string;
  const sockets = new Set<Socket>();

  beforeAll(async () => {
    server = createServer((s) => {
      sockets.add(s); // accepted, and never a byte back
      s.on('close', () => sockets.delete(s));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as { port: number }).port;
    login = { nodeId: 'mute/0', host: '127.0.0.1', port, user: 'u', hostKeys: ['ssh-ed25519 AAAA'] };
    dir = await mkdtemp(join(tmpdir(), 'metastatic-mute-'));
    key = join(dir, 'key');
    await writeFile(key, 'not a key', { mode: 0o600 });
  });
  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
    await rm(dir, { recursive: true, force: true });
  });

  it('gives up at the deadline, during the attempt, with NodeUnreachableError', {
    timeout: 15_000,
  }, async () => {
    const started = Date.now();
    const err = await loginAccepted(login, key, new AbortController().signal, 1500).catch((e: unknown) => e);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(err).toBeInstanceOf(NodeUnreachableError);
    expect((err as Error).message).toContain('mute/0');
    expect((err as Error).message).toContain('did not accept the login within 1.5 s');
    // ... which `run` reports as its own failure before the command ran.
    expect(runError(err, undefined).exitCode).toBe(RUN_EXIT.ownFailure);
  });

  it('runs ssh with a connect timeout and keepalives', { timeout: 15_000 }, async () => {
    let args: string[] = [];
    const controller = new AbortController();
    await runSsh(login, ['true'], {
      identity: key,
      stdio: 'ignore',
      signal: controller.signal,
      connectTimeout: 1,
      onSpawn: (child) => {
        args = child.spawnargs;
      },
    });
    expect(args.join(' ')).toContain('-o ConnectTimeout=1');
    expect(args.join(' ')).toMatch(/-o ServerAliveInterval=\d+ -o ServerAliveCountMax=\d+/);
  });
});
