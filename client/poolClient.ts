import { join } from 'node:path';
import { holdsAnything, renewDecision } from '../shared/core/leases.ts';
import type { RequestMessage } from '../shared/core/messages.ts';
import { UNKNOWN_LABEL_REASON } from '../shared/core/pools.ts';
import type { RequestRecord } from '../shared/core/records.ts';
import { openConnection, type PoolConnection, type PoolTarget } from './connection.ts';
import {
  AbortedError,
  MetastaticError,
  NodeHeldError,
  NodeLostError,
  NodeNotFoundError,
  PoolStoppedError,
  RenewRefusedError,
  RequestExistsError,
  RequestFailedError,
  RequestNotFoundError,
  TimeoutError,
  UnknownLabelError,
} from './errors.ts';
import { checkNodesHeld, EMBEDDED_WATCH_MS, keepLease, sleep, throwIfAborted } from './leaseKeeper.ts';
import {
  checkClientRequestId,
  checkNodeId,
  type RequestSpec,
  renewMessage,
  requestMessage,
} from './messages.ts';
import { IdentityError, runSsh, type SshLogin, type SshRunOptions } from './openssh.ts';
import {
  DEFAULT_RUN_LEASE,
  type RunContext,
  type RunOptions,
  type WaitForOptions,
  type WaitOptions,
} from './options.ts';
import { POLL_MS, PoolAccess } from './poolAccess.ts';
import { type ReadyNode, readyNode } from './readyNode.ts';
import { type PoolNode, type PoolRequest, toPoolNode, toPoolRequest } from './records.ts';

/**
 * A client of a metastatic pool, embedded or deployed: sends request, release, cancel and renew messages
 * to its request queue and reads their outcome from its table (poolAccess.ts; docs/client.md).
 *
 * ```ts
 * const pool = await PoolClient.connect({ stateDir: '.metastatic' });
 * try {
 *   const code = await pool.run({ labels: ['small-node'] }, async ([node]) => runMyJob(node));
 * } finally {
 *   pool.close();
 * }
 * ```
 */
export class PoolClient {
  private readonly access: PoolAccess;

  private constructor(
    /** The store and the queue; for reads this class does not offer (the CLI's list and status). */
    readonly connection: PoolConnection,
  ) {
    this.access = new PoolAccess(connection);
  }

  /** Connects to the pool of `target` (default: the embedded pool of $METASTATIC_STATE_DIR or .metastatic). */
  static async connect(target: PoolTarget = {}): Promise<PoolClient> {
    return new PoolClient(await openConnection(target));
  }

  /** Closes the AWS SDK clients. */
  close(): void {
    this.connection.close();
  }

  /** The embedded pool's client key (`<stateDir>/client_ed25519`, shared/runtime/clientKey.ts); a stack has none. */
  get identity(): string | undefined {
    const { pool } = this.connection;
    return pool.kind === 'embedded' ? join(pool.info.stateDir, 'client_ed25519') : undefined;
  }

  /** runSsh (openssh.ts), logging in with this pool's `identity` unless given one (required for a stack). */
  async runSsh(
    login: SshLogin,
    remote: readonly string[],
    opts: Omit<SshRunOptions, 'identity'> & { readonly identity?: string | undefined } = {},
  ): ReturnType<typeof runSsh> {
    const identity = opts.identity ?? this.identity;
    if (!identity) throw new IdentityError('a deployed pool has no client key of its own: pass an identity');
    return runSsh(login, remote, { ...opts, identity });
  }

  /** The request as recorded now, or undefined when the pool has not recorded it (yet). */
  async get(requestId: string): Promise<PoolRequest | undefined> {
    const r = await this.access.read(requestId);
    return r && toPoolRequest(r);
  }

  /** The node as recorded now. */
  async getNode(nodeId: string): Promise<PoolNode> {
    const parsed = checkNodeId(nodeId);
    const node = (await this.access.read(parsed.requestId))?.nodes[parsed.index];
    if (!node) throw new NodeNotFoundError(nodeId);
    return toPoolNode(node);
  }

