import type { PoolStore } from '../shared/core/poolStore.ts';

/**
 * A store whose invocation dies at a point: once `dies(method)` says so after a call took effect, that
 * call and every later one throw, as when Lambda kills the function mid-way (the chaos suite's crash
 * points, for one test at a time).
 */
export function crashingStore(store: PoolStore, dies: (method: string) => boolean): PoolStore {
  let dead = false;
  return new Proxy(store, {
    get(target, prop) {
      const value = Reflect.get(target, prop, target) as unknown;
      if (typeof value !== 'function') return value;
      return async (...args: unknown[]) => {
        if (dead) throw new Error('crashed: the invocation is dead');
        const result = await (value as (...a: unknown[]) => Promise<unknown>).apply(target, args);
        if (dies(String(prop))) {
          dead = true;
          throw new Error(`crashed after ${String(prop)}`);
        }
        return result;
      };
    },
  });
}
