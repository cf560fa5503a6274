import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigInvalidError, parseConfig, parseConfigOrThrow } from '../../shared/config/load.ts';
import { ItemTooLargeError, PermanentError } from '../../shared/core/errors.ts';
import { nodeId } from '../../shared/core/ids.ts';
import { MAX_LABEL_LENGTH, MAX_NODE_SET, RequestMessage } from '../../shared/core/messages.ts';
import type { ResolvedConfig } from '../../shared/core/model.ts';
import type { RequestRecord } from '../../shared/core/records.ts';
import { clip, MAX_REASON_LENGTH } from '../../shared/core/text.ts';
import { MAX_ATTRIBUTES_BYTES } from '../../shared/fields/fields.ts';
import { reap } from '../../shared/usecases/reap/reap.ts';
import { baseConfig, largeNode, poolConfig } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

/**
 * A permanent error ends its request at once, with the real reason, in an item DynamoDB accepts
 * (issue 10, defect 2). Before the bounds, a failure record quoting its labels could exceed the 400 KB
 * item: the write failed with "Item size has exceeded the maximum allowed size", a transient error to
 * the handler, so the request was retried until its receives ran out and ended with the size error (or,
 * when even that record was too large, went to the dead-letter queue, whose consumer failed forever).
 * Everything runs on dynalite, which enforces DynamoDB's item limit, through the real request handler.
 */
let h: Harness;
beforeAll(async () => {
  h = await startHarness(baseConfig(), { maxReceiveCount: 50 });
});
afterAll(async () => {
  await h?.close();
});

const body = (id: string, labels: unknown) => JSON.stringify({ kind: 'request', id, labels });
/** One delivery of `bodies`, as the first receive of each: what a permanent error must settle at once. */
const deliverOnce = (bodies: string[]) => h.pool.handlers.request(sqsEvent(bodies, 1));

