import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { smallOnLarge } from '../../testkit/configs.ts';

/** One backing process with one slot: a second request waits for capacity. */
const config = parseConfigOrThrow(smallOnLarge({ maxServers: 1, maxParallelJobs: 1 }), 'resend.yaml');

async function until(what: string, check: () => Promise<boolean>, ms = 45_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms / 1000} s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('a restart of metastatic dev (issue 10, defect 6)', () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });

  it('serves a request that was waiting for capacity when the previous run stopped: its message is sent again', async () => {
    const stateDir = await mkdtemp(join(tmpdir(), 'metastatic-resend-'));
    dirs.push(stateDir);
    const start = () => EmbeddedPool.start({ config, stateDir, reaperInterval: 1, log: silentLog });
    const send = (stack: EmbeddedPool, id: string) =>
      stack.sqs.send(
        new SendMessageCommand({
          QueueUrl: stack.info.requestQueueUrl,
          MessageBody: JSON.stringify({ kind: 'request', id, labels: ['small'] }),
        }),
      );

    const first = await start();
    try {
      await send(first, 'holds');
      await until(
        'the first request served',
        async () => (await first.context.store.getRequest('holds'))?.state === 'fulfilled',
      );
      await send(first, 'waits');
      await until(
        'the second request recorded, waiting',
        async () => (await first.context.store.getRequest('waits'))?.state === 'requested',
      );
    } finally {
      await first.stop(); // Ctrl-C: the in-memory queue, and the waiting request's message, are gone
    }

    const second = await start();
    try {
      // The stop failed the first backing node (its process ended), which frees the pool's only place:
      // the waiting request can now be served, if anything still asks for it.
      await until(
        'the waiting request served after the restart',
        async () => (await second.context.store.getRequest('waits'))?.state === 'fulfilled',
      );
      expect((await second.context.store.getRequest('waits'))?.nodes[0]?.state).toBe('ready');
    } finally {
      await second.stop();
    }
  }, 120_000);
});
