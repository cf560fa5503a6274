import { IllegalTransitionError } from './errors.ts';

/**
 * Every state of a backing node, a node and a request, and every allowed transition, in one place.
 * Each transition is applied by one conditional write from the expected state (see docs/table.md);
 * `assertTransition` is called before every such write so an illegal one is an error, never applied.
 */
export const BackingState = {
  /** Recorded (intent written), provider asked to launch; slots may already be claimed. */
  launching: 'launching',
  /** The provider reported it running; its nodes are ready. */
  ready: 'ready',
  /** Chosen for release while empty; takes no new nodes; terminate in progress. */
  retiring: 'retiring',
  /** The provider confirmed it gone. Terminal. */
  stopped: 'stopped',
  /** Launch failed or the resource vanished; takes no nodes; terminate in progress. */
  failed: 'failed',
} as const;
export type BackingState = (typeof BackingState)[keyof typeof BackingState];

export const NodeState = {
  /** Part of a request not yet placed on a backing node. */
  requested: 'requested',
  /** Holds a slot on a backing node that is still launching. */
  pending: 'pending',
  /** Holds a slot on a ready backing node; connection details are set. */
  ready: 'ready',
  /** Given back by its user; its slot is free. Terminal. */
  released: 'released',
  /** Could not be provided, or its backing node was lost. Terminal. */
  failed: 'failed',
} as const;
export type NodeState = (typeof NodeState)[keyof typeof NodeState];

export const RequestState = {
  requested: 'requested',
  /** Every node placed, some still waiting for their backing node. */
  pending: 'pending',
  /** Every node was ready at once. Terminal. */
  fulfilled: 'fulfilled',
  failed: 'failed',
} as const;
export type RequestState = (typeof RequestState)[keyof typeof RequestState];

export const backingTransitions: Readonly<Record<BackingState, readonly BackingState[]>> = {
  launching: ['ready', 'retiring', 'failed'],
  ready: ['retiring', 'failed'],
  retiring: ['stopped'],
  failed: ['stopped'],
  stopped: [],
};

export const nodeTransitions: Readonly<Record<NodeState, readonly NodeState[]>> = {
  requested: ['pending', 'ready', 'failed', 'released'],
  pending: ['ready', 'failed', 'released'],
  ready: ['released', 'failed'],
  released: [],
  failed: [],
};

export const requestTransitions: Readonly<Record<RequestState, readonly RequestState[]>> = {
  requested: ['pending', 'fulfilled', 'failed'],
  pending: ['fulfilled', 'failed'],
  fulfilled: [],
  failed: [],
};

const tables = { backing: backingTransitions, node: nodeTransitions, request: requestTransitions } as const;
type Kinds = { backing: BackingState; node: NodeState; request: RequestState };

export function canTransition<K extends keyof Kinds>(kind: K, from: Kinds[K], to: Kinds[K]): boolean {
  const allowed = tables[kind][from as never] as readonly string[];
  return allowed.includes(to);
}

export function assertTransition<K extends keyof Kinds>(kind: K, from: Kinds[K], to: Kinds[K]): void {
  if (!canTransition(kind, from, to)) {
    throw new IllegalTransitionError(`illegal ${kind} transition ${from} -> ${to}`);
  }
}

/** Backing states in which a backing node can take new nodes (subject to free slots and max-age). */
export const allocatableBackingStates: readonly BackingState[] = ['launching', 'ready'];
