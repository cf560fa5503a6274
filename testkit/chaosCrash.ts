import { AsyncLocalStorage } from 'node:async_hooks';
import type { Clock } from '../shared/core/clock.ts';
import type { Random } from './chaosRandom.ts';

/**
 * Crash injection for the chaos suite. The store and the providers the handlers use are wrapped in
 * proxies; every call of a wrapped method is a step boundary (before it, and after it took effect).
 * One boundary at a time is armed: on its k-th call (k random) the handler invocation making the call
 * "crashes": that call throws a Crash, and so does every later store or provider call of the same
 * invocation (the process is dead: code that swallows the first Crash cannot write anything more).
 * The runner then treats the whole batch as failed, as Lambda does when a function crashes, so SQS
 * delivers it again. The armed boundary then moves to the next one, cycling through all of them; a
 * boundary whose method is not called within `patienceMs` (virtual) is passed over until the next cycle.
 */
export type HandlerKind = 'request' | 'fulfil' | 'reaper';

export class Crash extends Error {
  override name = 'Crash';
}

export interface Invocation {
  readonly kind: HandlerKind;
  readonly id: number;
  /** The boundary it died at. */
  crashedAt?: string;
}

export interface Boundary {
  readonly target: 'store' | 'provider';
  readonly method: string;
  readonly phase: 'before' | 'after';
}

/** The store methods the use cases call (the port: shared/core/poolStore.ts). */
export const STORE_METHODS = [
  'createRequest',
  'getRequest',
  'getRequests',
  'putRequest',
  'releaseNodeEntry',
  'takeSpareNode',
  'getBacking',
  'createBacking',
  'putBacking',
  'claimSlot',
  'findCandidates',
  'backingInPhase',
  'reserveNodePlaces',
  'takeOverNodePlace',
  'freeNodePlaces',
  'reserveBackingPlace',
  'takeOverBackingPlace',
  'freeBackingPlace',
  'pointToBacking',
  'backingIdOfResource',
  'forgetResource',
  'renewLease',
  'lapseLease',
  'dropLease',
  'leasesBefore',
] as const;

/**
 * Between two actions of a transaction (LocalTransactions.afterAction): a boundary inside one store call,
 * so a delivery also dies half-way through one atomic write, as a process killed there would. The
 * transaction is rolled back from its intent item before anything else reads the table.
 */
export const TRANSACTION_STEP = 'transaction action applied';

/** The BackingProvider methods (launchBlocked is synchronous and local: no boundary). */
export const PROVIDER_METHODS = ['launch', 'describe', 'terminate', 'list'] as const;

export function label(b: Boundary): string {
  return `${b.phase} ${b.target}.${b.method}`;
}

export interface CrashOptions {
  /** The armed boundary fires on its k-th call, k uniform in [1, maxK]. */
  readonly maxK: number;
  /** The armed boundary is passed over (until the next cycle) after this long without firing (virtual ms). */
  readonly patienceMs: number;
}

export type Outcome<T> = { readonly invocation: number; readonly crashedAt?: string } & (
  | { readonly ok: true; readonly value: T }
  | { readonly ok: false; readonly error: unknown }
);

export class CrashInjector {
  private readonly als = new AsyncLocalStorage<Invocation>();
  readonly boundaries: readonly Boundary[];
  private index = 0;
  private countdown: number;
  private armedAt: number;
  private invocations = 0;
  /** Off: nothing crashes (dead invocations stay dead). */
  enabled = true;
  readonly injected = new Map<string, number>();
  readonly byKind: Record<HandlerKind, number> = { request: 0, fulfil: 0, reaper: 0 };
  /** Times a boundary was passed over for want of calls. */
  readonly passedOver = new Map<string, number>();
  total = 0;
  /** Calls of each wrapped method by handler kind (`reaper store.backingInPhase`...), crashed ones included. */
  readonly calls = new Map<string, number>();
  /** Full cycles through every boundary. */
  cycles = 0;