  /**
   * Sends a request; returns it as recorded, or (not recorded yet) as `{ id, state: 'requested', labels,
   * nodes: [] }`. Throws InvalidInputError, sending nothing, for a spec no message may carry.
   */
  async request(spec: RequestSpec): Promise<PoolRequest> {
    const message = requestMessage(spec);
    await this.access.send(message);
    return (await this.get(message.id)) ?? provisional(message);
  }

  /**
   * Waits until the request is fulfilled and returns it. Throws RequestFailedError (UnknownLabelError for
   * labels the pool lacks) with the pool's reason when it fails, TimeoutError when `timeout` passes first,
   * AbortedError when `signal` fires, PoolStoppedError when the embedded pool stops meanwhile.
   */
  async waitFor(requestId: string, opts: WaitForOptions = {}): Promise<PoolRequest> {
    const timeout = opts.timeout ?? 300;
    const started = Date.now();
    let shown: string | undefined;
    let checked = started;
    for (;;) {
      throwIfAborted(opts.signal);
      const r = await this.access.read(requestId);
      if (r?.state === 'fulfilled') return toPoolRequest(r);
      if (r?.state === 'failed') throw failure(toPoolRequest(r));
      const now = Date.now();
      const status = r ? `${r.state} ${r.nodes.map((n) => n.state).join(',')}` : 'queued';
      if (status !== shown) opts.onProgress?.(r && toPoolRequest(r), now - started);
      shown = status;
      if (now - started >= timeout * 1000) {
        throw new TimeoutError(
          `request ${requestId} not fulfilled within ${timeout} s`,
          timeout,
          r && toPoolRequest(r),
        );
      }
      if (now - checked >= EMBEDDED_WATCH_MS) {
        checked = now;
        await this.connection.checkRunning();
      }
      await sleep(POLL_MS, opts.signal);
    }
  }

  /**
   * Renews the request's lease from now, by its own length or `lease` seconds, and waits until the pool
   * applied it (its expiry moved); returns the request. Refused before anything is sent
   * (RenewRefusedError) when the request has ended, has no lease, or its lease lapsed; RequestNotFoundError
   * for an unknown one. With `wait: false`, only sends.
   */
  async renew(
    requestId: string,
    opts: WaitOptions & { readonly lease?: number; readonly wait?: boolean } = {},
  ): Promise<PoolRequest> {
    const message = renewMessage(requestId, opts.lease);
    const before = await this.access.read(requestId);
    if (!before) throw new RequestNotFoundError(requestId, `unknown request "${requestId}"`);
    // The pool checks max-lease itself; here only what the record says (no configuration needed).
    const decision = renewDecision(requestId, before, Date.now(), opts.lease, {});
    if (decision.kind === 'refuse') throw new RenewRefusedError(requestId, decision.reason);
    await this.access.send(message);
    if (opts.wait === false) return toPoolRequest(before);
    const timeout = opts.timeout ?? 30;
    const moved = (r: RequestRecord | undefined) =>
      !r || r.leaseExpiresAt !== before.leaseExpiresAt || r.leaseLapsedAt !== undefined || !holdsAnything(r);
    const current = await this.access.poll(requestId, moved, timeout, opts.signal);
    if (!current || current.leaseLapsedAt !== undefined || !holdsAnything(current)) {
      throw new RenewRefusedError(
        requestId,
        `request ${requestId} ended before the renewal was applied: its lease lapsed`,
      );
    }
    if (current.leaseExpiresAt === before.leaseExpiresAt) {
      throw new TimeoutError(
        `renewal of ${requestId} was sent but not applied within ${timeout}s (refused? a lease above max-lease is; see the pool's log)`,
        timeout,
        toPoolRequest(current),
      );
    }
    return toPoolRequest(current);
  }

