/**
 * The timing contract of the pool: the functions' timeouts, the queues' visibility timeouts, how long a
 * delivery may work, when another delivery may take its claims over, and when the reaper gives a claim
 * back. These numbers only make the protocol safe together, so they live here, read by both the stack
 * (lib/) and the use cases, and `test/unit/timing.test.ts` checks their ordering:
 *
 *   delivery deadline <= function timeout < claim takeover <= visibility timeout,  takeover < slot lease
 *   safety margin + shortest check < every function timeout
 *
 * - A delivery stops (and is retried) before its function's timeout, so it never writes after Lambda
 *   killed it... and a delivery older than the takeover age is known dead, because Lambda would have.
 * - A message comes back only after its visibility timeout, when the delivery that held it is dead (or
 *   about to be: an invocation that started late): the redelivery takes that delivery's claims and places
 *   over at once, after making itself the request's placer so the earlier one can record nothing more
 *   (core/ids.ts `supersedes`, usecases/place/requestNodes.ts `Recording.fence`).
 * - The reaper gives back an unconfirmed claim only once any delivery that took it is known dead
 *   (CLAIM_TAKEOVER_MS), and one a redelivery finds by id (on the backing node launched for its node)
 *   only after the slot lease, which outlasts the visibility timeout (core/lifecycle.ts `claimDue`).
 */

import type { Clock } from './clock.ts';

/** Lambda's timeout of each pool function, seconds. */
export const FUNCTION_TIMEOUT_SECONDS = { request: 30, fulfil: 30, reaper: 60 } as const;

/** AWS's guidance for a queue that feeds a Lambda function: visibility >= 6 x the function's timeout. */
export const VISIBILITY_TIMEOUT_FACTOR = 6;

/** The visibility timeout of the queue a function consumes, seconds. */
export function visibilityTimeoutSeconds(functionTimeoutSeconds: number): number {
  return functionTimeoutSeconds * VISIBILITY_TIMEOUT_FACTOR;
}

/**
 * A delivery still placing after this long stops (and is retried) rather than record its placement;
 * on Lambda the invocation's remaining time may cut it shorter (see deadlineFrom).
 */
export const DELIVERY_DEADLINE_MS = FUNCTION_TIMEOUT_SECONDS.request * 1000;

/**
 * A claim or reservation whose delivery started this long ago belongs to a dead delivery: another
 * delivery of the same message may take it over. Twice the request function's timeout.
 */
export const CLAIM_TAKEOVER_MS = 2 * FUNCTION_TIMEOUT_SECONDS.request * 1000;

/**
 * A claim not confirmed by a recorded node within this long is given back by the reaper (sooner, once
 * its delivery is known dead, when no redelivery would look for it: core/lifecycle.ts `claimDue`).
 */
export const SLOT_LEASE_MS = 5 * 60_000;

/**
 * A lease renewal that failed (a throttle, a conflict that kept coming back) comes back this soon, not at
 * the request queue's visibility timeout (180 s on AWS, three times the default 60 s lease, which would
 * let the lease lapse under a running job): a twelfth of the default lease, so a renewal sent a third of
 * the lease before its end (the client's cadence) has three more tries before it lapses.
 */
export const RENEW_RETRY_SECONDS = 5;

/**
 * A pending request's deadline is launch-retries x (launch-timeout + boot-timeout) after it was placed
 * (core/pools.ts pendingTimeoutOf), plus this: time for the reaper to fail the last attempt's backing node
 * and settle its nodes (a run or two) before the request itself is called stuck.
 */
export const PENDING_GRACE_MS = 5 * 60_000;

/** A provider resource tagged as ours with no live record is terminated once it is this old. */
export const ORPHAN_GRACE_MS = 2 * 60_000;

/**
 * What a batch keeps of an invocation's remaining time: no new record starts with less than this left,
 * and a record's own work (a port probe, a host-key scan) ends this long before the function would be
 * killed, so its outcome is recorded and the rest of the batch reported as item failures.
 */
export const INVOCATION_SAFETY_MARGIN_MS = 5_000;

/** How long one port probe waits for a TCP connection (boot-timeout allows many probes, one per try). */
export const PORT_PROBE_TIMEOUT_MS = 5_000;

/**
 * A port probe or host-key scan starts only with at least this long left before the deadline: a check
 * given less could not tell a slow machine from a dead one. The work is retried instead (its record comes
 * back), with boot-timeout still counted from the first `running` report.
 */
export const MIN_CHECK_MS = PORT_PROBE_TIMEOUT_MS;

/**
 * How soon a backing node whose resource runs but that is not ready yet (its port does not answer, its
 * host keys are not in its console output yet) is checked again, seconds: each try waits as long as the
 * node has waited since its first `running` report (2, 4, 8 s...), at least `first` and at most `cap`. On
 * EC2 the host keys show a minute or more after `running`: the node is then ready at most `cap` after
 * they do, not after the fulfil queue's visibility timeout (180 s, longer than the default boot-timeout),
 * which would leave it to the next reaper run. Each try costs a DescribeInstances and a GetConsoleOutput
 * (or a port probe): a burst of 500 launches waiting at once asks up to 50 of each a second, above EC2's
 * refill for read calls (20 a second); the fulfil function's concurrency cap (fulfilMaxConcurrency) slows
 * that, and a throttled try comes back at its next delay.
 */
export const BOOT_RETRY_SECONDS = { first: 2, cap: 10 } as const;

/**
 * The wait before the next check of a backing node that has run for `waitedMs` (since its first `running`
 * report) and is not ready yet: BOOT_RETRY_SECONDS, but never past its boot-timeout, so that the check
 * that fails it comes when boot-timeout passes, not up to `cap` later. Whole seconds, at least 1 (SQS's
 * DelaySeconds).
 */
