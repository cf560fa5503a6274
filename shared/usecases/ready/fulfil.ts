import { markReady } from '../../core/backing.ts';
import { DeadlineError, NotReadyYetError, RetryableError } from '../../core/errors.ts';
import { notFoundIsFinal } from '../../core/lifecycle.ts';
import { MetricName } from '../../core/observability.ts';
import type { BackingProvider, BackingResource } from '../../core/provider.ts';
import type { BackingRecord } from '../../core/records.ts';
import type { StateChangeEvent } from '../../core/stateChanges.ts';
import { bootRetrySeconds, PORT_PROBE_TIMEOUT_MS } from '../../core/timing.ts';
import { retryOnConflict, unlessConflict } from '../conflicts.ts';
import { type ServeContext, timeLeft } from '../context.ts';
import { isGone, lookUp, providerFor } from '../reap/resourceLook.ts';
import { failBackingNode, failBadBacking } from '../release/failure.ts';
import { learnHostKeys } from './backingHostKeys.ts';
import { markNodesReady } from './nodesReady.ts';

export type FulfilOutcome =
  | { readonly kind: 'ignored'; readonly reason: string }
  | { readonly kind: 'ready'; readonly backingNodeId: string; readonly nodesReady: number }
  | {
      readonly kind: 'failed';
      readonly backingNodeId: string;
      readonly nodesFailed: number;
      readonly nodesMoved: number;
    };

/**
 * Reacts to a backing node's state change: running -> (its port answers within boot-timeout) the
 * backing node is ready, then its nodes, then the requests all of whose nodes are ready. A resource
 * that is gone fails its backing node: waiting nodes move elsewhere, ready ones fail so their users
 * learn it. Every step is idempotent, so a duplicated or re-ordered event is harmless.
 *
 * The rule forwards every EC2 instance's events in the region (other teams' too): the instance is looked
 * up in the table first (its resource pointer), and an event for one no backing node records is ignored
 * without any EC2 call. An event for one of ours is not taken on its word: it may be late, out of order
 * or not EC2's (anything allowed to send to the fulfil queue can write one), and failing a backing node
 * fails its users' nodes. So `running` for a launching backing node, and every gone state, cost one
 * DescribeInstances (two when EC2 does not find a recorded instance past RESOURCE_NOT_FOUND_GRACE_MS):
 * a backing node fails only once its provider reports the resource gone or cannot find it
 * (reconcile.ts lookUp, as the reaper decides); one it reports running stays as it is. A duplicate
 * `running` for a ready backing node needs no call.
 */
export async function handleStateChange(ctx: ServeContext, event: StateChangeEvent): Promise<FulfilOutcome> {
  const resourceId = event.detail['instance-id'];
  const state = event.detail.state;
  if (state !== 'running' && !GONE_STATES.has(state)) {
    return { kind: 'ignored', reason: `state ${state} needs no action` };
  }
  const b = await recordedBacking(ctx, resourceId);
  if ('kind' in b) return b;
  if (state === 'running') {
    if (b.state === 'ready') {
      // A duplicate (or the reaper was first): nothing to learn from EC2, only nodes to settle.
      return { kind: 'ready', backingNodeId: b.id, nodesReady: await markNodesReady(ctx, b, failBadBacking) };
    }
    if (b.state !== 'launching') return { kind: 'ignored', reason: `backing node ${b.id} is ${b.state}` };
    let provider: BackingProvider;
    try {
      provider = ctx.providers.forPool(b.backingPoolKey);
    } catch (err) {
      return { kind: 'ignored', reason: (err as Error).message };
    }
    const resource = await provider.describe(resourceId, ctx.deadline);
    if (!resource) {
      if (provider.eventuallyConsistent && !notFoundIsFinal(b, ctx.clock.now())) {
        // EC2 sent the event, so the instance exists: its describe has not caught up yet.
        throw new RetryableError(`resource ${resourceId} reported running is not found yet; retrying`);
      }
      return { kind: 'ignored', reason: `resource ${resourceId} no longer exists` };
    }
    if (resource.state !== 'running') {
      return { kind: 'ignored', reason: `resource ${resourceId} is ${resource.state}` };
    }
    return resourceRunning(ctx, resource);
  }
  const confirmed = await confirmGone(ctx, b, resourceId, state);
  if (confirmed) return confirmed;
  // The provider may know why (a local process's own error, e.g. a host it cannot listen on).
  const cause = ctx.providers.forResource(resourceId)?.endReason?.(resourceId);
  const reason = `backing resource ${resourceId} is ${state}${cause ? `: ${cause}` : ''}`;
  const report = await failBackingNode(ctx, b.id, reason, { resourceGone: true });
  if (!report) return { kind: 'ignored', reason: `backing node ${b.id} is ${b.state}` };
  return { kind: 'failed', backingNodeId: b.id, nodesFailed: report.failed, nodesMoved: report.rehomed };
}