describe('permanent errors end the request at once, with the real reason, within the item limit', () => {
  it('fails 64 unknown 100-character labels on the first receive with "unknown labels", naming a few', async () => {
    const labels = Array.from({ length: 64 }, (_, i) => `${String(i).padStart(3, '0')}${'x'.repeat(97)}`);
    const out = await deliverOnce([body('unknown-64', labels)]);
    expect(out.batchItemFailures).toEqual([]); // consumed: not retried
    const r = await h.pool.context.store.getRequest('unknown-64');
    expect(r?.state).toBe('failed');
    expect(r?.labels).toEqual(labels); // a valid message is recorded as sent
    expect(r?.reason).toMatch(/^unknown labels "000x+… \(\d+ more characters\)", "001x+…/);
    expect(r?.reason).toContain('and 59 more');
    expect(r?.reason?.length).toBeLessThanOrEqual(MAX_REASON_LENGTH);
    expect(r?.nodes).toHaveLength(64);
    expect(r?.nodes.every((n) => n.state === 'failed' && n.reason === r.reason)).toBe(true);
  });

  it('fails a 250 KB label on the first receive: a label has at most 255 characters', async () => {
    const huge = 'y'.repeat(250_000);
    const out = await deliverOnce([body('label-250k', [huge])]);
    expect(out.batchItemFailures).toEqual([]);
    const r = await h.pool.context.store.getRequest('label-250k');
    expect(r).toMatchObject({
      state: 'failed',
      reason: `invalid request message: labels.0: a label has at most ${MAX_LABEL_LENGTH} characters`,
    });
    // What was asked for, cut to the bound: enough to recognise it.
    expect(r?.labels).toEqual([clip(huge, MAX_LABEL_LENGTH)]);
    expect(r?.labels[0]?.length).toBe(MAX_LABEL_LENGTH);
  });

  it('records an invalid message of 20,000 labels under its id on the first receive', async () => {
    const out = await deliverOnce([body('labels-20k', Array<string>(20_000).fill('small-node'))]);
    expect(out.batchItemFailures).toEqual([]);
    const r = await h.pool.context.store.getRequest('labels-20k');
    expect(r).toMatchObject({
      state: 'failed',
      reason: `invalid request message: labels: a node set has at most ${MAX_NODE_SET} labels`,
    });
    expect(r?.labels).toHaveLength(MAX_NODE_SET);
  });

  it('names a few of thousands of issues and counts the rest', async () => {
    const out = await deliverOnce([body('bad-60', Array<string>(60).fill('z'.repeat(300)))]);
    expect(out.batchItemFailures).toEqual([]);
    const r = await h.pool.context.store.getRequest('bad-60');
    expect(r?.reason).toBe(
      `invalid request message: labels.0: a label has at most ${MAX_LABEL_LENGTH} characters; ` +
        `labels.1: a label has at most ${MAX_LABEL_LENGTH} characters; ` +
        `labels.2: a label has at most ${MAX_LABEL_LENGTH} characters (and 57 more issues)`,
    );
  });

  it('quotes at most 64 characters of an unknown key', async () => {
    const key = 'k'.repeat(100_000);
    await deliverOnce([JSON.stringify({ kind: 'request', id: 'bad-key', labels: ['small-node'], [key]: 1 })]);
    const r = await h.pool.context.store.getRequest('bad-key');
    expect(r?.state).toBe('failed');
    expect(r?.reason).toMatch(/^invalid request message: unknown key "k+… \(\d+ more characters\)"$/);
    expect(r?.reason?.length).toBeLessThan(120);
  });
});

describe('the dead-letter consumer', () => {
  it('ends a dead-lettered request with a 250 KB label with its real reason instead of failing forever', async () => {
    const out = await h.pool.handlers.deadLetters(sqsEvent([body('dlq-250k', ['w'.repeat(250_000)])], 50));
    expect(out.batchItemFailures).toEqual([]);
    expect(await h.pool.context.store.getRequest('dlq-250k')).toMatchObject({
      state: 'failed',
      reason: `invalid request message: labels.0: a label has at most ${MAX_LABEL_LENGTH} characters`,
    });
  });

  it('records a dead-lettered invalid message that was never recorded (its deliveries failed)', async () => {
    const out = await h.pool.handlers.deadLetters(
      sqsEvent([body('dlq-20k', Array<string>(20_000).fill('small-node'))], 50),
    );
    expect(out.batchItemFailures).toEqual([]);
    expect(await h.pool.context.store.getRequest('dlq-20k')).toMatchObject({
      state: 'failed',
      reason: `invalid request message: labels: a node set has at most ${MAX_NODE_SET} labels`,
    });
  });
});

describe('a request whose nodes cannot be recorded (issue 22, defect 8)', () => {
  /**
   * A pool whose node-attributes take 150,000 characters: what validated before the bounds, and what a pool
   * deployed by that version still runs. Three nodes of it are more than one request item holds, so the
   * write that makes them ready is refused ("Item size has exceeded", dynalite as DynamoDB). Before, the
   * request stayed `pending` forever: the fulfil flow and the reaper retried the write for three minutes
   * and then stopped looking.
   */
  it("ends the request failed with the store's reason, and gives back what it held", async () => {
    const valid = parseConfigOrThrow(baseConfig({ slots: 4 }), 'base.yaml');
    const oversized: ResolvedConfig = {
      ...valid,
      metastaticPools: valid.metastaticPools.map((p) => ({
        ...p,
        nodeAttributes: { big: 'x'.repeat(150_000) },
      })),
    };
    const big = await startHarness(oversized);
    try {
      const store = big.pool.context.store;
      await big.send({ kind: 'request', id: 'too-big', labels: ['small-node', 'small-node', 'small-node'] });
      await big.drainRequests();
      const placed = await store.getRequest('too-big');
      expect(placed?.state).toBe('pending');
      const backingId = placed?.nodes[0]?.backingNodeId as string;
      await big.fulfilUntil(async () => (await store.getBacking(backingId))?.state === 'ready');
      // Whatever the fulfil flow did not finish, the reaper would (its readying window).
      await big
        .fulfilUntil(async () => (await store.getRequest('too-big'))?.state !== 'pending', 10_000)
        .catch(() => undefined);
      await reap(big.pool.context);
      const r = await store.getRequest('too-big');
      expect(r?.state).toBe('failed');
      expect(r?.reason).toMatch(
        /^the nodes could not be recorded: .*Item size has exceeded the maximum allowed size/,
      );
      expect(r?.nodes.every((n) => n.state === 'failed')).toBe(true);
      // Its slots are free again.
      expect((await store.getBacking(backingId))?.used).toBe(0);
      // On the ready backing node a request is placed ready at once: the same refusal, the same end.
      await big.send({
        kind: 'request',
        id: 'too-big-2',
        labels: ['small-node', 'small-node', 'small-node'],
      });
      await big.drainRequests();
      expect(await store.getRequest('too-big-2')).toMatchObject({
        state: 'failed',
        reason: expect.stringMatching(/^the nodes could not be recorded: .*Item size has exceeded/),
      });
      expect((await store.getBacking(backingId))?.used).toBe(0);
    } finally {
      await big.close();
    }
  });
});

describe('the bounds', () => {
  /** The largest request record the schema admits, every node failed with the longest reason. */
  function largestFailedRequest(id: string): RequestRecord {
    // U+4E00 is 3 bytes in UTF-8: the most a UTF-16 code unit costs.
    const wide = (n: number) => '\u4e00'.repeat(n);
    const labels = Array.from({ length: MAX_NODE_SET }, () => wide(MAX_LABEL_LENGTH));
    const reason = wide(MAX_REASON_LENGTH);
    const message = RequestMessage.parse({ kind: 'request', id, labels, requestor: wide(256), priority: 1 });
    return {
      id: message.id,
      labels: message.labels ?? [],
      requestor: message.requestor,
      priority: message.priority,
      bodyHash: 'h'.repeat(32),
      state: 'failed',
      reason,
      poolKey: wide(100),
      createdAt: Date.now(),
      updatedAt: Date.now(),
      version: 1_000_000,
      nodes: labels.map((label, i) => ({ id: nodeId(id, i), label, state: 'failed', reason, attempts: 3 })),
    };
  }

  /**
   * The largest request a valid configuration and message can make the pool record: 64 nodes of the
   * longest ids, each placed, ready and then failed with the longest reason (so it has every field at
   * once), on a host of the longest DNS name, with an RSA-4096 host key (as a scan returns it and as the
   * local provider reports it in attributes), the local provider's own attributes with the longest pool
   * key and label, the label's `attributes` and the pool's `node-attributes` both at MAX_ATTRIBUTES_BYTES
   * (different keys, so both are kept), taken from a min-ready node; a request by shape with the longest
   * sizes, from a requestor of 256 three-byte characters, and the node contract at its longest (a
   * 32-character per-slot user, a python-path of 255). Each node takes ~4.7 KB of JSON, 1 KB of it the
   * two attribute mappings.
   */
  function largestPlacedRequest(id: string): RequestRecord {
    const wide = (n: number) => '\u4e00'.repeat(n);
    const name = (c: string) => c.repeat(64); // the longest name (provider, pool, label)
    const label = name('l');
    const poolKey = `${name('p')}/${name('q')}`;
    const reason = wide(MAX_REASON_LENGTH);
    const hostKey = `ssh-rsa ${'A'.repeat(716)}`; // an RSA-4096 public key in OpenSSH form
    /** A mapping of `prefix`ed keys whose JSON takes exactly MAX_ATTRIBUTES_BYTES. */
    const full = (key: string) => ({ [key]: 'v'.repeat(MAX_ATTRIBUTES_BYTES - `{"${key}":""}`.length) });
    const attributes = {
      ...full('label'),
      ...full('pool'),
      provider: 'local',
      pool: poolKey,
      label,
      resourceId: `local-${'f'.repeat(32)}`,
      pid: 4_194_304,
      hostKeys: [hostKey],
    };
    const size = `${'0'.repeat(28)}1PiB`; // 32 characters, the size rule's most
    const message = RequestMessage.parse({
      kind: 'request',
      id,
      shapes: Array.from({ length: MAX_NODE_SET }, () => ({ cores: 1023.999, memory: size, disk: size })),
      requestor: wide(256),
      priority: 1_000_000,
      'expected-duration': 604_800,
    });
    const now = Date.now();
    return {
      id: message.id,
      labels: Array.from({ length: MAX_NODE_SET }, () => label),
      shapes: message.shapes,
      requestor: message.requestor,
      priority: message.priority,
      expectedDuration: message['expected-duration'],
      bodyHash: 'h'.repeat(64),
      state: 'failed',
      reason,
      poolKey,
      createdAt: now,
      updatedAt: now,
      version: 1_000_000,
      nodes: Array.from({ length: MAX_NODE_SET }, (_, i) => ({
        id: nodeId(id, i),
        label,
        state: 'failed' as const,
        backingNodeId: `bn-${'e'.repeat(16)}`,
        slot: 999,
        host: `${'h'.repeat(63)}.${'h'.repeat(63)}.${'h'.repeat(63)}.${'h'.repeat(61)}`,
        port: 65535,
        attributes,
        readyAt: now,
        releasedAt: now,
        hostKeys: [hostKey],
        // The node contract at its longest: a per-slot user of the longest prefix, python-path's 255.
        username: `${'u'.repeat(28)}-999`,
        connectionType: 'ssh',
        pythonPath: '/'.repeat(255),
        shellType: 'powershell',
        attempts: 20,
        held: true,
        reason,
        spare: `min-ready:${label}:00099:${'9'.repeat(15)}`,
        takenBy: {
          node: nodeId(id, i),
          by: `${'z'.repeat(9)}.${'f'.repeat(12)}.${'f'.repeat(12)}-50`,
          at: now,
        },
      })),
    };
  }

  it('the largest request the message schema admits, failed with the longest reasons, fits in an item', async () => {
    const id = `a${'b'.repeat(127)}`; // the longest request id
    const r = largestFailedRequest(id);
    expect(Buffer.byteLength(JSON.stringify(r))).toBeGreaterThan(150_000); // a real test of the bound
    expect(await h.pool.context.store.createRequest(r)).toBeUndefined();
    expect((await h.pool.context.store.getRequest(id))?.nodes).toHaveLength(MAX_NODE_SET);
  });

  it('a write DynamoDB refuses as too large is a permanent error, not a retried one', async () => {
    const r = { ...largestFailedRequest('too-large'), reason: 'r'.repeat(400_000) };
    const err = await h.pool.context.store.createRequest(r).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ItemTooLargeError);
    expect(err).toBeInstanceOf(PermanentError);
    expect((err as Error).message).toMatch(/Item size has exceeded the maximum allowed size/);
  });

  it('a label with a 150,000-character attribute no longer validates (issue 22, defect 8)', async () => {
    const yaml = poolConfig({
      backing: { labels: [largeNode({ attributes: { big: 'x'.repeat(150_000) } })] },
    });
    const result = parseConfig(yaml, 'big.yaml');
    expect(result.ok ? [] : result.errors.map((e) => `${e.path}: ${e.message}`)).toEqual([
      `providers[0].pools[0].labels[0].attributes: attributes: expected a mapping of at most ${MAX_ATTRIBUTES_BYTES} bytes as JSON, got 150010 bytes`,
    ]);
    await expect(startHarness(yaml)).rejects.toThrow(ConfigInvalidError);
  });

  it('the largest request a valid configuration can make the pool record, with every node at its worst, fits in an item', async () => {
    const r = largestPlacedRequest(`c${'d'.repeat(127)}`);
    const size = Buffer.byteLength(JSON.stringify(r));
    // What docs/configuration.md (Limits) states: ~310 KB as JSON, DynamoDB's 400 KB well above.
    expect(size).toBeGreaterThan(300_000); // a real test of the bound
    expect(size).toBeLessThan(320_000);
    expect(await h.pool.context.store.createRequest(r)).toBeUndefined();
    expect((await h.pool.context.store.getRequest(r.id))?.nodes).toHaveLength(MAX_NODE_SET);
  });

  it('a clipped text never ends in half a character', () => {
    const text = `${'a'.repeat(10)}${'😀'.repeat(10)}`;
    for (let max = 20; max < 40; max++) {
      const out = clip(text, max);
      expect(out.length).toBeLessThanOrEqual(max);
      expect(Buffer.from(out, 'utf8').toString('utf8')).toBe(out); // no lone surrogate (would become U+FFFD)
    }
  });
});