export function bootRetrySeconds(o: { readonly waitedMs: number; readonly bootTimeoutMs: number }): number {
  const waited = Math.ceil(Math.max(0, o.waitedMs) / 1000);
  const grown = Math.min(BOOT_RETRY_SECONDS.cap, Math.max(BOOT_RETRY_SECONDS.first, waited));
  const left = Math.ceil(Math.max(0, o.bootTimeoutMs - o.waitedMs) / 1000);
  return Math.max(1, Math.min(grown, left));
}

/**
 * The most of one reaper run spent checking launching backing nodes whose resource runs (usecases/
 * reconcile.ts readyRunning: a `running` event lost, or one the fulfil function is still trying again).
 * Each check reads the instance's console output (an EC2 call) or probes its port; one after the other, a
 * scale-up of 500 such nodes would take a whole run before any other step. After this long the rest waits
 * for the next run (the fulfil function checks them every few seconds meanwhile).
 */
export const RUNNING_CHECKS_MS = 10_000;

/**
 * EC2 is eventually consistent: for a while after RunInstances, DescribeInstances can answer
 * InvalidInstanceID.NotFound and the tagged list can leave the new instance out ("seconds to minutes",
 * says EC2's documentation). A resource an eventually consistent provider does not find counts as gone
 * only once its id has been recorded this long, and a second describe does not find it either.
 */
export const RESOURCE_NOT_FOUND_GRACE_MS = 5 * 60_000;

/**
 * How long an ended record (a request whose nodes all ended, a stopped backing node) stays in the table
 * before DynamoDB's TTL may delete it (`record-retention`, seconds; the item's `expiresAt`). At least the
 * request queue's message retention (SQS's default, 4 days, which the stack keeps): a request message can
 * be received until then, and only its record tells a redelivery from a new request. At most 90 days.
 */
export const RECORD_RETENTION_SECONDS = { default: 7 * 86400, min: 4 * 86400, max: 90 * 86400 } as const;

/** The part of Lambda's invocation context that tells how long the invocation may still run. */
export interface InvocationTime {
  getRemainingTimeInMillis(): number;
}

/**
 * How long an invocation's work may still go on: its remaining time less INVOCATION_SAFETY_MARGIN_MS.
 * Zero or less: start nothing new, and let the record come back.
 */
export interface Deadline {
  remainingMs(): number;
}

export function deadlineOf(invocation: InvocationTime): Deadline {
  return { remainingMs: () => invocation.getRemainingTimeInMillis() - INVOCATION_SAFETY_MARGIN_MS };
}

/**
 * An invocation with no Lambda context (the embedded pool's pollers and schedule) that may run for
 * `budgetMs` from now, measured on `clock` (the use cases' clock, so tests drive it).
 */
export function invocationFor(clock: Clock, budgetMs: number): InvocationTime {
  const end = clock.now() + budgetMs;
  return { getRemainingTimeInMillis: () => end - clock.now() };
}

/**
 * The waiting budget: a request that cannot be placed waits, its message coming back, until this long
 * after it was first recorded (its record's `createdAt`, which a redelivery, a re-send after a restart or
 * a hand-off never changes), then ends `failed` at the next receive. A time, not a number of receives:
 * how often a message comes back depends on the load, and a re-sent message starts counting again.
 * Seconds: as long as 50 receives of an idle request queue take (its visibility timeout 50 times):
 * `metastatic dev` 100 s (2 s each), the AWS stack 2.5 hours (180 s each).
 */
export const WAITING_BUDGET_SECONDS = { embedded: 100, aws: 9000 } as const;

/** The embedded pool's request queue visibility timeout, seconds: a new waiting request's first retry. */
export const EMBEDDED_VISIBILITY_SECONDS = 2;

/**
 * The longest a waiting request's message is kept away by its back-off (seconds), unless the queue's
 * own visibility timeout is longer (the AWS stack's 180 s: no back-off there). A release hands its room
 * to the first waiting request at once (usecases/release/handOff.ts); room freed any other way (the reaper
 * retiring a backing node, a request ahead cancelled) is seen at the waiting request's next receive, at
 * most this long later.
 */
export const WAITING_BACKOFF_CAP_SECONDS = 30;

/**
 * How long a waiting request's message stays away after a receive that could not place it, seconds:
 * twice as long as the request has waited so far, at least the queue's visibility timeout
 * `baseSeconds`, at most WAITING_BACKOFF_CAP_SECONDS (or `baseSeconds` if longer), and never past the end
 * of its budget, so that the receive that ends it comes when the budget ends (+ up to a second).
 * SQS takes whole seconds, up to 12 hours.
 */
export function waitingVisibilitySeconds(o: {
  readonly waitedMs: number;
  readonly budgetMs: number;
  readonly baseSeconds: number;
}): number {
  const cap = Math.max(o.baseSeconds, WAITING_BACKOFF_CAP_SECONDS);
  const grown = Math.min(cap, Math.max(o.baseSeconds, Math.ceil((2 * Math.max(0, o.waitedMs)) / 1000)));
  const left = Math.ceil(Math.max(0, o.budgetMs - o.waitedMs) / 1000);
  return Math.min(grown, Math.max(left, 1), 43_200);
}

/**
 * The request queue's maxReceiveCount for a waiting budget: a backstop (the dead-letter queue, and the
 * handler's "no capacity after <n> attempts"), never the budget. A message comes back no sooner than the
 * queue's visibility timeout, so a receive count this high is reached only after the budget ended, even
 * with no back-off at all (a restart's re-send starts its count again, which only makes it later).
 */
export function backstopReceiveCount(budgetSeconds: number, visibilitySeconds: number): number {
  return Math.ceil(budgetSeconds / Math.max(1, visibilitySeconds)) + 2;
}
