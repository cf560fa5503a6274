import { NodeUnreachableError } from './errors.ts';
import type { PoolNode } from './records.ts';

/**
 * A node as `run` gives it to its job, ready: where and as whom to log in (`host`, `port`, `username`)
 * are known, so no job has to test them for null again.
 */
export type ReadyNode = PoolNode & {
  readonly host: string;
  readonly port: number;
  readonly username: string;
};

/** The node as a ReadyNode, checked once: NodeUnreachableError for one that lacks any of them. */
export function readyNode(n: PoolNode): ReadyNode {
  const missing = !n.host ? 'host' : n.port === null ? 'port' : !n.username ? 'username' : undefined;
  if (missing) throw new NodeUnreachableError(`node ${n.id} is not reachable: it records no ${missing}`);
  return n as ReadyNode;
}
