/** The structured logger the core, the use cases and the adapters write to (Powertools' Logger satisfies it). */
export interface Log {
  debug(message: string, ...extra: Record<string, unknown>[]): void;
  info(message: string, ...extra: Record<string, unknown>[]): void;
  warn(message: string, ...extra: Record<string, unknown>[]): void;
  error(message: string, ...extra: Record<string, unknown>[]): void;
}

export const silentLog: Log = { debug() {}, info() {}, warn() {}, error() {} };

/**
 * A log whose every line carries `keys` (as Powertools' child loggers and appendKeys do): the request
 * function gives each message's use cases one naming its request, so every line about a message says
 * which. A line's own fields win over the keys (a release that hands room to another request names it).
 */
export function withKeys(log: Log, keys: Record<string, unknown>): Log {
  const line =
    (level: keyof Log) =>
    (message: string, ...extra: Record<string, unknown>[]): void =>
      log[level](message, Object.assign({}, keys, ...extra));
  return { debug: line('debug'), info: line('info'), warn: line('warn'), error: line('error') };
}
