import type { PoolStore } from '../core/poolStore.ts';

/**
 * Store writes after which a waiting request may fit where it did not: room freed (a node released,
 * places given back, a backing node changed state or appeared, a min-ready seat moved) or
 * a request ahead of it gone (any write of a request that existed: placed, ended, cancelled). Taking
 * room (a claim, a reservation) and a new request's first write (`createRequest`: the warm path, a
 * request recorded waiting) are not among them.
 */
const FREEING: ReadonlySet<string> = new Set<keyof PoolStore>([
  'releaseNodeEntry',
  'freeNodePlaces',
  'freeBackingPlace',
  'putBacking',
  'createBacking',
  'openSeat',
  'advanceSeat',
  'lapseLease',
  'dropLease',
  'putRequest',
]);

/** How many room-freeing writes this process made (RoomSignal). */
export interface RoomSignal {
  readonly generation: () => number;
}

/**
 * The embedded pool's store, counting the writes that may let a waiting request in (FREEING): every
 * delivery, reaper run and operator verb of `metastatic dev` runs in its one process, through this store,
 * so a count unchanged since a waiting request's last attempt means nothing was freed for it since
 * (usecases/place/waitingBudget.ts LastAttempts). Counted when the write ends, failed or not (a failed write
 * may have been applied): a spurious count costs one placement attempt, a missed one a wait.
 * Not for AWS, where other function instances write the table.
 */
export function withRoomSignal<S extends PoolStore>(store: S): { store: S; signal: RoomSignal } {
  let generation = 0;
  const counted = new Map<string, (...args: unknown[]) => Promise<unknown>>();
  const proxy = new Proxy(store, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver) as unknown;
      if (typeof prop !== 'string' || typeof value !== 'function') return value;
      if (!FREEING.has(prop)) return (value as (...a: unknown[]) => unknown).bind(target);
      let wrapped = counted.get(prop);
      if (!wrapped) {
        const method = value as (...a: unknown[]) => Promise<unknown>;
        wrapped = async (...args: unknown[]) => {
          try {
            return await method.apply(target, args);
          } finally {
            generation++;
          }
        };
        counted.set(prop, wrapped);
      }
      return wrapped;
    },
  });
  return { store: proxy, signal: { generation: () => generation } };
}
