/**
 * Typed errors of the core. Handlers sort failures by class: a PermanentError is recorded and the
 * message is consumed (never retried forever); a RetryableError lets the SQS record fail so it comes
 * back after the visibility timeout; anything else is a bug or an outage and is retried too.
 */
export class MetastaticError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }
}

/** Bad input or a request that can never be served: record the reason, do not retry. */
export class PermanentError extends MetastaticError {}

/** A transient condition (capacity, a race lost too often): retry later. */
export class RetryableError extends MetastaticError {}

/**
 * No pool has room right now; the request waits. `waiting` is its stored record, when the request was
 * recorded waiting: since when (`createdAt`, its waiting budget's start) and for which labels.
 */
export class CapacityError extends RetryableError {
  constructor(
    message: string,
    readonly waiting?: { readonly createdAt: number; readonly labels: readonly string[] },
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/**
 * Another live delivery of the same message (or another re-homing of the same node) holds a claim or
 * reservation this one needs: back off and retry later, by which time it has finished or is known dead.
 */
export class BusyError extends RetryableError {}

/**
 * The invocation has too little time left for this work (see core/timing.ts): it is not started, or a
 * check it began ended without an answer. The record comes back and is tried again with a fresh deadline.
 */
export class DeadlineError extends RetryableError {}

/**
 * A backing node whose resource runs is not ready yet (its port does not answer, its host keys are not in
 * its console output yet), within boot-timeout: its `running` event is to be tried again `retryInSeconds`
 * from now (core/timing.ts bootRetrySeconds), long before the fulfil queue's visibility timeout would
 * bring it back.
 */
export class NotReadyYetError extends RetryableError {
  constructor(
    message: string,
    readonly retryInSeconds: number,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** A bounded wait (a host-key scan) ran out of time without an answer. */
export class TimeoutError extends MetastaticError {}

/** A conditional write found the item changed since it was read, or a step gave up retrying such writes. */
export class ConflictError extends MetastaticError {}

/**
 * A version-checked write lost to a concurrent writer: the item changed since it was read. The one
 * error usecases/conflicts.ts retries (re-read, decide again); a ConflictError of any other kind (a
 * step that gave up, a resource another backing node records) is not retried by an outer step.
 */
export class LostWriteError extends ConflictError {}

/** A state change that the state table does not allow. */
export class IllegalTransitionError extends MetastaticError {}

/**
 * The store refused a write as invalid (DynamoDB's ValidationException: a number out of its range, an
 * item over 400 KB, ...). Writing it again cannot succeed, so it is not retried: the pool bounds what it
 * stores (core/text.ts, core/messages.ts), and this names a bound missed. A request whose write is
 * refused ends at once with this reason (shared/usecases/place/requests.ts, endRequestOf).
 */
export class StoreRefusedError extends PermanentError {}

/** DynamoDB refused an item larger than its 400 KB limit. */
export class ItemTooLargeError extends StoreRefusedError {}

/** A node id that names no node. */
export class UnknownNodeError extends PermanentError {}

/** Every launch attempt (launch-retries in total) for a node failed: its request fails. */
export class LaunchFailedError extends PermanentError {}

/** One launch attempt failed (the backing node is marked failed); the next attempt may succeed. */
export class LaunchAttemptError extends RetryableError {}

/** A release of a held node that was not forced: refused, with how to do it. */
export class HeldNodeError extends PermanentError {}

/** An operator verb aimed at something in the wrong state (e.g. holding a released node). */
export class InvalidStateError extends PermanentError {}

/** A spare another node took (core/minReady.ts): it ends with the node that took it. */
export class SpareInUseError extends PermanentError {}