/** States that mean the machine serves nobody any more. */
const GONE_STATES: ReadonlySet<string> = new Set(['terminated', 'shutting-down', 'stopped', 'stopping']);

/** The provider of a backing node's resource, or the event ignored: `what` cannot be confirmed without it. */
function providerOrWhyNot(
  ctx: ServeContext,
  b: BackingRecord,
  what: string,
): BackingProvider | FulfilOutcome {
  try {
    return providerFor(ctx, b);
  } catch (err) {
    return { kind: 'ignored', reason: `cannot confirm ${what}: ${(err as Error).message}` };
  }
}

/**
 * Undefined when the provider confirms that the backing node's resource is gone (described in a state
 * other than pending or running, or not found where "not found" is final); else why the event is not
 * acted on. A recorded EC2 instance not found yet (eventual consistency) is retried.
 */
async function confirmGone(
  ctx: ServeContext,
  b: BackingRecord,
  resourceId: string,
  state: string,
): Promise<FulfilOutcome | undefined> {
  const provider = providerOrWhyNot(ctx, b, `that ${resourceId} is ${state}`);
  if ('kind' in provider) return provider;
  const look = await lookUp(ctx, provider, { ...b, resourceId });
  if (look.gone) return undefined;
  if (look.unseen) {
    throw new RetryableError(
      `resource ${resourceId} reported ${state}, but its provider says it ${look.why}; retrying`,
    );
  }
  return {
    kind: 'ignored',
    reason: `resource ${resourceId} reported ${state}, but its provider says it ${look.why}: the event is not current`,
  };
}

/**
 * The backing node that records this resource, found by its pointer (no provider call), or why the
 * event is not ours to handle.
 */
async function recordedBacking(
  ctx: ServeContext,
  resourceId: string,
): Promise<BackingRecord | { readonly kind: 'ignored'; readonly reason: string }> {
  const backingId = await ctx.store.backingIdOfResource(resourceId);
  if (!backingId) {
    return { kind: 'ignored', reason: `resource ${resourceId} is recorded by no backing node` };
  }
  const b = await ctx.store.getBacking(backingId);
  if (!b) return { kind: 'ignored', reason: `no backing node ${backingId}` };
  if (b.resourceId !== undefined && b.resourceId !== resourceId) {
    return { kind: 'ignored', reason: `resource ${resourceId} is not backing node ${b.id}'s current one` };
  }
  return b;
}

/**
 * A spot interruption warning: the instance goes in two minutes. The backing node is retired at once
 * (no more slots); its ready nodes are failed with the reason so their users learn it, and waiting
 * nodes move to another backing node. The reaper terminates it. Not taken on its word either: one
 * DescribeInstances, and a warning about an instance EC2 describes live and on-demand is ignored.
 */
