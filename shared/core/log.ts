/** The structured logger the core, the use cases and the adapters write to (Powertools' Logger satisfies it). */
export interface Log {
  debug(message: string, ...extra: Record<string, unknown>[]): void;
  info(message: string, ...extra: Record<string, unknown>[]): void;
  warn(message: string, ...extra: Record<string, unknown>[]): void;
  error(message: string, ...extra: Record<string, unknown>[]): void;
}

export const silentLog: Log = { debug() {}, info() {}, warn() {}, error() {} };
