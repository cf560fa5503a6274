/** Text tables and the results file of `npm run cost`. */

/** A plain-text table: the first column left-aligned, the others right-aligned. */
export function table(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join('   ')
      .trimEnd();
  return [line(headers), line(widths.map((w) => '-'.repeat(w))), ...rows.map(line)].join('\n');
}

export const hours = (seconds: number) => (seconds / 3600).toFixed(2);
export const ratio = (x: number) => x.toFixed(3);
export const secs = (s: number) => `${s.toFixed(1)} s`;
export const pct = (part: number, whole: number) => `${whole === 0 ? 0 : Math.round((100 * part) / whole)}%`;

/**
 * JSON as Biome formats it (2 spaces; an array of plain values on one line when it fits in 110
 * columns), so the results file passes `npm run lint` as written. (Keep arrays of plain values short:
 * Biome fills long ones over several lines, which this does not imitate.)
 */
export function formatJson(value: unknown): string {
  return `${write(value, 0, 0)}\n`;
}

const LINE_WIDTH = 110;

/** `col`: the column the value starts at (after its key). */
function write(value: unknown, indent: number, col: number): string {
  const pad = ' '.repeat(indent + 2);
  if (Array.isArray(value)) {
    if (value.length === 0) return '[]';
    const plain = value.every((v) => v === null || typeof v !== 'object');
    const inline = `[${value.map((v) => JSON.stringify(v)).join(', ')}]`;
    if (plain && col + inline.length + 1 <= LINE_WIDTH) return inline;
    return `[\n${value.map((v) => pad + write(v, indent + 2, pad.length)).join(',\n')}\n${' '.repeat(indent)}]`;
  }
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value).filter(([, v]) => v !== undefined);
    if (entries.length === 0) return '{}';
    const lines = entries.map(([k, v]) => {
      const key = `${pad}${JSON.stringify(k)}: `;
      return key + write(v, indent + 2, key.length);
    });
    return `{\n${lines.join(',\n')}\n${' '.repeat(indent)}}`;
  }
  return JSON.stringify(value);
}