  /**
   * Releases one node and waits until it is released (or failed); `alreadyEnded` when it was before.
   * NodeNotFoundError for an unknown node, NodeHeldError for a held one without `force`.
   */
  async releaseNode(
    nodeId: string,
    opts: WaitOptions & { readonly force?: boolean } = {},
  ): Promise<{ node: PoolNode; alreadyEnded: boolean }> {
    const parsed = checkNodeId(nodeId);
    const ended = (n: { state: string } | undefined) => n?.state === 'released' || n?.state === 'failed';
    const node = (await this.access.read(parsed.requestId))?.nodes[parsed.index];
    if (!node) throw new NodeNotFoundError(nodeId);
    if (node.held && !opts.force && (node.state === 'ready' || node.state === 'pending')) {
      throw new NodeHeldError(nodeId);
    }
    if (ended(node)) return { node: toPoolNode(node), alreadyEnded: true };
    await this.access.send({ kind: 'release', nodeId, ...(opts.force ? { force: true } : {}) });
    const timeout = opts.timeout ?? 30;
    const r = await this.access.poll(
      parsed.requestId,
      (r) => ended(r?.nodes[parsed.index]),
      timeout,
      opts.signal,
    );
    const current = r?.nodes[parsed.index];
    if (!current || !ended(current)) {
      throw new TimeoutError(`release of ${nodeId} was sent but not applied within ${timeout}s`, timeout);
    }
    return { node: toPoolNode(current), alreadyEnded: false };
  }

  /**
   * Releases every node of the request in one message and waits until none it releases is left (held
   * nodes are kept without `force`; a request still waiting ends failed). Idempotent: an ended request is
   * returned as it is. RequestNotFoundError for an unknown request.
   */
  async releaseRequest(
    requestId: string,
    opts: WaitOptions & { readonly force?: boolean } = {},
  ): Promise<PoolRequest> {
    checkClientRequestId(requestId);
    const left = (r: RequestRecord | undefined) =>
      r !== undefined &&
      (r.state === 'requested' ||
        (r.state !== 'failed' &&
          r.nodes.some((n) => (n.state === 'pending' || n.state === 'ready') && (opts.force || !n.held))));
    const before = await this.access.read(requestId);
    if (!before) throw new RequestNotFoundError(requestId);
    if (!left(before)) return toPoolRequest(before);
    await this.access.send({ kind: 'release', id: requestId, ...(opts.force ? { force: true } : {}) });
    const timeout = opts.timeout ?? 30;
    const current = await this.access.poll(requestId, (r) => !left(r), timeout, opts.signal);
    if (left(current) || !current) {
      throw new TimeoutError(
        `release of request ${requestId} was sent but not applied within ${timeout}s`,
        timeout,
        current && toPoolRequest(current),
      );
    }
    return toPoolRequest(current);
  }

  /**
   * Ends a request that is not fulfilled yet and waits until it has ended; returns it (ended cancelled,
   * or as it had ended before: a fulfilled request's nodes are to be released instead).
   */
  async cancel(
    requestId: string,
    opts: WaitOptions & { readonly reason?: string } = {},
  ): Promise<PoolRequest> {
    checkClientRequestId(requestId);
    const ended = (r: RequestRecord | undefined) => r?.state === 'fulfilled' || r?.state === 'failed';
    let current = await this.access.read(requestId);
    if (!ended(current)) {
      await this.access.send({
        kind: 'cancel',
        id: requestId,
        ...(opts.reason ? { reason: opts.reason } : {}),
      });
      const timeout = opts.timeout ?? 30;
      current = await this.access.poll(requestId, ended, timeout, opts.signal);
      if (!current || !ended(current)) {
        throw new TimeoutError(`cancel of ${requestId} was sent but not applied within ${timeout}s`, timeout);
      }
    }
    return toPoolRequest(current as RequestRecord);
  }

