import { randomBytes } from 'node:crypto';
import { parseNodeId, requestIdPattern } from '../../shared/core/ids.ts';
import { holdsAnything, renewDecision } from '../../shared/core/leases.ts';
import { MAX_NODE_SET, RenewMessage, RequestMessage } from '../../shared/core/messages.ts';
import { isSpareRequestId } from '../../shared/core/minReady.ts';
import type { PoolStore } from '../../shared/core/poolStore.ts';
import type { NodeRecord, RequestRecord } from '../../shared/core/records.ts';
import { connect, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { nodeJson, requestJson } from '../format.ts';
import { nodeSummary, print, printJson, printRequest, sleep } from '../output.ts';
import { terminalText } from '../terminal.ts';

export interface RequestOptions {
  readonly id?: string;
  readonly requestor: string;
  readonly priority?: number;
  readonly expectedDuration?: number;
  /** Seconds of client lease (renew it with `metastatic renew`). */
  readonly lease?: number;
  /** By shape, instead of labels: what each of `count` nodes needs. */
  readonly cores?: number;
  readonly memory?: string;
  readonly disk?: string;
  readonly count?: number;
  readonly wait?: boolean;
  readonly timeout: number;
  readonly json?: boolean;
}

/** `metastatic request LABEL...`: sends a request message; with --wait, follows it to its end. */
export async function request(target: Target, labels: string[], opts: RequestOptions): Promise<void> {
  const id = opts.id ?? `req-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
  const shaped = opts.cores !== undefined || opts.memory !== undefined || opts.disk !== undefined;
  if (shaped && labels.length > 0)
    throw new CliError('give labels or a shape (--cores, --memory, --disk), not both', 2);
  if (!shaped && labels.length === 0)
    throw new CliError('give the labels to request, or a shape (--cores, --memory, --disk)', 2);
  if (!shaped && opts.count !== undefined)
    throw new CliError(
      '--count goes with a shape (--cores, --memory, --disk); repeat a label to ask for more nodes',
      2,
    );
  const count = opts.count ?? 1;
  if (!Number.isInteger(count) || count < 1 || count > MAX_NODE_SET)
    throw new CliError(`--count must be a whole number from 1 to ${MAX_NODE_SET}`, 2);
  const shape = {
    ...(opts.cores === undefined ? {} : { cores: opts.cores }),
    ...(opts.memory === undefined ? {} : { memory: opts.memory }),
    ...(opts.disk === undefined ? {} : { disk: opts.disk }),
  };
  const parsed = RequestMessage.safeParse({
    kind: 'request',
    id,
    ...(shaped ? { shapes: Array.from({ length: count }, () => shape) } : { labels }),
    requestor: opts.requestor,
    priority: opts.priority,
    ...(opts.expectedDuration === undefined ? {} : { 'expected-duration': opts.expectedDuration }),
    ...(opts.lease === undefined ? {} : { lease: opts.lease }),
  });
  if (!parsed.success) {
    // A shape's issues name the option that set it: `shapes.0.memory` is --memory.
    const where = (path: PropertyKey[]) =>
      path[0] === 'shapes' && typeof path[2] === 'string' ? `--${path[2]}` : path.join('.');
    throw new CliError(
      [...new Set(parsed.error.issues.map((i) => `${where(i.path)}: ${i.message}`))].join('\n'),
      2,
    );
  }
  if (labels.length > MAX_NODE_SET) throw new CliError(`at most ${MAX_NODE_SET} labels per request`, 2);
  const client = await connect(target);
  try {
    await client.send(parsed.data);
    if (!opts.wait) {
      const r = await client.store.getRequest(id);
      const shown = r ? requestJson(r) : { id, state: 'requested', ...sent(parsed.data), nodes: [] };
      if (opts.json) printJson(shown);
      else print(`request ${id} sent (${shown.state}); follow it with: metastatic list requests`);
      return;
    }
    const r = await waitForRequest(client.store, id, opts.timeout);
    if (opts.json)
      printJson(
        r ? requestJson(r) : { id, state: 'requested', ...sent(parsed.data), nodes: [], reason: 'timed out' },
      );
    else if (r) printRequest(r);
    if (r?.state !== 'fulfilled') {
      const why =
        !r || r.state === 'requested' || r.state === 'pending'
          ? `timed out after ${opts.timeout}s`
          : r.reason;
      process.exitCode = 1;
      if (!opts.json)
        process.stderr.write(
          terminalText(`request ${id} ${r?.state === 'failed' ? 'failed' : 'not fulfilled'}: ${why}\n`),
        );
    }
  } finally {
    client.close();
  }
}

/** What a request not recorded yet asked for, as `list requests --json` shows it. */
function sent(m: RequestMessage): { labels: string[]; shapes?: RequestMessage['shapes'] } {
  return m.shapes ? { labels: [], shapes: m.shapes } : { labels: m.labels ?? [] };
}

/** Follows a request until it ends or the timeout passes, with a progress line on stderr. */
async function waitForRequest(
  store: PoolStore,
  id: string,
  timeoutSeconds: number,
): Promise<RequestRecord | undefined> {
  const started = Date.now();
  const tty = process.stderr.isTTY;
  let r: RequestRecord | undefined;
  let shown = '';
  while (Date.now() - started < timeoutSeconds * 1000) {
    r = await store.getRequest(id);
    if (r && (r.state === 'fulfilled' || r.state === 'failed')) break;
    const status = r ? `${r.state}, ${nodeSummary(r)}` : 'queued';
    if (tty) {
      // Our own carriage return and erase-line stay; what the status carries is escaped.
      process.stderr.write(
        `\r${terminalText(`waiting for ${id}: ${status} (${((Date.now() - started) / 1000).toFixed(1)}s)`)}\x1b[K`,
      );
    } else if (status !== shown) {
      process.stderr.write(terminalText(`waiting for ${id}: ${status}\n`));
    }
    shown = status;
    await sleep(100);
  }
  if (tty) process.stderr.write('\r\x1b[K');
  return r;
}

export interface ReleaseOptions {
  readonly timeout: number;
  readonly force?: boolean;
  readonly json?: boolean;
}

/** `metastatic release NODE-ID`: sends a release message and waits until it is applied. */
export async function release(target: Target, nodeIdArg: string, opts: ReleaseOptions): Promise<void> {
  const parsed = parseNodeId(nodeIdArg);
  if (!parsed)
    throw new CliError(`"${nodeIdArg}" is not a node id (node ids look like <request-id>/<index>)`, 2);
  const client = await connect(target);
  try {
    const node = (await client.store.getRequest(parsed.requestId))?.nodes[parsed.index];
    if (!node) throw new CliError(`unknown node ${nodeIdArg}`);
    if (node.held && !opts.force && (node.state === 'ready' || node.state === 'pending')) {
      throw new CliError(`node ${nodeIdArg} is held; release it with --force`);
    }
    if (node.state === 'released' || node.state === 'failed') {
      if (opts.json) printJson(nodeJson(node));
      else print(`${nodeIdArg} was already ${node.state}`);
      return;
    }
    await client.send({ kind: 'release', nodeId: nodeIdArg, ...(opts.force ? { force: true } : {}) });
    const deadline = Date.now() + opts.timeout * 1000;
    let current: NodeRecord | undefined = node;
    while (current && current.state !== 'released' && current.state !== 'failed' && Date.now() < deadline) {
      await sleep(100);
      current = (await client.store.getRequest(parsed.requestId))?.nodes[parsed.index];
    }
    if (!current || (current.state !== 'released' && current.state !== 'failed')) {
      throw new CliError(`release of ${nodeIdArg} was sent but not applied within ${opts.timeout}s`);
    }
    if (opts.json) printJson(nodeJson(current));
    else print(current.state === 'released' ? `released ${nodeIdArg}` : `${nodeIdArg} is ${current.state}`);
  } finally {
    client.close();
  }
}

export interface CancelOptions {
  readonly reason?: string;
  readonly timeout: number;
  readonly json?: boolean;
}

/**
 * `metastatic cancel <request-id>`: sends a cancel message and waits until the request has ended. Exit 0
 * when it ended cancelled (now or before); 1 when it had ended otherwise (fulfilled: release its nodes).
 */
export async function cancel(target: Target, requestId: string, opts: CancelOptions): Promise<void> {
  checkClientRequestId(requestId);
  const client = await connect(target);
  try {
    const ended = (r: RequestRecord | undefined) => r?.state === 'fulfilled' || r?.state === 'failed';
    let current = await client.store.getRequest(requestId);
    if (!ended(current)) {
      await client.send({ kind: 'cancel', id: requestId, ...(opts.reason ? { reason: opts.reason } : {}) });
      const deadline = Date.now() + opts.timeout * 1000;
      while (!ended(current) && Date.now() < deadline) {
        await sleep(100);
        current = await client.store.getRequest(requestId);
      }
      if (!current || !ended(current)) {
        throw new CliError(`cancel of ${requestId} was sent but not applied within ${opts.timeout}s`);
      }
    }
    const r = current as RequestRecord;
    if (opts.json) printJson(requestJson(r));
    else printRequest(r);
    if (!(r.state === 'failed' && r.reason?.startsWith('cancelled'))) {
      throw new CliError(
        r.state === 'fulfilled'
          ? `request ${requestId} was already fulfilled: release its nodes instead`
          : `request ${requestId} had already ended: ${r.state}`,
      );
    }
  } finally {
    client.close();
  }
}

export interface RenewOptions {
  readonly lease?: number;
  readonly timeout: number;
  readonly json?: boolean;
}

/**
 * `metastatic renew <request-id>`: sends a renew message and waits until the request function applied it
 * (its lease expiry moved). Exit 2 for a bad id or length; 1 when the request is unknown, has ended, has
 * no lease, or its lease already lapsed (checked before sending: nothing is sent for an ended request),
 * or when the renewal was not applied in time (the pool refused it: a length above max-lease).
 */
export async function renew(target: Target, requestId: string, opts: RenewOptions): Promise<void> {
  const parsed = RenewMessage.safeParse({
    kind: 'renew',
    id: requestId,
    ...(opts.lease === undefined ? {} : { lease: opts.lease }),
  });
  if (!parsed.success) {
    throw new CliError(
      [...new Set(parsed.error.issues.map((i) => `${i.path.join('.') || 'renew'}: ${i.message}`))].join('\n'),
      2,
    );
  }
  const client = await connect(target);
  try {
    const before = await client.store.getRequest(requestId);
    // The pool checks max-lease itself; here only what the record says (no configuration needed).
    const decision = renewDecision(requestId, before, Date.now(), opts.lease, {});
    if (decision.kind === 'refuse') throw new CliError(decision.reason);
    await client.send(parsed.data);
    const deadline = Date.now() + opts.timeout * 1000;
    let current = before;
    const moved = (r: RequestRecord | undefined) =>
      r?.leaseExpiresAt !== before?.leaseExpiresAt ||
      r?.leaseLapsedAt !== undefined ||
      !r ||
      !holdsAnything(r);
    while (!moved(current) && Date.now() < deadline) {
      await sleep(100);
      current = await client.store.getRequest(requestId);
    }
    if (!current || current.leaseLapsedAt !== undefined || !holdsAnything(current)) {
      throw new CliError(`request ${requestId} ended before the renewal was applied: its lease lapsed`);
    }
    if (current.leaseExpiresAt === before?.leaseExpiresAt) {
      throw new CliError(
        `renewal of ${requestId} was sent but not applied within ${opts.timeout}s (refused? a lease above max-lease is; see the pool's log)`,
      );
    }
    if (opts.json) printJson(requestJson(current));
    else
      print(
        `renewed ${requestId}: lease ${current.lease} s, until ${new Date(current.leaseExpiresAt as number).toISOString()}`,
      );
  } finally {
    client.close();
  }
}

