import { readFile, rm, writeFile } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GATE_LIMITS } from '../../shared/providers/local/loginGate.ts';
import {
  type NodeFiles,
  nodeFiles,
  type StartedNode,
  slotExec,
  startBackingNode,
} from '../../testkit/backingNodeProcess.ts';
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

describe('a backing node under a flood of connections that never log in', { timeout: 120_000 }, () => {
  let files: NodeFiles;
  let started: StartedNode;
  let port: number;
  const flood: Socket[] = [];
  const exec = (slot: number, command: string) => slotExec(port, files.privateKey, slot, command);
  const stderr = () => started.stderr();

  beforeAll(async () => {
    files = await nodeFiles('metastatic-flood-', { 0: 'n-0', 1: 'n-1' });
    started = await startBackingNode(files, 'b-flood', [], { descriptors: DESCRIPTORS });
    if (started.port === undefined) throw new Error(`backing node exited: ${stderr()}`);
    port = started.port;
  });

  afterAll(async () => {
    // A test that failed before its job finished: the job is told to end before its node is killed.
    await writeFile(join(files.dir, 'node.work', 'slot0', 'go'), '').catch(() => {});
    for (const socket of flood) socket.destroy();
    if (started?.process.pid) killBackingNode(started.process.pid);
    await rm(files.dir, { recursive: true, force: true });
  });

  it('keeps the job, lets a login in during the flood and one at the first try after it', async () => {
    const work = join(files.dir, 'node.work', 'slot0');
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
      started.process.once('exit', (code) =>
        fail(new Error(`the backing node exited (${code}): ${stderr()}`)),
      );
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
    started.process.kill('SIGHUP');
    const during = await exec(1, 'echo during');
    expect(during).toEqual({ code: 0, stdout: 'during\n', stderr: '' });

    await writeFile(join(work, 'go'), '');
    expect(await job).toEqual({ code: 0, stdout: 'ok\n', stderr: '' });
    expect(await readFile(join(work, 'out'), 'utf8')).toBe('finished\n');

    for (const socket of flood) socket.destroy();
    const after = await exec(0, 'cat out');
    expect(after).toEqual({ code: 0, stdout: 'finished\n', stderr: '' });
    expect(started.process.exitCode).toBeNull();
    // The node said what it did with the flood, once in a while rather than per connection.
    expect(stderr()).toMatch(/closed \d+ connection\(s\) that had not logged in/);
    expect(stderr().split('\n').length).toBeLessThan(20);
  });
});