  /**
   * Requests nodes with a lease, waits for them, runs `job` with them while renewing the lease (every
   * third of it), and releases the whole request whatever happens: the job's return, its error, the
   * caller's abort, a failed wait. Returns what the job returned.
   *
   * The job's `signal` fires when the pool stops (PoolStoppedError) or a node is ended under it
   * (NodeLostError): `run` then throws that error once the job has returned. The caller's own abort makes
   * `run` throw AbortedError (after the release). An id already in the table before this call sent its
   * request is someone else's: RequestExistsError, nothing sent, unless `attach`.
   */
  async run<T>(
    spec: RequestSpec,
    job: (nodes: ReadyNode[], context: RunContext) => Promise<T>,
    opts: RunOptions = {},
  ): Promise<T> {
    const lease = spec.lease ?? opts.lease ?? DEFAULT_RUN_LEASE;
    const message = requestMessage({ ...spec, lease });
    const stop = new AbortController();
    const onAbort = () => stop.abort(new AbortedError(opts.signal?.reason));
    if (opts.signal?.aborted) throw new AbortedError(opts.signal.reason);
    // Checked before sending, once: what is recorded after is ours (a resent message included).
    if (!opts.attach && (await this.access.read(message.id))) throw new RequestExistsError(message.id);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    await this.access.send(message);
    const keeper = keepLease(
      {
        pool: this.connection.pool.kind,
        checkRunning: () => this.connection.checkRunning(),
        read: (id) => this.access.read(id),
        renew: (id) => this.access.send({ kind: 'renew', id }),
      },
      message.id,
      opts.renewEvery ?? (lease * 1000) / 3,
      stop,
    );
    let outcome: { ok: true; value: T } | { ok: false; error: unknown };
    try {
      const request = await this.waitFor(message.id, { ...opts, signal: stop.signal }).catch((err) => {
        throw stop.signal.aborted ? stop.signal.reason : err;
      });
      keeper.watch(request);
      const value = await job(request.nodes.map(readyNode), { request, signal: stop.signal });
      outcome = stop.signal.aborted ? { ok: false, error: stop.signal.reason } : { ok: true, value };
    } catch (err) {
      // A job that failed because its signal fired failed for the signal's reason.
      const error = stop.signal.aborted && !(err instanceof MetastaticError) ? stop.signal.reason : err;
      outcome = { ok: false, error };
    }
    opts.signal?.removeEventListener('abort', onAbort);
    await keeper.stop();
    let releaseFailure: { error: unknown } | undefined;
    try {
      await this.end(message.id, opts.releaseTimeout ?? 30);
    } catch (error) {
      releaseFailure = { error };
    }
    if (releaseFailure) {
      if (opts.onReleaseError) opts.onReleaseError(releaseFailure.error);
      else if (outcome.ok) throw releaseFailure.error;
    }
    if (!outcome.ok) throw outcome.error;
    return outcome.value;
  }

  /**
   * Ends a request `run` made, whatever state it is in: releases its nodes, and cancels it if the pool has
   * not recorded it yet (its message, when it comes, is then refused; one placed meanwhile is released).
   */
  private async end(requestId: string, timeout: number): Promise<void> {
    if ((await this.access.read(requestId)) === undefined) {
      const ended = await this.cancel(requestId, {
        timeout,
        reason: 'its client ended before it was recorded',
      });
      if (ended.state !== 'fulfilled') return;
    }
    await this.releaseRequest(requestId, { timeout });
  }

  /**
   * Throws PoolStoppedError when the pool has stopped, NodeLostError when a node of the fulfilled request
   * is no longer ready (or its lease lapsed). For up to `settleMs` it looks again while neither shows
   * (a pool stopping closes its connections before it records anything): a job whose connection dropped
   * learns why.
   */
  async checkHeld(requestId: string, settleMs = 0): Promise<void> {
    const deadline = Date.now() + settleMs;
    for (;;) {
      try {
        await this.connection.checkRunning();
        const r = await this.access.read(requestId);
        if (r) checkNodesHeld(r);
      } catch (err) {
        if (err instanceof PoolStoppedError || err instanceof NodeLostError) throw err;
        // Anything else (a table closing under the read) says nothing yet: look again.
      }
      if (Date.now() >= deadline) return;
      await sleep(200);
    }
  }
}

/** What a request not recorded yet asked for, as `get` would show it. */
function provisional(m: RequestMessage): PoolRequest {
  return {
    id: m.id,
    state: 'requested',
    labels: m.shapes ? [] : (m.labels ?? []),
    ...(m.shapes ? { shapes: m.shapes } : {}),
    nodes: [],
  };
}

function failure(r: PoolRequest): RequestFailedError {
  return r.reason?.startsWith(UNKNOWN_LABEL_REASON) ? new UnknownLabelError(r) : new RequestFailedError(r);
}
