import { PermanentError, RetryableError } from '../../core/errors.ts';
import { parseNodeId } from '../../core/ids.ts';
import type { BackingRecord } from '../../core/records.ts';
import { hostKeysOf, readyNode } from '../../core/request.ts';
import type { ServeContext } from '../context.ts';
import { type FailBacking, scanKeys } from '../place/backingNodes.ts';
import { failNodes, updateRequestNodes } from '../place/requests.ts';

/**
 * Nodes seen in a state other than pending on a backing node (`<backing-id> <node-id>`), per pool store.
 * A node never goes back to pending, so a later pass over that backing node needs no read for it: the
 * reaper passes over every backing node that became ready lately, on every run, and read every request
 * on it each time (a third of its calls in the chaos suite). Only an optimisation: what is not here (a
 * new process, a cleared set) is read. Bounded: cleared when full.
 */
const settledNodes = new WeakMap<object, Set<string>>();
const SETTLED_MAX = 50_000;

function settledOf(ctx: ServeContext): Set<string> {
  let settled = settledNodes.get(ctx.store);
  if (!settled) {
    settled = new Set();
    settledNodes.set(ctx.store, settled);
  }
  if (settled.size > SETTLED_MAX) settled.clear();
  return settled;
}

/**
 * Marks every pending node on a ready backing node ready, and fulfils the requests whose nodes are
 * now all ready. Called by the fulfil flow and, to close the race with it, by the request flow after
 * it records pending nodes, and after a node moved onto a backing node that became ready meanwhile.
 *
 * With host-key-checking the nodes becoming ready together share one scan of the backing node; a scan
 * that fails fails the backing node through `failBacking` (failure.ts failBackingNode, passed in: it
 * moves this backing node's waiting nodes, which can bring them here again on another backing node).
 */
export async function markNodesReady(
  ctx: ServeContext,
  backing: BackingRecord,
  failBacking: FailBacking,
): Promise<number> {
  const byRequest = new Map<string, string[]>();
  for (const nodeId of Object.values(backing.slotMap)) {
    const parsed = parseNodeId(nodeId);
    if (!parsed) continue;
    byRequest.set(parsed.requestId, [...(byRequest.get(parsed.requestId) ?? []), nodeId]);
  }
  if (byRequest.size === 0) return 0;
  const settled = settledOf(ctx);
  const key = (nodeId: string) => `${backing.id} ${nodeId}`;
  for (const [requestId, nodeIds] of byRequest) {
    if (nodeIds.every((id) => settled.has(key(id)))) byRequest.delete(requestId);
  }
  if (byRequest.size === 0) return 0;
  const pool = ctx.config.metastaticPools.find((p) => p.key === backing.poolKey);
  const label = pool?.labels.get(backing.label);
  let hostKeys = hostKeysOf(backing);
  if (pool && label?.hostKeyChecking && (await anyPendingOn(ctx, backing.id, [...byRequest.keys()]))) {
    try {
      hostKeys = await scanKeys(ctx, pool.bootTimeout, backing);
    } catch (err) {
      if (err instanceof RetryableError) throw err; // out of time: no verdict, the record comes back
      await failBacking(ctx, backing.id, `host-key scan failed: ${(err as Error).message}`);
      return 0;
    }
  }
  const poolAttributes = pool?.nodeAttributes ?? {};
  let count = 0;
  for (const [requestId, nodeIds] of byRequest) {
    try {
      count += await updateRequestNodes(ctx, requestId, (r) => {
        let changed = 0;
        const now = ctx.clock.now();
        const nodes = r.nodes.map((n) => {
          if (n.backingNodeId !== backing.id || n.state !== 'pending') {
            if (nodeIds.includes(n.id)) settled.add(key(n.id));
            return n;
          }
          changed++;
          return readyNode(n, backing, poolAttributes, hostKeys, now);
        });
        return { nodes, changed };
      });
    } catch (err) {
      // The store refuses the ready nodes for good (an item past its size, a value it cannot hold):
      // writing them again cannot succeed, and the request would wait forever. It fails with the
      // reason, giving back its slots; the other requests on this backing node go on.
      if (!(err instanceof PermanentError)) throw err;
      await failNodes(ctx, requestId, unrecordableReason(err), () => true);
    }
  }
  return count;
}

/** Why a request whose nodes the store refuses to record ends. */
export function unrecordableReason(err: Error): string {
  return `the nodes could not be recorded: ${err.message}`;
}

/** Whether any node of these requests still waits on the backing node (a scan is only owed to those). */
async function anyPendingOn(
  ctx: ServeContext,
  backingId: string,
  requestIds: readonly string[],
): Promise<boolean> {
  for (const id of requestIds) {
    const r = await ctx.store.getRequest(id);
    if (r?.nodes.some((n) => n.state === 'pending' && n.backingNodeId === backingId)) return true;
  }
  return false;
}