export interface ReleaseRequestOptions {
  readonly force?: boolean;
  readonly timeout: number;
  readonly json?: boolean;
}

/**
 * `metastatic release --request <id>`: sends one release message for every node of the request and waits
 * until no node it releases is left (held ones are kept without --force). Idempotent: an ended request is
 * printed as it is. Exit 2 for a bad id, 1 for an unknown request.
 */
export async function releaseRequest(
  target: Target,
  requestId: string,
  opts: ReleaseRequestOptions,
): Promise<void> {
  checkClientRequestId(requestId);
  const client = await connect(target);
  try {
    const left = (r: RequestRecord | undefined) =>
      r !== undefined &&
      (r.state === 'requested' ||
        (r.state !== 'failed' &&
          r.nodes.some((n) => (n.state === 'pending' || n.state === 'ready') && (opts.force || !n.held))));
    let current = await client.store.getRequest(requestId);
    if (!current) throw new CliError(`unknown request ${requestId}`);
    if (left(current)) {
      await client.send({ kind: 'release', id: requestId, ...(opts.force ? { force: true } : {}) });
      const deadline = Date.now() + opts.timeout * 1000;
      while (left(current) && Date.now() < deadline) {
        await sleep(100);
        current = await client.store.getRequest(requestId);
      }
      if (left(current)) {
        throw new CliError(
          `release of request ${requestId} was sent but not applied within ${opts.timeout}s`,
        );
      }
    }
    const r = current as RequestRecord;
    if (opts.json) printJson(requestJson(r));
    else {
      printRequest(r);
      const kept = r.nodes.filter((n) => n.held && (n.state === 'pending' || n.state === 'ready'));
      if (kept.length > 0) print(`kept held ${kept.map((n) => n.id).join(', ')}: release with --force`);
    }
  } finally {
    client.close();
  }
}

/** A request id a message may name: not one of the pool's own min-ready requests (usage error, exit 2). */
function checkClientRequestId(requestId: string): void {
  if (!requestIdPattern.test(requestId)) throw new CliError(`"${requestId}" is not a request id`, 2);
  if (isSpareRequestId(requestId)) {
    throw new CliError(
      `"${requestId}" is one of the pool's own min-ready requests: no message may end it`,
      2,
    );
  }
}
