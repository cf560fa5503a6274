import { z } from 'zod';

/**
 * Backing-node state events, shaped exactly like EventBridge's "EC2 Instance State-change Notification"
 * (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instance-state-changes.html), so the
 * fulfil function consumes the same body from EventBridge -> SQS on AWS and from the local provider in
 * the embedded pool.
 */
export const InstanceState = z.enum([
  'pending',
  'running',
  'stopping',
  'stopped',
  'shutting-down',
  'terminated',
]);
export type InstanceState = z.infer<typeof InstanceState>;

export const StateChangeDetailType = 'EC2 Instance State-change Notification';

export const StateChangeEvent = z.object({
  version: z.string().default('0'),
  id: z.string().optional(),
  'detail-type': z.literal(StateChangeDetailType),
  source: z.string(),
  account: z.string().optional(),
  time: z.string().optional(),
  region: z.string().optional(),
  resources: z.array(z.string()).default([]),
  detail: z.object({
    'instance-id': z.string().min(1),
    state: InstanceState,
  }),
});
export type StateChangeEvent = z.infer<typeof StateChangeEvent>;

/** Builds the event a provider emits when one of its resources changes state. */
export function stateChangeEvent(args: {
  resourceId: string;
  state: InstanceState;
  source: string;
  region: string;
  at: number;
}): StateChangeEvent {
  return {
    version: '0',
    id: `${args.resourceId}-${args.state}-${args.at}`,
    'detail-type': StateChangeDetailType,
    source: args.source,
    account: '000000000000',
    time: new Date(args.at).toISOString(),
    region: args.region,
    resources: [args.resourceId],
    detail: { 'instance-id': args.resourceId, state: args.state },
  };
}

/**
 * EventBridge's "EC2 Spot Instance Interruption Warning": the instance is reclaimed in two minutes.
 * https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html
 */
export const SpotInterruptionDetailType = 'EC2 Spot Instance Interruption Warning';

export const SpotInterruptionEvent = z.object({
  version: z.string().default('0'),
  id: z.string().optional(),
  'detail-type': z.literal(SpotInterruptionDetailType),
  source: z.string(),
  time: z.string().optional(),
  region: z.string().optional(),
  resources: z.array(z.string()).default([]),
  detail: z.object({
    'instance-id': z.string().min(1),
    'instance-action': z.string(),
  }),
});
export type SpotInterruptionEvent = z.infer<typeof SpotInterruptionEvent>;

/** What the fulfil queue carries: either kind of event, told apart by detail-type. */
export const BackingEvent = z.discriminatedUnion('detail-type', [StateChangeEvent, SpotInterruptionEvent]);
export type BackingEvent = z.infer<typeof BackingEvent>;
