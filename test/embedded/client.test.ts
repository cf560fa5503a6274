import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AbortedError,
  InvalidInputError,
  loginOf,
  MetastaticError,
  NodeLostError,
  NodeNotFoundError,
  PoolClient,
  PoolNotFoundError,
  PoolStoppedError,
  type ReadyNode,
  RenewRefusedError,
  RequestExistsError,
  RequestFailedError,
  RequestNotFoundError,
  TimeoutError,
  UnknownLabelError,
} from '../../client/index.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import { clientKeyPath } from '../../shared/runtime/clientKey.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';

/**
 * The client library (`metastatic/client`) against an embedded pool started in this process (dynalite,
 * fauxqs, local backing processes, the reaper every 0.5 s), reached as any client reaches one: through
 * the state dir's dev.json. Each typed error is produced by the pool's real answer; the pool's stop comes
 * last.
 */
const CONFIG = `providers:
  - name: local
    driver: local
    pools:
      - name: main
        max-servers: 4
        labels:
          - name: large-node
            boot-delay: 0.2
  - name: meta
    driver: metastatic
    pools:
      - name: main
        max-servers: 40
        labels:
          - name: small-node
            backing-label: large-node
            max-parallel-jobs: 8
            grace-time: 60
            cores: 1
            memory: 2GiB
`;

