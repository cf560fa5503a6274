import type { ResolvedConfig } from '../config/model.ts';
import type { Clock } from '../core/clock.ts';
import type { ProviderRegistry } from '../core/provider.ts';
import type { DynamoStore } from '../store/dynamoStore.ts';

/** The structured logger the use cases need (Powertools' Logger satisfies it). */
export interface Log {
  debug(message: string, ...extra: Record<string, unknown>[]): void;
  info(message: string, ...extra: Record<string, unknown>[]): void;
  warn(message: string, ...extra: Record<string, unknown>[]): void;
  error(message: string, ...extra: Record<string, unknown>[]): void;
}

export const silentLog: Log = { debug() {}, info() {}, warn() {}, error() {} };

/** Everything a use case depends on, injected by the Lambda entry point or the embedded stack. */
export interface Context {
  readonly store: DynamoStore;
  readonly config: ResolvedConfig;
  readonly providers: ProviderRegistry;
  readonly clock: Clock;
  readonly log: Log;
}

/** How many times a use case re-reads and retries after losing a conditional write. */
export const MAX_CONFLICT_RETRIES = 20;
