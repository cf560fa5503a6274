import { RetryableError } from '../../core/errors.ts';
import type { BackingPort, CapacityPort } from '../../core/poolStore.ts';
import type { BackingResource, ReportedHostKeys } from '../../core/provider.ts';
import type { BackingRecord } from '../../core/records.ts';
import type { Context } from '../context.ts';
import { scanKeys } from '../place/backingNodes.ts';

/**
 * A running backing node's own SSH host keys, learned before it is ready (Context.hostKeyPlan): the
 * nodes on it carry them, so a job can verify the host it logs into.
 * - `keys`: learned (`keys` unset: none are to be learned; the provider's own attributes, if any, stand).
 * - `wait`: not there yet (the console output is printed a while after boot): the caller retries
 *   within boot-timeout, then fails the backing node with `failure`.
 * - `fail`: what was found cannot be trusted, or the scan failed: the backing node fails with `reason`.
 */
export type LearnedHostKeys =
  | { readonly kind: 'keys'; readonly keys?: readonly string[] }
  | { readonly kind: 'wait'; readonly failure: string; readonly waiting: string }
  | { readonly kind: 'fail'; readonly reason: string };

export async function learnHostKeys(
  ctx: Context<BackingPort & CapacityPort>,
  b: BackingRecord,
  resource: BackingResource,
  bootTimeoutS: number,
): Promise<LearnedHostKeys> {
  const plan = ctx.hostKeyPlan?.(b.backingPoolKey, b.backingLabel);
  if (!plan || plan.source === 'none') return { kind: 'keys' };
  if (plan.source === 'scan') {
    const at = { ...b, ...(resource.host ? { host: resource.host } : {}), port: resource.port };
    try {
      return { kind: 'keys', keys: await scanKeys(ctx, bootTimeoutS, at) };
    } catch (err) {
      if (err instanceof RetryableError) throw err; // out of time: no verdict, the record comes back
      return { kind: 'fail', reason: `host-key scan failed: ${(err as Error).message}` };
    }
  }
  const id = resource.resourceId;
  const provider = ctx.providers.forPool(b.backingPoolKey);
  if (!provider.reportedHostKeys) {
    return {
      kind: 'fail',
      reason: `host-keys: console: backing pool ${b.backingPoolKey} reports no host keys`,
    };
  }
  const waiting = `backing node ${b.id} is running; waiting for its SSH host keys in the console output of ${id}`;
  let reported: ReportedHostKeys;
  try {
    reported = await provider.reportedHostKeys(id, ctx.deadline);
  } catch (err) {
    if (err instanceof RetryableError) throw err;
    // A refusal (a missing ec2:GetConsoleOutput permission...) is waited out like a console not printed
    // yet, so the failure after boot-timeout names it.
    const why = (err as Error).message;
    return {
      kind: 'wait',
      failure: `the console output of ${id} could not be read: ${why}`,
      waiting: `${waiting} (${why})`,
    };
  }
  switch (reported.kind) {
    case 'keys':
      return { kind: 'keys', keys: reported.keys };
    case 'invalid':
      return { kind: 'fail', reason: `host keys from the console output of ${id}: ${reported.reason}` };
    default:
      return {
        kind: 'wait',
        failure: `no SSH host keys in the console output of ${id} (cloud-init prints them at boot; see host-keys in docs/aws.md)`,
        waiting,
      };
  }
}
