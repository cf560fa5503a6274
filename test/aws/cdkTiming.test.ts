import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from 'aws-cdk-lib/assertions';
import { App, Stack } from 'aws-cdk-lib/core';
import { describe, expect, it, vi } from 'vitest';
import { MetastaticPool } from '../../lib/metastaticPool.ts';

/**
 * The stack takes its timeouts from the timing contract (shared/core/timing.ts) and from nowhere else:
 * with a different contract, the template follows it. (test/aws/cdk.test.ts checks the real values.)
 */
vi.mock('../../shared/core/timing.ts', async (importOriginal) => {
  const actual = await importOriginal<typeof import('../../shared/core/timing.ts')>();
  return {
    ...actual,
    FUNCTION_TIMEOUT_SECONDS: { request: 40, fulfil: 45, reaper: 90 },
    VISIBILITY_TIMEOUT_FACTOR: 7,
    visibilityTimeoutSeconds: (functionTimeoutSeconds: number) => functionTimeoutSeconds * 7,
  };
});

const ROOT = new URL('../..', import.meta.url).pathname;

describe('the stack and the timing contract', () => {
  it('deploys the function timeouts and queue visibility timeouts the contract says', () => {
    const context = JSON.parse(readFileSync(join(ROOT, 'cdk.json'), 'utf8')).context as Record<
      string,
      unknown
    >;
    const app = new App({ context: { ...context, 'aws:cdk:bundling-stacks': [] } });
    const stack = new Stack(app, 'Timing', { env: { account: '123456789012', region: 'eu-west-1' } });
    new MetastaticPool(stack, 'Pool', { config: readFileSync(join(ROOT, 'examples/aws.yaml'), 'utf8') });
    const resources = Template.fromStack(stack).toJSON().Resources as Record<
      string,
      { Type: string; Properties: Record<string, unknown> }
    >;
    const of = (type: string) => Object.entries(resources).filter(([, r]) => r.Type === type);
    const timeouts = Object.fromEntries(
      of('AWS::Lambda::Function').map(([id, r]) => [
        id.replace(/Function[0-9A-F]{8}$/, ''),
        r.Properties.Timeout,
      ]),
    );
    expect(timeouts).toEqual({ PoolRequest: 40, PoolFulfil: 45, PoolReaper: 90 });
    const visibility = Object.fromEntries(
      of('AWS::SQS::Queue').map(([id, r]) => [
        id.replace(/[0-9A-F]{8}$/, ''),
        r.Properties.VisibilityTimeout,
      ]),
    );
    // Every dead-letter queue keeps its work queue's visibility (the request one is consumed too); the
    // lease queue is the request function's, as the request queue.
    expect(visibility).toEqual({
      PoolRequestQueue: 280,
      PoolRequestQueueDeadLetterQueue: 280,
      PoolLeaseQueue: 280,
      PoolLeaseQueueDeadLetterQueue: 280,
      PoolFulfilQueue: 315,
      PoolFulfilQueueDeadLetterQueue: 315,
    });
  });
});
