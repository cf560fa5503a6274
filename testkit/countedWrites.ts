import type { PoolStore } from '../shared/core/poolStore.ts';

/** A versioned write of the store: it returns whether the write took (false: another writer's version won). */
type VersionedWrite = 'putEstimate' | 'putForecast';

/**
 * The store as one function instance sees it, with one versioned write counted: `done` when it took,
 * `refused` when a concurrent writer's version won. Every other member is the store's own.
 */
export function countedWrites<S extends PoolStore>(
  store: S,
  method: VersionedWrite,
): { store: S; writes: { done: number; refused: number } } {
  const writes = { done: 0, refused: 0 };
  const counted = new Proxy(store, {
    get(target, name) {
      if (name === method) {
        return async (...args: unknown[]) => {
          const ok = await (target[method] as (...a: unknown[]) => Promise<boolean>).apply(target, args);
          writes[ok ? 'done' : 'refused']++;
          return ok;
        };
      }
      const value = Reflect.get(target, name, target);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  return { store: counted, writes };
}
