/**
 * How many independent writes the reaper keeps in flight at once: each is a round trip of several
 * milliseconds on DynamoDB, so a batch of hundreds (idle backing nodes to retire, to record stopped) done
 * one after the other would take a large share of the invocation's time (bench/reaper.ts). Each of these
 * writes is on an item of its own, or a conditional update of a capacity set's counter that concurrent
 * updates of other members do not fail; 16 stays far below DynamoDB's per-item and the SDK's socket limits.
 */
export const WRITES_IN_FLIGHT = 16;

/**
 * How many launching backing nodes the reaper checks at once (reconcile.ts readyRunning): each check is
 * an EC2 call (GetConsoleOutput) or a port probe, and a few DynamoDB calls. EC2 throttles each API per
 * account and region with a token bucket (for most read calls 100 tokens, refilled at 20 a second), which
 * the fulfil function's checks of the same instances share: 3 in flight at ~100 ms a call is at most ~30
 * calls a second, so the RUNNING_CHECKS_MS (10 s) a run may spend on them stays within a full bucket and
 * its refill. A throttled call is retried with back-off by the provider (providers/aws/ec2Calls.ts).
 */
export const CHECKS_IN_FLIGHT = 3;

/**
 * Runs `work` over `items` with at most `limit` running at once, starting them in order. Once a `work`
 * returns false (the invocation's time ran out), no further item starts; those running finish.
 */
export async function forEachBounded<T>(
  items: readonly T[],
  limit: number,
  work: (item: T) => Promise<unknown>,
): Promise<void> {
  let next = 0;
  let stopped = false;
  const worker = async () => {
    while (!stopped && next < items.length) {
      const item = items[next++] as T;
      if ((await work(item)) === false) stopped = true;
    }
  };
  await Promise.all(Array.from({ length: Math.min(Math.max(1, limit), items.length) }, worker));
}
