import { DeadlineError, RetryableError } from '../../core/errors.ts';
import type { Log } from '../../core/log.ts';
import type { Deadline } from '../../core/timing.ts';
import { type BackoffPolicy, backoffDelay, classifyEc2Error, describeEc2Error } from './ec2Errors.ts';

/**
 * One EC2 request with the provider's retry policy. Throttling and transient server errors are retried
 * with jittered exponential backoff (1 s, x1.5, at most 60 s; 4 retries per provider call), then
 * RetryableError (the message comes back later). This is the only retry policy: create the EC2Client
 * with `maxAttempts: 1` (createEc2Client does), otherwise the SDK's own retries multiply with these.
 * Within an invocation's deadline (RetryBudget.deadline), no request starts and no backoff is slept past
 * it: DeadlineError instead, a RetryableError whose work the next delivery or reaper run takes up.
 */

export type Ec2ProviderLog = Pick<Log, 'info' | 'warn'>;

/** Retries left in one provider call, shared by all the EC2 requests the call makes. */
export interface RetryBudget {
  used: number;
  /** The invocation's deadline (Context.deadline), when the provider call has one. */
  readonly deadline?: Deadline;
}

export interface CallPolicy {
  readonly backoff: BackoffPolicy;
  readonly random: () => number;
  readonly sleep: (ms: number) => Promise<void>;
  readonly log: Ec2ProviderLog;
}

/**
 * Runs one EC2 request, retrying throttling and transient errors with backoff while the call's budget
 * lasts; then RetryableError. Other errors are thrown as they are.
 */
export async function ec2Call<T>(
  policy: CallPolicy,
  what: string,
  budget: RetryBudget,
  request: () => Promise<T>,
): Promise<T> {
  for (;;) {
    const before = budget.deadline?.remainingMs();
    if (before !== undefined && before <= 0) {
      throw new DeadlineError(`no time left in this invocation for ${what}; retrying later`);
    }
    try {
      return await request();
    } catch (err) {
      const kind = classifyEc2Error(err);
      if (kind !== 'throttle' && kind !== 'transient') throw err;
      const how = kind === 'throttle' ? 'throttled' : 'failed';
      if (budget.used >= policy.backoff.maxRetries) {
        throw new RetryableError(`${what} ${how} after ${budget.used} retries: ${describeEc2Error(err)}`, {
          cause: err,
        });
      }
      const delay = backoffDelay(policy.backoff, budget.used, policy.random);
      const left = budget.deadline?.remainingMs();
      if (left !== undefined && delay >= left) {
        // Sleeping would outlast the invocation (and a retry after it could not be recorded).
        throw new DeadlineError(
          `${what} ${how}; its next retry in ${delay} ms would outlast the ${Math.max(0, Math.round(left))} ms left in this invocation: ${describeEc2Error(err)}`,
          { cause: err },
        );
      }
      budget.used++;
      policy.log.warn('ec2 request retried', { request: what, error: describeEc2Error(err), delayMs: delay });
      await policy.sleep(delay);
    }
  }
}

/** Runs an EC2 request whose failure (other than running out of retries) is reported as `failure`. */
export async function ec2CallOr<T>(
  policy: CallPolicy,
  what: string,
  budget: RetryBudget,
  request: () => Promise<T>,
  failure: string,
): Promise<T> {
  try {
    return await ec2Call(policy, what, budget, request);
  } catch (err) {
    if (err instanceof RetryableError) throw err;
    throw new Error(`${failure} failed: ${describeEc2Error(err)}`, { cause: err });
  }
}
