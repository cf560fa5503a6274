import { inertJson } from '../shared/core/text.ts';

/**
 * What the CLI writes to a terminal comes partly from messages and configurations anyone could send
 * (labels, ids, reasons): escape sequences in them would clear the screen, set the title, or hide
 * text (bidi overrides, zero-width characters), and a newline in a value would print a forged line
 * (a row of a table, a log line). Every human line goes through `terminalText`; every value quoted in
 * one (a table's cell, a reason, a log field) through `terminalValue` (or the `human` template tag),
 * which escapes tabs and newlines too; JSON through `terminalJson`.
 */

/**
 * Controls (C0 but tab and newline, DEL, C1), format characters (bidi marks and overrides, zero-width
 * spaces and joiners, U+FEFF, U+2060, soft hyphen…) and the line and paragraph separators.
 */
const UNSAFE = /(?![\t\n])[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;
/** The same, tab and newline included: nothing in a value may break the line it is quoted in. */
const UNSAFE_IN_VALUE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu;

/** `\xHH` below U+0100, `\uHHHH` in the first plane, `\u{HHHHH}` beyond (tag characters). */
function escaped(c: string): string {
  const code = c.codePointAt(0) ?? 0;
  const hex = code.toString(16);
  if (code < 0x100) return `\\x${hex.padStart(2, '0')}`;
  return code <= 0xffff ? `\\u${hex.padStart(4, '0')}` : `\\u{${hex}}`;
}

/** The text with every unsafe character shown as `\xHH` / `\uHHHH`: inert, and still visible. */
export function terminalText(text: string): string {
  return text.replace(UNSAFE, escaped);
}

/** A value quoted in a line of output: as `terminalText`, and tabs and newlines escaped too (`\x09`, `\x0a`). */
export function terminalValue(value: string): string {
  return value.replace(UNSAFE_IN_VALUE, escaped);
}

/**
 * A line of output with each interpolated value escaped as `terminalValue` (a nested template is one
 * value): ``human`request ${id}: ${state}${reason ? ` (${reason})` : ''}` ``.
 */
export function human(strings: TemplateStringsArray, ...values: unknown[]): string {
  return strings.reduce(
    (line, literal, i) => line + literal + (i < values.length ? terminalValue(String(values[i])) : ''),
    '',
  );
}

/** JSON text with the characters JSON.stringify leaves raw escaped as `\uHHHH`: the same JSON value. */
export const terminalJson = inertJson;
