/**
 * What the pool tells the outside world. Events go to an EventBridge bus on AWS (consumers subscribe
 * with rules instead of polling) and to `<state-dir>/events.jsonl` in the embedded pool; metrics go
 * to CloudWatch as EMF through Powertools. Both are ports: the core only names what happened.
 */
export const PoolEventType = {
  requestFulfilled: 'Request Fulfilled',
  requestFailed: 'Request Failed',
  nodeReleased: 'Node Released',
  backingLaunched: 'Backing Node Launched',
  backingStopped: 'Backing Node Stopped',
  /**
   * A request fulfilled only after waiting for a backing node to boot (placed on one launching, or
   * moved onto another after its first failed): the figure predictive readiness exists to shrink.
   * Published with its Request Fulfilled; a request served at once (a free slot on a ready backing
   * node, or a spare) publishes none.
   */
  requestWaitedForBoot: 'Request Waited For Boot',
  /** min-ready auto: the reaper changed the ready room it holds for a label (its forecast moved). */
  readyRoomChanged: 'Ready Room Changed',
} as const;
export type PoolEventType = (typeof PoolEventType)[keyof typeof PoolEventType];

/** The `source` of every event the pool publishes. */
export const POOL_EVENT_SOURCE = 'metastatic';

export interface EventSink {
  publish(type: PoolEventType, detail: Record<string, unknown>): Promise<void>;
}

export const MetricName = {
  launchSucceeded: 'LaunchSucceeded',
  launchFailed: 'LaunchFailed',
  timeToReady: 'TimeToReady',
  slotsInUse: 'SlotsInUse',
  idleBackingNodes: 'IdleBackingNodes',
  reaped: 'Reaped',
  requestsFailed: 'RequestsFailed',
  /** How long a request had been waiting (since it was sent) each time it found no capacity. */
  capacityWait: 'CapacityWait',
  /** A request recorded for the first time (a redelivery or a reused id is not counted again). */
  requestsReceived: 'RequestsReceived',
  requestsFulfilled: 'RequestsFulfilled',
  /** From when a request was recorded to when it was fulfilled. */
  timeToFulfilled: 'TimeToFulfilled',
  /** Requests fulfilled only after waiting for a boot (Request Waited For Boot); of RequestsFulfilled. */
  requestsWaitedForBoot: 'RequestsWaitedForBoot',
  /** How long such a request waited: from its placement to fulfilled. */
  waitForBoot: 'WaitForBoot',
  // min-ready auto, each reaper run, summed over the labels with `min-ready: auto`.
  /** Forecast arrivals per minute (the rate each label's ready room was decided from). */
  forecastArrivals: 'ForecastArrivalsPerMinute',
  /** Ready, unassigned nodes the forecast asks to hold (the decisions' seats). */
  readyRoomHeld: 'ReadyRoomHeld',
  // Gauges the reaper records each run, from what it read (with SlotsInUse and IdleBackingNodes).
  /** Nodes of waiting requests that are not ready yet. */
  nodesWaiting: 'NodesWaiting',
  /** Free slots on backing nodes that take nodes (launching or ready, not retiring or failed). */
  slotsFree: 'SlotsFree',
  backingLaunching: 'BackingNodesLaunching',
  /** Ready backing nodes holding at least one node (the idle ones are IdleBackingNodes). */
  backingActive: 'BackingNodesActive',
  backingRetiring: 'BackingNodesRetiring',
  backingFailed: 'BackingNodesFailed',
} as const;
export type MetricName = (typeof MetricName)[keyof typeof MetricName];

export interface MetricSink {
  /** Adds to a count (or records a gauge, for SlotsInUse / IdleBackingNodes). */
  count(name: MetricName, value?: number): void;
  /** Records a duration in milliseconds. */
  milliseconds(name: MetricName, ms: number): void;
}
