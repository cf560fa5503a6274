import type { PoolNode, PoolRequest } from './records.ts';

/**
 * The errors of `metastatic/client`. Every one is a MetastaticError with `name` set to its class name, so
 * a caller can tell them apart with `instanceof` (or by `name` across realms); the pool's own reasons
 * (a request's `reason`, a node's) are carried as they were recorded. `cause` is passed through.
 */
export class MetastaticError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * The caller asked for something no message may carry: a bad id, label list, shape, lease... Nothing was
 * sent. `issues` names each field (`shapes.0.memory`, `lease`) and what is wrong with it.
 */
export class InvalidInputError extends MetastaticError {
  constructor(
    message: string,
    readonly issues: readonly { readonly path: string; readonly message: string }[] = [],
  ) {
    super(message);
  }
}

/** No pool to talk to: no running `metastatic dev` on the state dir, or a stack that is not a pool. */
export class PoolNotFoundError extends MetastaticError {}

/**
 * The pool stopped while this client was using it: the embedded pool's process ended (its dev.json is
 * gone or names a dead process), or the stack's queue or table no longer exists.
 */
export class PoolStoppedError extends MetastaticError {}

/** No such request. */
export class RequestNotFoundError extends MetastaticError {
  constructor(
    readonly requestId: string,
    message = `unknown request ${requestId}`,
  ) {
    super(message);
  }
}

/**
 * `run` was given the id of a request already in the table, which this call did not send: someone
 * else's (a CI job id reused by accident). Running on it would end, then release, their nodes; `attach`
 * takes it over on purpose. Nothing was sent.
 */
export class RequestExistsError extends MetastaticError {
  constructor(readonly requestId: string) {
    super(`request ${requestId} already exists: it is not this run's to use and release`);
  }
}

/** No such node (an unknown request, or an index the request does not have). */
export class NodeNotFoundError extends MetastaticError {
  constructor(
    readonly nodeId: string,
    message = `unknown node ${nodeId}`,
  ) {
    super(message);
  }
}

/** The request ended `failed`: `reason` is the pool's (e.g. `unknown label "x" (configured: ...)`). */
export class RequestFailedError extends MetastaticError {
  readonly reason: string;
  constructor(readonly request: PoolRequest) {
    const reason = request.reason ?? 'failed';
    super(`request ${request.id} failed: ${reason}`);
    this.reason = reason;
  }
}

/**
 * A request for labels the pool's configuration does not have: a RequestFailedError (the pool recorded
 * the failure) that no retry can mend. The CLI treats it as a usage error.
 */
export class UnknownLabelError extends RequestFailedError {}

/**
 * A node this client held was ended under it: released by someone else, failed with its backing node,
 * or released by the reaper when the request's lease lapsed. `node.reason` says which.
 */
export class NodeLostError extends MetastaticError {
  constructor(
    readonly node: PoolNode,
    message = `node ${node.id} is ${node.state}${node.reason ? ` (${node.reason})` : ''}`,
  ) {
    super(message);
  }
}

/** What was waited for did not happen within the timeout (`seconds`); the message says what it was. */
export class TimeoutError extends MetastaticError {
  constructor(
    message: string,
    readonly seconds: number,
    /** The request as last read, when the wait was for one (undefined: not recorded yet). */
    readonly request?: PoolRequest,
  ) {
    super(message);
  }
}

/** The caller's AbortSignal fired; `reason` is the signal's reason. */
export class AbortedError extends MetastaticError {
  constructor(readonly reason: unknown) {
    super(`aborted${reason instanceof Error ? `: ${reason.message}` : reason ? `: ${String(reason)}` : ''}`);
  }
}

/** A node held by an operator: releasing it needs `force`. */
export class NodeHeldError extends MetastaticError {
  constructor(readonly nodeId: string) {
    super(`node ${nodeId} is held; release it with force`);
  }
}

/**
 * A renewal the pool will not apply: the request has ended, has no lease, or its lease already lapsed
 * (its nodes are, or are being, released). Nothing is revived.
 */
export class RenewRefusedError extends MetastaticError {
  constructor(
    readonly requestId: string,
    readonly reason: string,
  ) {
    super(reason);
  }
}

/** A node cannot be logged in to: it records no host, port, user or host keys, or its shell is not sh. */
export class NodeUnreachableError extends MetastaticError {}
