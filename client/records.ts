import { parseNodeId } from '../shared/core/ids.ts';
import { isSpareRequestId } from '../shared/core/minReady.ts';
import type { NodeRecord, RequestRecord } from '../shared/core/records.ts';

/**
 * The public shapes of a node and a request: what `metastatic/client` returns and what the CLI prints with
 * --json (documented in docs/cli.md and docs/client.md). Built from the pool's records, without what only
 * the pool reasons about (owner tokens, body hashes, claims).
 */

/** The request a node serves: undefined for a spare (the pool's own, core/minReady.ts). */
export function requestOfNode(n: NodeRecord): string | undefined {
  const requestId = parseNodeId(n.id)?.requestId;
  return requestId === undefined || isSpareRequestId(requestId) ? undefined : requestId;
}

export function toPoolNode(n: NodeRecord) {
  return {
    id: n.id,
    label: n.label,
    state: n.state,
    /** null for a spare: it serves no request (yet). */
    request: requestOfNode(n) ?? null,
    backingNodeId: n.backingNodeId ?? null,
    slot: n.slot ?? null,
    host: n.host ?? null,
    port: n.port ?? null,
    /** The node contract (core/contract.ts), null until the node is ready; shellType null means sh. */
    username: n.username ?? null,
    connectionType: n.connectionType ?? null,
    pythonPath: n.pythonPath ?? null,
    shellType: n.shellType ?? null,
    attributes: n.attributes ?? {},
    hostKeys: n.hostKeys ?? [],
    ...(n.held ? { held: true } : {}),
    ...(n.reason ? { reason: n.reason } : {}),
    /** A node on a spare's slot: that node; a spare in use: the node using it. */
    ...(n.spare ? { minReadyNode: n.spare } : {}),
    ...(n.takenBy ? { takenBy: n.takenBy.node } : {}),
  };
}

/** A node as `metastatic/client` returns it (and `--json` prints it). */
export type PoolNode = ReturnType<typeof toPoolNode>;

export function toPoolRequest(r: RequestRecord) {
  return {
    id: r.id,
    state: r.state,
    labels: r.labels,
    ...(r.shapes ? { shapes: r.shapes } : {}),
    nodes: r.nodes.map(toPoolNode),
    ...(r.reason ? { reason: r.reason } : {}),
    ...(r.lease === undefined ? {} : { lease: r.lease }),
    ...(r.leaseExpiresAt === undefined ? {} : { leaseExpiresAt: new Date(r.leaseExpiresAt).toISOString() }),
    ...(r.leaseLapsedAt === undefined ? {} : { leaseLapsedAt: new Date(r.leaseLapsedAt).toISOString() }),
  };
}

/** A request as `metastatic/client` returns it (and `--json` prints it). */
export type PoolRequest = ReturnType<typeof toPoolRequest>;
