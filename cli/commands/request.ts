import { InvalidInputError, RequestFailedError, TimeoutError } from '../../client/errors.ts';
import {
  checkClientRequestId,
  checkNodeId,
  type RequestSpec,
  renewMessage,
  requestMessage,
} from '../../client/messages.ts';
import { PoolClient } from '../../client/poolClient.ts';
import type { PoolRequest } from '../../client/records.ts';
import { MAX_NODE_SET } from '../../shared/core/messages.ts';
import { poolTarget, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { nodeSummary, print, printJson, printRequest, requestState } from '../output.ts';
import { terminalText } from '../terminal.ts';

/*
 * The request, release, renew and cancel commands: argument checks and printing here, the work in the
 * client library (client/poolClient.ts), which `metastatic run` and library users share.
 */

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

/** Connects, runs `work` with the client, closes. */
async function withPool<T>(target: Target, work: (pool: PoolClient) => Promise<T>): Promise<T> {
  const pool = await PoolClient.connect(poolTarget(target));
  try {
    return await work(pool);
  } finally {
    pool.close();
  }
}

/**
 * The request spec of the CLI's labels and options, checked as the command line has them (a shape's
 * fields named by their options); exit 2 for what the command line got wrong.
 */
export function requestSpecOf(labels: readonly string[], opts: Omit<RequestOptions, 'timeout'>): RequestSpec {
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
  if (
    opts.count !== undefined &&
    (!Number.isInteger(opts.count) || opts.count < 1 || opts.count > MAX_NODE_SET)
  )
    throw new CliError(`--count must be a whole number from 1 to ${MAX_NODE_SET}`, 2);
  if (labels.length > MAX_NODE_SET) throw new CliError(`at most ${MAX_NODE_SET} labels per request`, 2);
  return {
    ...(opts.id === undefined ? {} : { id: opts.id }),
    ...(shaped
      ? {
          shape: {
            ...(opts.cores === undefined ? {} : { cores: opts.cores }),
            ...(opts.memory === undefined ? {} : { memory: opts.memory }),
            ...(opts.disk === undefined ? {} : { disk: opts.disk }),
          },
          ...(opts.count === undefined ? {} : { count: opts.count }),
        }
      : { labels }),
    requestor: opts.requestor,
    ...(opts.priority === undefined ? {} : { priority: opts.priority }),
    ...(opts.expectedDuration === undefined ? {} : { expectedDuration: opts.expectedDuration }),
    ...(opts.lease === undefined ? {} : { lease: opts.lease }),
  };
}

/** The library's refusal of a spec, its fields named as the command line's options (`shapes.0.memory` is --memory). */
export function asUsageError(err: unknown): unknown {
  if (!(err instanceof InvalidInputError) || err.issues.length === 0) return err;
  const where = (path: string) => /^shapes\.\d+\.(\w+)$/.exec(path)?.[1];
  const lines = err.issues.map((i) => `${where(i.path) ? `--${where(i.path)}` : i.path}: ${i.message}`);
  return new CliError([...new Set(lines)].join('\n'), 2);
}

/** `metastatic request LABEL...`: sends a request message; with --wait, follows it to its end. */
export async function request(target: Target, labels: string[], opts: RequestOptions): Promise<void> {
  const spec = requestSpecOf(labels, opts);
  // Checked before connecting: a bad spec exits 2 whether a pool runs or not.
  try {
    requestMessage(spec);
  } catch (err) {
    throw asUsageError(err);
  }
  await withPool(target, async (pool) => {
    const sent = await pool.request(spec);
    if (!opts.wait) {
      if (opts.json) printJson(sent);
      else print(`request ${sent.id} sent (${sent.state}); follow it with: metastatic list requests`);
      return;
    }
    let r: PoolRequest | undefined;
    let why: string;
    const progress = waitProgress(sent.id);
    try {
      r = await pool.waitFor(sent.id, { timeout: opts.timeout, onProgress: progress.show });
      progress.done();
    } catch (err) {
      progress.done();
      if (err instanceof RequestFailedError) {
        r = err.request;
        why = err.reason;
      } else if (err instanceof TimeoutError) {
        r = err.request;
        why = `timed out after ${opts.timeout}s`;
      } else throw err;
      if (opts.json) printJson(r ?? { ...sent, reason: 'timed out' });
      else {
        if (r) printRequest(r);
        process.stderr.write(
          terminalText(`request ${sent.id} ${r?.state === 'failed' ? 'failed' : 'not fulfilled'}: ${why}\n`),
        );
      }
      process.exitCode = 1;
      return;
    }
    if (opts.json) printJson(r);
    else printRequest(r);
  });
}

/**
 * A wait's progress line on stderr: redrawn in place on a terminal (with the time waited), one line per
 * change elsewhere. What a status carries is escaped; our own carriage return and erase-line stay.
 */
export function waitProgress(id: string) {
  const tty = process.stderr.isTTY;
  let shown = false;
  return {
    show(r: PoolRequest | undefined, elapsedMs: number) {
      const status = r ? `${r.state}, ${nodeSummary(r)}` : 'queued';
      shown = true;
      if (tty) {
        process.stderr.write(
          `\r${terminalText(`waiting for ${id}: ${status} (${(elapsedMs / 1000).toFixed(1)}s)`)}\x1b[K`,
        );
      } else process.stderr.write(terminalText(`waiting for ${id}: ${status}\n`));
    },
    done() {
      if (tty && shown) process.stderr.write('\r\x1b[K');
      shown = false;
    },
  };
}

export interface ReleaseOptions {
  readonly timeout: number;
  readonly force?: boolean;
  readonly json?: boolean;
}

/** `metastatic release NODE-ID`: sends a release message and waits until it is applied. */
export async function release(target: Target, nodeIdArg: string, opts: ReleaseOptions): Promise<void> {
  checkNodeId(nodeIdArg);
  await withPool(target, async (pool) => {
    const { node, alreadyEnded } = await pool.releaseNode(nodeIdArg, opts).catch((err: unknown) => {
      if ((err as Error).name === 'NodeHeldError') {
        throw new CliError(`node ${nodeIdArg} is held; release it with --force`);
      }
      throw err;
    });
    if (opts.json) printJson(node);
    else if (alreadyEnded) print(`${nodeIdArg} was already ${node.state}`);
    else print(node.state === 'released' ? `released ${nodeIdArg}` : `${nodeIdArg} is ${node.state}`);
  });
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
  await withPool(target, async (pool) => {
    const r = await pool.cancel(requestId, opts);
    if (opts.json) printJson(r);
    else printRequest(r);
    if (!(r.state === 'failed' && r.reason?.startsWith('cancelled'))) {
      throw new CliError(
        r.state === 'fulfilled'
          ? requestState(r) === 'released'
            ? `request ${requestId} was already fulfilled, and released`
            : `request ${requestId} was already fulfilled: release its nodes instead`
          : `request ${requestId} had already ended: ${r.state}`,
      );
    }
  });
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
  renewMessage(requestId, opts.lease);
  await withPool(target, async (pool) => {
    const current = await pool.renew(requestId, opts);
    if (opts.json) printJson(current);
    else print(`renewed ${requestId}: lease ${current.lease} s, until ${current.leaseExpiresAt}`);
  });
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
  await withPool(target, async (pool) => {
    const r = await pool.releaseRequest(requestId, opts);
    if (opts.json) printJson(r);
    else {
      printRequest(r);
      const kept = r.nodes.filter((n) => n.held && (n.state === 'pending' || n.state === 'ready'));
      if (kept.length > 0) print(`kept held ${kept.map((n) => n.id).join(', ')}: release with --force`);
    }
  });
}
