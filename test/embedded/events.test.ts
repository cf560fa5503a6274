import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { EventBridgeClient, PutEventsCommand } from '@aws-sdk/client-eventbridge';
import { mockClient } from 'aws-sdk-client-mock';
import { afterEach, describe, expect, it, onTestFinished } from 'vitest';
import { SpotInterruptionDetailType } from '../../shared/core/stateChanges.ts';
import { EventBridgeSink } from '../../shared/providers/events/eventBridgeSink.ts';
import { baseConfig } from '../../testkit/configs.ts';
import { type Harness, sqsEvent, startHarness } from '../../testkit/harness.ts';

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

async function published(
  harness: Harness,
): Promise<Array<{ 'detail-type': string; detail: Record<string, unknown> }>> {
  const text = await readFile(join(harness.pool.info.stateDir, 'events.jsonl'), 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l));
}

describe('events out', () => {
  it('publishes launched, fulfilled, released and stopped, once each', async () => {
    h = await startHarness(baseConfig({ grace: 0 }));
    await h.send({ kind: 'request', id: 'ev', labels: ['small-node'] });
    await h.send({ kind: 'request', id: 'ev', labels: ['small-node'] }); // a duplicate publishes nothing
    await h.drainRequests();
    await h.fulfilUntil(async () => (await h?.pool.context.store.getRequest('ev'))?.state === 'fulfilled');
    await h.send({ kind: 'release', nodeId: 'ev/0' });
    await h.drainRequests();
    h.clock.advance(1);
    await h.pool.reapNow();
    const events = await published(h);
    expect(events.map((e) => e['detail-type'])).toEqual([
      'Backing Node Launched',
      'Request Fulfilled',
      'Request Waited For Boot', // placed on the backing node it launched: it waited for the boot
      'Node Released',
      'Backing Node Stopped',
    ]);
    expect(events[1]?.detail).toMatchObject({ requestId: 'ev', nodes: [{ id: 'ev/0', state: 'ready' }] });
  });

  it('publishes and counts a request that waited for a launch, and not one served from a free slot (issue 27)', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    const counts: Array<[string, number]> = [];
    const times: Array<[string, number]> = [];
    Object.assign(h.pool.context, {
      metrics: {
        count: (name: string, value = 1) => counts.push([name, value]),
        milliseconds: (name: string, ms: number) => times.push([name, ms]),
      },
    });
    const fulfilled = (id: string) => async () =>
      (await h?.pool.context.store.getRequest(id))?.state === 'fulfilled';
    // The first request launches a backing node and waits for it to boot.
    await h.send({ kind: 'request', id: 'cold', labels: ['small-node'] });
    await h.drainRequests();
    expect((await h.pool.context.store.getRequest('cold'))?.state).toBe('pending');
    h.clock.advance(5_000);
    await h.fulfilUntil(fulfilled('cold'));
    // The second finds a free slot on it, ready: served at once.
    await h.send({ kind: 'request', id: 'warm', labels: ['small-node'] });
    await h.drainRequests();
    expect(await fulfilled('warm')()).toBe(true);

    const events = await published(h);
    const waited = events.filter((e) => e['detail-type'] === 'Request Waited For Boot');
    expect(waited).toHaveLength(1);
    const backingNodeId = (await h.pool.context.store.getRequest('cold'))?.nodes[0]?.backingNodeId;
    expect(waited[0]?.detail).toMatchObject({
      requestId: 'cold',
      labels: ['small-node'],
      backingNodeIds: [backingNodeId],
    });
    expect(waited[0]?.detail.waitedMs).toBeGreaterThanOrEqual(5_000);
    expect(events.filter((e) => e['detail-type'] === 'Request Fulfilled')).toHaveLength(2);
    const total = (name: string) => counts.filter(([n]) => n === name).reduce((t, [, v]) => t + v, 0);
    expect([total('RequestsFulfilled'), total('RequestsWaitedForBoot')]).toEqual([2, 1]);
    expect(times.filter(([n]) => n === 'WaitForBoot').map(([, ms]) => ms >= 5_000)).toEqual([true]);
  }, 60_000);

  it('publishes a failed request with its reason', async () => {
    h = await startHarness(baseConfig());
    await h.pool.handlers.request(
      sqsEvent([JSON.stringify({ kind: 'request', id: 'bad', labels: ['nope'] })]),
    );
    const [event] = await published(h);
    expect(event).toMatchObject({
      'detail-type': 'Request Failed',
      source: 'metastatic',
      detail: { requestId: 'bad', reason: 'unknown label "nope" (configured: small-node)' },
    });
  });

  it('sends each event to the configured EventBridge bus and reports rejected entries', async () => {
    const eb = mockClient(EventBridgeClient);
    onTestFinished(() => eb.restore()); // this file shares its worker: the real client after it, even if it fails
    eb.on(PutEventsCommand)
      .resolvesOnce({ FailedEntryCount: 0, Entries: [{ EventId: 'e1' }] })
      .resolvesOnce({ FailedEntryCount: 1, Entries: [{ ErrorCode: 'AccessDenied', ErrorMessage: 'no' }] });
    const sink = new EventBridgeSink(new EventBridgeClient({ region: 'us-east-1' }), 'pool-bus');
    await sink.publish('Node Released', { nodeId: 'a/0' });
    expect(eb.commandCalls(PutEventsCommand)[0]?.args[0].input).toEqual({
      Entries: [
        {
          EventBusName: 'pool-bus',
          Source: 'metastatic',
          DetailType: 'Node Released',
          Detail: '{"nodeId":"a/0"}',
        },
      ],
    });
    await expect(sink.publish('Node Released', { nodeId: 'b/0' })).rejects.toThrow(
      'PutEvents rejected Node Released: AccessDenied no',
    );
  });

  it('puts the pool id in every detail when it has one, so pools sharing a bus can be told apart', async () => {
    const eb = mockClient(EventBridgeClient);
    onTestFinished(() => eb.restore()); // this file shares its worker: the real client after it, even if it fails
    eb.on(PutEventsCommand).resolves({ FailedEntryCount: 0, Entries: [{ EventId: 'e1' }] });
    const sink = new EventBridgeSink(new EventBridgeClient({ region: 'us-east-1' }), 'default', 'ci-pool');
    await sink.publish('Request Failed', { requestId: 'r', reason: 'no capacity' });
    const detail = eb.commandCalls(PutEventsCommand)[0]?.args[0].input.Entries?.[0]?.Detail ?? '';
    expect(JSON.parse(detail)).toEqual({ requestId: 'r', reason: 'no capacity', poolId: 'ci-pool' });
  });
});

describe('spot interruption warning', () => {
  it('retires the backing node at once and fails its ready nodes so their users learn it', async () => {
    h = await startHarness(baseConfig({ slots: 2 }));
    await h.send({ kind: 'request', id: 'spot', labels: ['small-node'] });
    await h.drainRequests();
    await h.fulfilUntil(async () => (await h?.pool.context.store.getRequest('spot'))?.state === 'fulfilled');
    const store = h.pool.context.store;
    const [b] = await store.listBacking();
    const warning = {
      version: '0',
      'detail-type': SpotInterruptionDetailType,
      source: 'aws.ec2',
      resources: [],
      detail: { 'instance-id': b?.resourceId, 'instance-action': 'terminate' },
    };
    const out = await h.pool.handlers.fulfil(sqsEvent([JSON.stringify(warning)]));
    expect(out.batchItemFailures).toEqual([]);
    expect((await store.getBacking(b?.id as string))?.state).toBe('failed');
    expect((await store.getRequest('spot'))?.nodes[0]).toMatchObject({
      state: 'failed',
      reason: expect.stringContaining('spot interruption warning'),
    });
    expect((await h.pool.reapNow()).stopped).toEqual([b?.id]);
  });
});
