import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import ssh2 from 'ssh2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ed25519PublicKeyOf, newEd25519PrivateKey } from '../../shared/providers/local/hostKey.ts';
import { formatLiveSlots } from '../../shared/providers/local/liveSlots.ts';
import { GATE_LIMITS } from '../../shared/providers/local/loginGate.ts';
import { backingNodeScript } from '../../shared/providers/local/supervisor.ts';
import { killBackingNode, until } from '../../testkit/processes.ts';

/**
 * A flood of connections that never log in, against one local backing node run with few descriptors
 * (`ulimit -n 256`, as the adversarial run that found it): the job running there finishes with its files,
 * a login while the flood is held gets in, and one after it gets in at its first try. Before the fix the
 * backing node read "no live slot" from the EMFILE of its live file (ending the job and removing its
 * directory), or died of the listener's EMFILE.
 */
const FLOOD = 1_500;
const DESCRIPTORS = 256;

interface Ran {
  code: unknown;
  stdout: string;
}

describe('a backing node under a flood of connections that never log in', { timeout: 120_000 }, () => {
  let dir: string;
  let node: ChildProcess;
  let port: number;
  let stderr = '';
  let privateKey: string;
  const flood: Socket[] = [];

  /** Logs in as slot<N> and runs `command`; resolves with its exit status and output. */
  const exec = (slot: number, command: string): Promise<Ran> =>
    new Promise((done, fail) => {
      const client = new ssh2.Client();
      let ready = false;
      client.on('error', fail);
      client.on('close', () => ready || fail(new Error(`slot${slot}: closed before logging in`)));
      client.on('ready', () =>
        client.exec(command, (err, channel) => {
          ready = true;
          if (err) return fail(err);
          let stdout = '';
          let code: unknown;
          channel.on('data', (d: Buffer) => {
            stdout += d;
          });
          channel.stderr.resume();
          channel.on('exit', (c: unknown) => {
            code = c;
          });
          channel.on('close', () => {
            client.end();
            done({ code, stdout });
          });
        }),
      );
      client.connect({ host: '127.0.0.1', port, username: `slot${slot}`, privateKey, readyTimeout: 60_000 });
    });

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'metastatic-flood-'));
    privateKey = newEd25519PrivateKey();
    await writeFile(join(dir, 'node.authorized_keys'), `${ed25519PublicKeyOf(privateKey)}\n`, {
      mode: 0o600,
    });
    await writeFile(join(dir, 'node.live'), formatLiveSlots({ 0: 'n-0', 1: 'n-1' }), { mode: 0o600 });
    const script = await backingNodeScript();
    node = spawn(
      '/bin/sh',
      [
        '-c',
        `ulimit -n ${DESCRIPTORS} && exec "$0" "$@"`,
        process.execPath,
        script,
        ...['--id', 'b-flood', '--resource', 'r-flood', '--state-file', join(dir, 'node.json')],
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    node.stderr?.on('data', (d: Buffer) => {
      stderr += d;
    });
    port = await new Promise<number>((done, fail) => {
      let out = '';
      node.stdout?.on('data', (d: Buffer) => {
        out += d;
        const ready = /READY (\d+)/.exec(out);
        if (ready) done(Number(ready[1]));
      });
      node.once('exit', (code) => fail(new Error(`backing node exited ${code}: ${stderr}`)));
    });
  });

  afterAll(async () => {
    // A test that failed before its job finished: the job is told to end before its node is killed.
    await writeFile(join(dir, 'node.work', 'slot0', 'go'), '').catch(() => {});
    for (const socket of flood) socket.destroy();
    if (node?.pid) killBackingNode(node.pid);
    await rm(dir, { recursive: true, force: true });
  });

  it('keeps the job, lets a login in during the flood and one at the first try after it', async () => {
    const work = join(dir, 'node.work', 'slot0');
    // The job waits for the test's word (a file), then writes its result into its own directory.
    const job = exec(
      0,
      'touch started; while [ ! -e go ]; do sleep 0.05; done; echo finished > out; echo ok',
    );
    await until('the job to start', () => readFile(join(work, 'started')).catch(() => undefined), 60_000);

    // The flood: each connection sends an identification line, as an SSH client does, then nothing. The
    // node closes the oldest beyond its bound as the new ones come: the flood is held once every
    // connection was made and all but those the node keeps waiting were closed.
    let closed = 0;
    const held = FLOOD - GATE_LIMITS.maxPendingPerSource;
    await new Promise<void>((done, fail) => {
      const bound = setTimeout(
        () => fail(new Error(`the node closed ${closed} of ${FLOOD} idle connections, not ${held}`)),
        60_000,
      );
      node.once('exit', (code) => fail(new Error(`the backing node exited (${code}): ${stderr}`)));
      for (let i = 0; i < FLOOD; i += 1) {
        const socket = connect(port, '127.0.0.1');
        flood.push(socket);
        socket.on('connect', () => socket.write('SSH-2.0-flood\r\n'));
        socket.on('error', () => {});
        socket.resume(); // (a paused socket never sees the node's end, nor closes)
        socket.on('close', () => {
          closed += 1;
          if (closed !== held) return;
          clearTimeout(bound);
          done();
        });
      }
    });
    // The node re-reads its live slots while the flood is held (a signal asks for it at once).
    node.kill('SIGHUP');
    const during = await exec(1, 'echo during');
    expect(during).toEqual({ code: 0, stdout: 'during\n' });

    await writeFile(join(work, 'go'), '');
    expect(await job).toEqual({ code: 0, stdout: 'ok\n' });
    expect(await readFile(join(work, 'out'), 'utf8')).toBe('finished\n');

    for (const socket of flood) socket.destroy();
    const after = await exec(0, 'cat out');
    expect(after).toEqual({ code: 0, stdout: 'finished\n' });
    expect(node.exitCode).toBeNull();
    // The node said what it did with the flood, once in a while rather than per connection.
    expect(stderr).toMatch(/closed \d+ connection\(s\) that had not logged in/);
    expect(stderr.split('\n').length).toBeLessThan(20);
  });
});
