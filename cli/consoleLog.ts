import type { Log } from '../shared/core/log.ts';
import { terminalJson, terminalValue } from './terminal.ts';

const levels = { debug: 10, info: 20, warn: 30, error: 40 } as const;
export type Level = keyof typeof levels;

/** Human-readable log lines for `metastatic dev` (Lambda uses Powertools' JSON logger instead). */
export function consoleLog(minLevel: Level, json = false): Log {
  const write =
    (level: Level) =>
    (message: string, ...extra: Record<string, unknown>[]) => {
      if (levels[level] < levels[minLevel]) return;
      const fields = Object.fromEntries(
        Object.entries(Object.assign({}, ...extra) as Record<string, unknown>).filter(
          ([, v]) => v !== undefined,
        ),
      );
      for (const [k, v] of Object.entries(fields)) if (v instanceof Error) fields[k] = v.message;
      if (json) {
        process.stderr.write(
          `${terminalJson(JSON.stringify({ level: level.toUpperCase(), timestamp: new Date().toISOString(), message, ...fields }))}\n`,
        );
        return;
      }
      const time = new Date().toISOString().slice(11, 23);
      const rest = Object.entries(fields)
        .map(([k, v]) => `${k}=${typeof v === 'string' ? v : JSON.stringify(v)}`)
        .join(' ');
      // One line, whatever its values hold: a newline in a field would print a forged log line.
      process.stderr.write(
        `${terminalValue(`${time} ${level.toUpperCase().padEnd(5)} ${message}${rest ? `  ${rest}` : ''}`)}\n`,
      );
    };
  return { debug: write('debug'), info: write('info'), warn: write('warn'), error: write('error') };
}
