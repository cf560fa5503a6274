/**
 * A DynamoDB store on its own in-process dynalite, with an SDK middleware that counts every command and
 * every ConditionalCheckFailedException (by command and by item kind), globally and per claimant: each
 * claimant runs inside an AsyncLocalStorage scope, which the middleware reads, so concurrent claimants'
 * calls are told apart without touching the code under test. No queues, no provider processes: the
 * use cases are called directly with a Context whose provider must never be asked for anything.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { performance } from 'node:perf_hooks';
import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import { systemClock } from '../shared/core/clock.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import type { ProviderRegistry } from '../shared/core/provider.ts';
import { type Engine, ensureTable, localDynamoClient, startDynalite } from '../shared/runtime/engines.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import type { Context } from '../shared/usecases/context.ts';
import { log } from './common.ts';

/** What one claimant (one requestNodes call) did, as the middleware saw it. */
export interface Claimant {
  readonly id: string;
  calls: number;
  conflicts: number;
  /** Backing items written (claim attempts), in order. */
  readonly backingWrites: string[];
  /** Backing items whose conditional write failed, in order. */
  readonly backingConflicts: string[];
}

export const newClaimant = (id: string): Claimant => ({
  id,
  calls: 0,
  conflicts: 0,
  backingWrites: [],
  backingConflicts: [],
});

const bump = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1);

/** The item a command targets (`pk`), whether the input is still plain values or already marshalled. */
function pkOf(input: { Item?: Record<string, unknown>; Key?: Record<string, unknown> }): string | undefined {
  const raw = input.Item?.pk ?? input.Key?.pk;
  if (typeof raw === 'string') return raw;
  const s = (raw as { S?: unknown } | undefined)?.S;
  return typeof s === 'string' ? s : undefined;
}

export class InstrumentedStore {
  readonly scope = new AsyncLocalStorage<Claimant>();
  /** Only while true are commands and conflicts counted. */
  counting = false;
  readonly calls = new Map<string, number>();
  /** Conditional-check failures by `<command> <item kind>` (item kind: BACKING, REQUEST, POOL...). */
  readonly conflicts = new Map<string, number>();
  /** Launches asked of the provider (must stay 0: every allocation has a free slot to go to). */
  launches = 0;
  /** Called after every counted command that succeeded: its name, how long it took (ms), its output. */
  onCall: ((command: string, ms: number, output: unknown) => void) | undefined;

  private constructor(
    private readonly engine: Engine,
    readonly client: DynamoDBClient,
  ) {
    client.middlewareStack.add(
      (next, context) => async (args) => {
        if (!this.counting) return next(args);
        const name = (context.commandName ?? 'unknown').replace(/Command$/, '');
        const pk = pkOf(args.input as { Item?: Record<string, unknown>; Key?: Record<string, unknown> });
        const kind = pk?.split('#')[0] ?? '-';
        const claimant = this.scope.getStore();
        bump(this.calls, name);
        if (claimant) {
          claimant.calls++;
          if ((name === 'PutItem' || name === 'UpdateItem') && kind === 'BACKING' && pk)
            claimant.backingWrites.push(pk);
        }
        const started = performance.now();
        try {
          const out = await next(args);
          this.onCall?.(name, performance.now() - started, out.output);
          return out;
        } catch (err) {
          // A failed condition: of one write, or of a transaction's (a capacity set's), cancelled.
          const failed = (err as Error).name;
          if (failed === 'ConditionalCheckFailedException' || failed === 'TransactionCanceledException') {
            bump(this.conflicts, `${name} ${kind}`);
            if (claimant) {
              claimant.conflicts++;
              if (kind === 'BACKING' && pk) claimant.backingConflicts.push(pk);
            }
          }
          throw err;
        }
      },
      { step: 'initialize', name: 'benchConflictCounter' },
    );
  }

  static async start(): Promise<InstrumentedStore> {
    const engine = await startDynalite();
    // As the embedded pool's client: DynamoDB's limits, and transactions (dynalite has none).
    const { client } = localDynamoClient(
      {
        endpoint: engine.endpoint,
        region: 'us-east-1',
        credentials: { accessKeyId: 'bench', secretAccessKey: 'bench' },
      },
      engine.endpoint,
    );
    return new InstrumentedStore(engine, client);
  }

  /** A store on a fresh table of this engine. */
  async store(tableName: string): Promise<DynamoStore> {
    await ensureTable(this.client, tableName);
    return new DynamoStore(this.client, tableName);
  }

  /** A use-case context: real store and config, a provider that only counts (and refuses) launches. */
  context(store: DynamoStore, config: ResolvedConfig): Context {
    const refuse = (what: string): never => {
      this.launches++;
      throw new Error(`bench: the provider was asked to ${what}; every allocation should find a free slot`);
    };
    const providers: ProviderRegistry = {
      forPool: () => refuse('launch'),
      forResource: () => undefined,
    };
    return { store, config, providers, clock: systemClock, log };
  }

  resetCounts(): void {
    this.calls.clear();
    this.conflicts.clear();
  }

  async close(): Promise<void> {
    this.client.destroy();
    await this.engine.close();
  }
}