  constructor(
    private readonly random: Random,
    private readonly clock: Clock,
    private readonly options: CrashOptions,
  ) {
    this.armedAt = clock.now();
    // Inside a transaction first: a run of 100 requests crashes some 40 times, so each cycle's start is hit.
    const all: Boundary[] = [{ target: 'store', method: TRANSACTION_STEP, phase: 'after' }];
    for (const [target, methods] of [
      ['store', STORE_METHODS],
      ['provider', PROVIDER_METHODS],
    ] as const) {
      for (const method of methods) {
        for (const phase of ['before', 'after'] as const) all.push({ target, method, phase });
      }
    }
    this.boundaries = all;
    this.countdown = this.random.int(1, options.maxK);
  }

  /** An action of a transaction took effect (LocalTransactions.afterAction): TRANSACTION_STEP. */
  step(): void {
    const invocation = this.als.getStore();
    if (invocation && !invocation.crashedAt) this.point(invocation, 'store', TRANSACTION_STEP, 'after');
  }

  /** The invocation the caller runs in, if any. */
  current(): Invocation | undefined {
    return this.als.getStore();
  }

  get armed(): Boundary {
    return this.boundaries[this.index] as Boundary;
  }

  /** Runs one handler invocation; its wrapped calls know which invocation they belong to. */
  async run<T>(kind: HandlerKind, fn: () => Promise<T>): Promise<Outcome<T>> {
    const invocation: Invocation = { kind, id: ++this.invocations };
    const ended = () => ({
      invocation: invocation.id,
      ...(invocation.crashedAt ? { crashedAt: invocation.crashedAt } : {}),
    });
    try {
      const value = await this.als.run(invocation, fn);
      return { ok: true, value, ...ended() };
    } catch (error) {
      return { ok: false, error, ...ended() };
    }
  }

  /**
   * A proxy whose listed async methods are boundaries; `after` sees each successful call's result
   * (before a crash after it is injected: the call took effect).
   */
  wrap<T extends object>(
    target: Boundary['target'],
    object: T,
    methods: readonly string[],
    after?: (method: string, args: unknown[], result: unknown) => void | Promise<void>,
  ): T {
    const wrapped = new Set(methods);
    return new Proxy(object, {
      get: (t, prop) => {
        const value = Reflect.get(t, prop, t) as unknown;
        if (typeof value !== 'function') return value;
        const fn = value as (...args: unknown[]) => unknown;
        if (typeof prop !== 'string' || !wrapped.has(prop)) return fn.bind(t);
        return async (...args: unknown[]) => {
          const invocation = this.als.getStore();
          const name = `${invocation?.kind ?? 'other'} ${target}.${prop}`;
          this.calls.set(name, (this.calls.get(name) ?? 0) + 1);
          if (invocation?.crashedAt) {
            throw new Crash(`${invocation.kind} #${invocation.id} is dead (crashed ${invocation.crashedAt})`);
          }
          if (invocation) this.point(invocation, target, prop, 'before');
          const result = await fn.apply(t, args);
          await after?.(prop, args, result);
          if (invocation) this.point(invocation, target, prop, 'after');
          return result;
        };
      },
    });
  }

  private point(
    invocation: Invocation,
    target: Boundary['target'],
    method: string,
    phase: Boundary['phase'],
  ) {
    if (!this.enabled) return;
    const b = this.armed;
    if (b.target !== target || b.method !== method) {
      if (this.clock.now() - this.armedAt > this.options.patienceMs) {
        this.passedOver.set(label(b), (this.passedOver.get(label(b)) ?? 0) + 1);
        this.advance();
      }
      return;
    }
    if (b.phase !== phase) return;
    if (--this.countdown > 0) return;
    const name = label(b);
    invocation.crashedAt = name;
    this.total++;
    this.byKind[invocation.kind]++;
    this.injected.set(name, (this.injected.get(name) ?? 0) + 1);
    this.advance();
    throw new Crash(`injected crash ${name} in ${invocation.kind} #${invocation.id}`);
  }

  private advance(): void {
    this.index = (this.index + 1) % this.boundaries.length;
    if (this.index === 0) this.cycles++;
    this.countdown = this.random.int(1, this.options.maxK);
    this.armedAt = this.clock.now();
  }
}
