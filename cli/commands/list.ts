import { shapeOf } from '../../shared/core/messages.ts';
import { isSpareRequestId } from '../../shared/core/minReady.ts';
import { describeShape } from '../../shared/core/shapes.ts';
import { connect, type Target } from '../client.ts';
import { ago, backingJson, nodeJson, requestJson, requestOfNode, table } from '../format.ts';
import { isLive, nodeSummary, print, printJson } from '../output.ts';

export type Listed = 'nodes' | 'backing' | 'requests';

/** `metastatic list nodes|backing|requests`: live ones, or every one with --all. */
export async function list(
  target: Target,
  what: Listed,
  opts: { all?: boolean; json?: boolean },
): Promise<void> {
  const client = await connect(target);
  const now = Date.now();
  try {
    if (what === 'backing') {
      const items = (await client.store.listBacking())
        .filter((b) => opts.all || b.state !== 'stopped')
        .sort((a, b) => a.launchedAt - b.launchedAt);
      if (opts.json) return printJson(items.map(backingJson));
      return print(
        table(
          ['ID', 'LABEL', 'STATE', 'SLOTS', 'HOST:PORT', 'LAUNCHED', 'LAST USED'],
          items.map((b) => [
            b.id,
            b.label,
            b.state,
            `${b.used}/${b.slots}`,
            b.host ? `${b.host}:${b.port}` : '-',
            ago(b.launchedAt, now),
            ago(b.lastUsedAt, now),
          ]),
        ),
      );
    }
    const requests = (await client.store.listRequests()).sort((a, b) => a.createdAt - b.createdAt);
    if (what === 'requests') {
      // The pool's own min-ready requests are not anyone's: their nodes are listed by `list nodes`.
      const shown = requests.filter(
        (r) =>
          opts.all ||
          (!isSpareRequestId(r.id) && (r.nodes.some((n) => isLive(n)) || r.state === 'requested')),
      );
      if (opts.json) return printJson(shown.map(requestJson));
      return print(
        table(
          ['ID', 'STATE', 'LABELS', 'NODES', 'CREATED', 'REASON'],
          shown.map((r) => [
            r.id,
            r.state,
            r.labels.join(',') ||
              (r.shapes ? `by shape: ${r.shapes.map((x) => describeShape(shapeOf(x))).join('; ')}` : ''),
            nodeSummary(r),
            ago(r.createdAt, now),
            r.reason,
          ]),
        ),
      );
    }
    // A spare in use is listed as the node that took it (same slot); a free one with no request.
    const nodes = requests
      .flatMap((r) => r.nodes)
      .filter((n) => opts.all || (isLive(n) && n.takenBy === undefined));
    if (opts.json) return printJson(nodes.map(nodeJson));
    print(
      table(
        ['ID', 'LABEL', 'STATE', 'REQUEST', 'BACKING', 'SLOT', 'HOST:PORT'],
        nodes.map((n) => [
          n.id,
          n.label,
          n.state,
          requestOfNode(n) ?? (n.takenBy ? `(min-ready, taken by ${n.takenBy.node})` : '(min-ready)'),
          n.backingNodeId,
          n.slot,
          n.host ? `${n.host}:${n.port}` : '-',
        ]),
      ),
    );
  } finally {
    client.close();
  }
}