export async function handleSpotWarning(ctx: ServeContext, resourceId: string): Promise<FulfilOutcome> {
  const b = await recordedBacking(ctx, resourceId);
  if ('kind' in b) return b;
  const provider = providerOrWhyNot(ctx, b, `a spot warning for ${resourceId}`);
  if ('kind' in provider) return provider;
  const resource = await provider.describe(resourceId, ctx.deadline);
  // EC2 says whether an instance is spot (`attributes.spot`). A provider that does not say (local, which
  // has no spot market: its warnings are test input) is not second-guessed.
  if (resource && !isGone(resource) && resource.attributes.spot === false) {
    return {
      kind: 'ignored',
      reason: `resource ${resourceId} is not a spot instance: a spot warning cannot be about it`,
    };
  }
  const report = await failBackingNode(
    ctx,
    b.id,
    `spot interruption warning: instance ${resourceId} is reclaimed within two minutes`,
    { resourceGone: true },
  );
  if (!report) return { kind: 'ignored', reason: `backing node ${b.id} is not live` };
  return { kind: 'failed', backingNodeId: b.id, nodesFailed: report.failed, nodesMoved: report.rehomed };
}

/**
 * The provider reports a backing node's resource running. Its connection port must answer within
 * boot-timeout (counted from the first such report); until then the event is retried. Also called by
 * the reaper for a launching backing node whose resource runs, in case the event was lost.
 */
export async function resourceRunning(ctx: ServeContext, resource: BackingResource): Promise<FulfilOutcome> {
  const b = await ctx.store.getBacking(resource.backingNodeId);
  if (!b) return { kind: 'ignored', reason: `no backing node ${resource.backingNodeId}` };
  if (b.state === 'ready') {
    return { kind: 'ready', backingNodeId: b.id, nodesReady: await markNodesReady(ctx, b, failBadBacking) };
  }
  if (b.state !== 'launching') return { kind: 'ignored', reason: `backing node ${b.id} is ${b.state}` };
  if (b.resourceId !== undefined && b.resourceId !== resource.resourceId) {
    return {
      kind: 'ignored',
      reason: `resource ${resource.resourceId} is not backing node ${b.id}'s current one`,
    };
  }
  const pool = ctx.config.metastaticPools.find((p) => p.key === b.poolKey);
  const bootTimeout = pool?.bootTimeout ?? 120;
  let learned: Awaited<ReturnType<typeof learnHostKeys>>;
  try {
    if (ctx.probePort && resource.host && resource.port !== undefined) {
      const probeMs = Math.min(PORT_PROBE_TIMEOUT_MS, bootTimeout * 1000);
      if (timeLeft(ctx) < probeMs) {
        // Too late in this invocation for a probe that could tell: boot-timeout starts now all the same.
        throw new DeadlineError(
          `no time left in this invocation to probe ${resource.host}:${resource.port} of backing node ${b.id}; retrying`,
        );
      }
      const answered = await ctx.probePort(resource.host, resource.port, probeMs);
      if (!answered) {
        return notReadyYet(ctx, b, bootTimeout, {
          failure: `${resource.host}:${resource.port} did not answer`,
          waiting: `backing node ${b.id} is running but ${resource.host}:${resource.port} does not answer yet`,
        });
      }
    }
    learned = await learnHostKeys(ctx, b, resource, bootTimeout);
  } catch (err) {
    if (err instanceof RetryableError && !(err instanceof NotReadyYetError)) {
      throw await noVerdict(ctx, b, bootTimeout, err);
    }
    throw err;
  }
  if (learned.kind === 'wait') return notReadyYet(ctx, b, bootTimeout, learned);
  if (learned.kind === 'fail') return failReadying(ctx, b, learned.reason);
  const backing = await backingReady(ctx, b.id, resource.resourceId, {
    host: resource.host,
    port: resource.port,
    attributes: { ...resource.attributes, ...(learned.keys ? { hostKeys: [...learned.keys] } : {}) },
  });
  if (!backing)
    return { kind: 'ignored', reason: `no launching backing node for resource ${resource.resourceId}` };
  return {
    kind: 'ready',
    backingNodeId: backing.id,
    nodesReady: await markNodesReady(ctx, backing, failBadBacking),
  };
}

