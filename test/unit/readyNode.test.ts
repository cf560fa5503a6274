import { describe, expect, expectTypeOf, it } from 'vitest';
import { NodeUnreachableError } from '../../client/errors.ts';
import type { PoolClient, ReadyNode } from '../../client/index.ts';
import { readyNode } from '../../client/readyNode.ts';
import type { PoolNode } from '../../client/records.ts';

/**
 * Issue 41, defect 12: the nodes `run` gives its job are ready, so their `host`, `port` and `username`
 * are there: typed non-null (ReadyNode), checked once at run time (NodeUnreachableError otherwise).
 */
const node = (fields: Partial<PoolNode>): PoolNode =>
  ({
    id: 'r/0',
    state: 'ready',
    host: '10.0.0.1',
    port: 22,
    username: 'ci',
    hostKeys: [],
    ...fields,
  }) as PoolNode;

describe('ReadyNode', () => {
  it("is what run's job gets: host, port and username are not nullable", () => {
    type Job = Parameters<PoolClient['run']>[1];
    type JobNode = Parameters<Job>[0][number];
    expectTypeOf<JobNode>().toEqualTypeOf<ReadyNode>();
    expectTypeOf<ReadyNode['host']>().toEqualTypeOf<string>();
    expectTypeOf<ReadyNode['port']>().toEqualTypeOf<number>();
    expectTypeOf<ReadyNode['username']>().toEqualTypeOf<string>();
    expectTypeOf<ReadyNode>().toMatchTypeOf<PoolNode>();
  });

  it('is checked at run time: a ready node without a host, port or username is unreachable', () => {
    const ok = node({});
    expect(readyNode(ok)).toBe(ok);
    for (const missing of [{ host: null }, { port: null }, { username: null }, { username: '' }] as const) {
      expect(() => readyNode(node(missing)), JSON.stringify(missing)).toThrow(NodeUnreachableError);
    }
    expect(() => readyNode(node({ host: null }))).toThrow('node r/0 is not reachable: it records no host');
  });
});