describe('metastatic/client against an embedded pool', { timeout: 120_000 }, () => {
  let stateDir: string;
  let embedded: EmbeddedPool;
  let pool: PoolClient;

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-client-'));
    embedded = await EmbeddedPool.start({
      config: parseConfigOrThrow(CONFIG, 'client.yaml'),
      stateDir,
      reaperInterval: 0.5,
      log: silentLog,
      inMemory: true,
    });
    pool = await PoolClient.connect({ stateDir });
  });

  afterAll(async () => {
    pool?.close();
    await embedded?.stop();
    await rm(stateDir, { recursive: true, force: true });
  });

  describe.concurrent('while the pool runs', () => {
    it('requests, reports progress, waits until fulfilled, releases the node', async () => {
      const sent = await pool.request({ id: 'lib-1', labels: ['small-node'], requestor: 'lib' });
      expect(sent).toMatchObject({ id: 'lib-1', labels: ['small-node'] });
      const seen: string[] = [];
      const r = await pool.waitFor('lib-1', { onProgress: (p) => seen.push(p?.state ?? 'queued') });
      expect(r.state).toBe('fulfilled');
      expect(seen.length).toBeGreaterThan(0);
      const [node] = r.nodes;
      expect(node).toMatchObject({ id: 'lib-1/0', state: 'ready', connectionType: 'ssh', request: 'lib-1' });
      expect(node?.hostKeys.length).toBeGreaterThan(0);
      const { node: released, alreadyEnded } = await pool.releaseNode('lib-1/0');
      expect([released.state, alreadyEnded]).toEqual(['released', false]);
      expect((await pool.releaseNode('lib-1/0')).alreadyEnded).toBe(true);
    });

    it('throws RequestFailedError with the reason, UnknownLabelError for labels the pool lacks', async () => {
      await pool.request({ id: 'lib-big', shape: { cores: 500 } });
      const failed = await pool.waitFor('lib-big').catch((e: unknown) => e);
      expect(failed).toBeInstanceOf(RequestFailedError);
      expect((failed as RequestFailedError).reason).toContain("no label's slot fits");
      expect((failed as RequestFailedError).request.state).toBe('failed');
      await pool.request({ id: 'lib-nope', labels: ['nope'] });
      const unknown = await pool.waitFor('lib-nope').catch((e: unknown) => e);
      expect(unknown).toBeInstanceOf(UnknownLabelError);
      expect(unknown).toBeInstanceOf(RequestFailedError);
      expect((unknown as Error).message).toContain('unknown label "nope"');
    });

    it('refuses bad input before sending: InvalidInputError naming the field', async () => {
      const lease = await pool.request({ labels: ['small-node'], lease: 5 }).catch((e: unknown) => e);
      expect(lease).toBeInstanceOf(InvalidInputError);
      expect((lease as InvalidInputError).issues.map((i) => i.path)).toEqual(['lease']);
      const both = pool.request({ labels: ['small-node'], shape: { cores: 1 } });
      await expect(both).rejects.toThrow(InvalidInputError);
      await expect(pool.getNode('not a node')).rejects.toThrow(InvalidInputError);
      await expect(pool.releaseRequest('min-ready:x')).rejects.toThrow(InvalidInputError);
    });

    it('throws NodeNotFoundError, RequestNotFoundError and RenewRefusedError with the reason', async () => {
      await expect(pool.getNode('nobody/0')).rejects.toThrow(NodeNotFoundError);
      await expect(pool.releaseNode('nobody/0')).rejects.toThrow(NodeNotFoundError);
      await expect(pool.releaseRequest('nobody')).rejects.toThrow(RequestNotFoundError);
      await expect(pool.renew('nobody')).rejects.toThrow(RequestNotFoundError);
      await pool.request({ id: 'lib-ended', labels: ['small-node'], lease: 30 });
      await pool.waitFor('lib-ended');
      const ended = await pool.releaseRequest('lib-ended');
      expect(ended.nodes.map((n) => n.state)).toEqual(['released']);
      const refused = await pool.renew('lib-ended').catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(RenewRefusedError);
      expect((refused as Error).message).toContain('has ended');
    });

    it('ends a wait with TimeoutError, and with AbortedError when the signal fires', async () => {
      const timedOut = await pool.waitFor('never-sent', { timeout: 0.3 }).catch((e: unknown) => e);
      expect(timedOut).toBeInstanceOf(TimeoutError);
      expect((timedOut as TimeoutError).request).toBeUndefined();
      const controller = new AbortController();
      setTimeout(() => controller.abort('enough'), 200);
      const started = Date.now();
      const aborted = await pool
        .waitFor('never-sent', { signal: controller.signal })
        .catch((e: unknown) => e);
      expect(aborted).toBeInstanceOf(AbortedError);
      expect((aborted as AbortedError).reason).toBe('enough');
      expect(Date.now() - started).toBeLessThan(5_000);
      await expect(pool.waitFor('never-sent', { signal: AbortSignal.abort() })).rejects.toThrow(AbortedError);
    });

    it('run: the job gets ready nodes, the lease is renewed while it runs, the request is released after', async () => {
      let id = '';
      let leaseAtStart = '';
      const value = await pool.run(
        { labels: ['small-node'], lease: 10 },
        async (nodes, { request }) => {
          id = request.id;
          leaseAtStart = request.leaseExpiresAt ?? '';
          expect(nodes.map((n) => n.state)).toEqual(['ready']);
          // Renewals every 300 ms move the expiry forward.
          for (let i = 0; i < 100; i++) {
            const now = await pool.get(id);
            if ((now?.leaseExpiresAt ?? '') > leaseAtStart) return 'renewed';
            await new Promise((r) => setTimeout(r, 100));
          }
          return 'not renewed';
        },
        { renewEvery: 300 },
      );
      expect(value).toBe('renewed');
      const after = await pool.get(id);
      expect(after?.lease).toBe(10);
      expect(after?.nodes.map((n) => n.state)).toEqual(['released']);
    });

    it('run: releases the request when the job throws, and when the caller aborts', async () => {
      let id = '';
      const thrown = await pool
        .run({ labels: ['small-node'] }, async (_nodes, { request }) => {
          id = request.id;
          throw new Error('job failed');
        })
        .catch((e: unknown) => e);
      expect((thrown as Error).message).toBe('job failed');
      expect((await pool.get(id))?.nodes.map((n) => n.state)).toEqual(['released']);

      const controller = new AbortController();
      const aborted = await pool
        .run(
          { labels: ['small-node'] },
          (_nodes, { request, signal }) => {
            id = request.id;
            setTimeout(() => controller.abort('ctrl-c'), 50);
            return new Promise((resolve) => signal.addEventListener('abort', () => resolve('stopped')));
          },
          { signal: controller.signal },
        )
        .catch((e: unknown) => e);
      expect(aborted).toBeInstanceOf(AbortedError);
      expect((await pool.get(id))?.nodes.map((n) => n.state)).toEqual(['released']);
    });

    it('run: a node released under the job aborts its signal and run throws NodeLostError', async () => {
      const lost = await pool
        .run({ labels: ['small-node'] }, async (nodes, { signal }) => {
          await pool.releaseNode(nodes[0]?.id ?? '');
          await new Promise((resolve) => signal.addEventListener('abort', resolve));
          return signal.reason;
        })
        .catch((e: unknown) => e);
      expect(lost).toBeInstanceOf(NodeLostError);
      expect((lost as NodeLostError).node.state).toBe('released');
    });

    it('run: refuses an id already in the table (not ours), unless attach (issue 41, defect 4)', async () => {
      // Someone else's request, with the very body run would send: the pool would take it as ours.
      const spec = { id: 'theirs', labels: ['small-node'], requestor: 'ci', lease: 60 };
      await pool.request(spec);
      await pool.waitFor('theirs');
      let ran = false;
      const refused = await pool
        .run(spec, async () => {
          ran = true;
        })
        .catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(RequestExistsError);
      expect((refused as RequestExistsError).requestId).toBe('theirs');
      expect(ran).toBe(false);
      expect((await pool.get('theirs'))?.nodes.map((n) => n.state)).toEqual(['ready']); // untouched
      const attached = await pool.run(spec, async ([node]) => node?.id, { attach: true });
      expect(attached).toBe('theirs/0');
      expect((await pool.get('theirs'))?.nodes.map((n) => n.state)).toEqual(['released']);
    });

    it("run: logs in with the embedded pool's client key when no identity is given (issue 41, defect 12)", async () => {
      expect(pool.identity).toBe(clientKeyPath(stateDir));
      const code = await pool.run({ labels: ['small-node'] }, async ([node], { signal }) => {
        // A node is recorded ready a moment before its host lets the slot's user in: try a few times.
        for (let i = 0; ; i++) {
          const ended = await pool.runSsh(loginOf(node as ReadyNode), ['true'], { stdio: 'ignore', signal });
          if (ended.code !== 255 || i === 20) return ended.code;
          await new Promise((r) => setTimeout(r, 250));
        }
      });
      expect(code).toBe(0);
    });

    it('connect: PoolNotFoundError where no pool runs', async () => {
      const empty = await mkdtemp(join(tmpdir(), 'metastatic-client-none-'));
      try {
        const none = await PoolClient.connect({ stateDir: empty }).catch((e: unknown) => e);
        expect(none).toBeInstanceOf(PoolNotFoundError);
        expect(none).toBeInstanceOf(MetastaticError);
        expect((none as Error).name).toBe('PoolNotFoundError');
      } finally {
        await rm(empty, { recursive: true, force: true });
      }
    });
  });

  it('throws PoolStoppedError to a waiting client when the pool stops', async () => {
    const waiting = pool.waitFor('never-sent', { timeout: 30 }).catch((e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    await embedded.stop();
    expect(await waiting).toBeInstanceOf(PoolStoppedError);
  });
});