/**
 * A running backing node that is not ready yet (its port does not answer, its host keys are not known):
 * tried again within boot-timeout, counted from the first `running` report, and failed after. The error
 * says how soon (NotReadyYetError, core/timing.ts bootRetrySeconds: within seconds, and the last try when
 * boot-timeout passes), so the fulfil function need not wait for the queue's visibility timeout.
 */
async function notReadyYet(
  ctx: ServeContext,
  b: BackingRecord,
  bootTimeout: number,
  why: { readonly failure: string; readonly waiting: string },
): Promise<FulfilOutcome> {
  const since = b.runningAt ?? (await stampRunning(ctx, b));
  const waitedMs = ctx.clock.now() - since;
  if (waitedMs >= bootTimeout * 1000) {
    return failReadying(ctx, b, `boot-timeout of ${bootTimeout}s exceeded: ${why.failure}`);
  }
  throw new NotReadyYetError(why.waiting, bootRetrySeconds({ waitedMs, bootTimeoutMs: bootTimeout * 1000 }));
}

/**
 * A check of a running backing node that reached no verdict (no time left in the invocation for a probe
 * or a scan, EC2 throttling the console read past its retries): within boot-timeout it is tried again as
 * soon as a node not ready yet (boot-timeout counts from now if no `running` report was stamped yet);
 * after it, the error stands (the reaper's deadline step fails the backing node).
 */
async function noVerdict(
  ctx: ServeContext,
  b: BackingRecord,
  bootTimeout: number,
  err: RetryableError,
): Promise<RetryableError> {
  const since = b.runningAt ?? (await stampRunning(ctx, b));
  const waitedMs = ctx.clock.now() - since;
  if (waitedMs >= bootTimeout * 1000) return err;
  return new NotReadyYetError(
    err.message,
    bootRetrySeconds({ waitedMs, bootTimeoutMs: bootTimeout * 1000 }),
    { cause: err },
  );
}

/** Fails a backing node that cannot become ready; its nodes move or fail (failure.ts). */
async function failReadying(ctx: ServeContext, b: BackingRecord, reason: string): Promise<FulfilOutcome> {
  const report = await failBackingNode(ctx, b.id, reason, { resourceGone: false });
  return {
    kind: 'failed',
    backingNodeId: b.id,
    nodesFailed: report?.failed ?? 0,
    nodesMoved: report?.rehomed ?? 0,
  };
}

/** Records when the provider first reported the machine running (boot-timeout counts from here). */
async function stampRunning(ctx: ServeContext, b: BackingRecord): Promise<number> {
  const now = ctx.clock.now();
  const stamped = await unlessConflict(() =>
    ctx.store.putBacking({ ...b, runningAt: now, version: b.version + 1 }, { version: b.version }),
  );
  return stamped ? now : ((await ctx.store.getBacking(b.id))?.runningAt ?? now);
}

async function backingReady(
  ctx: ServeContext,
  backingId: string,
  resourceId: string,
  details: { host?: string; port?: number; attributes: Record<string, unknown> },
): Promise<BackingRecord | undefined> {
  return retryOnConflict(`marking backing node ${backingId} ready`, async () => {
    const b = await ctx.store.getBacking(backingId);
    if (!b) return undefined;
    if (b.state === 'ready') return b; // duplicate event
    if (b.state !== 'launching') return undefined;
    const recorded = b.resourceId ? {} : { resourceId, resourceRecordedAt: ctx.clock.now() };
    const next = markReady({ ...b, ...recorded }, details, ctx.clock.now());
    await ctx.store.putBacking(next, { version: b.version, states: ['launching'] });
    ctx.metrics?.milliseconds(MetricName.timeToReady, ctx.clock.now() - b.launchedAt);
    ctx.log.info('backing node ready', {
      backingNodeId: b.id,
      resourceId,
      host: details.host,
      port: details.port,
    });
    return next;
  });
}
