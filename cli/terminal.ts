/**
 * What the CLI writes to a terminal comes partly from messages and configurations anyone could send
 * (labels, ids, reasons): escape sequences in them would clear the screen, set the title, or hide
 * text (bidi overrides). Every human line goes through `terminalText`; JSON through `terminalJson`.
 */

/** C0 controls but tab and newline, DEL, C1 controls, and the invisible direction marks and overrides. */
// biome-ignore lint/complexity/useRegexLiterals: a literal would hold control characters, which noControlCharactersInRegex refuses
const UNSAFE = new RegExp(
  '[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]',
  'g',
);
/** In JSON, C0 controls are escaped by JSON.stringify already; the rest are not. */
// biome-ignore lint/complexity/useRegexLiterals: kept like UNSAFE, as a string of escapes
const UNSAFE_IN_JSON = new RegExp(
  '[\\u007f-\\u009f\\u061c\\u200e\\u200f\\u2028\\u2029\\u202a-\\u202e\\u2066-\\u2069]',
  'g',
);

const hex = (c: string, width: number) => c.charCodeAt(0).toString(16).padStart(width, '0');

/** The text with every unsafe character shown as `\xHH` / `\uHHHH`: inert, and still visible. */
export function terminalText(text: string): string {
  return text.replace(UNSAFE, (c) => (c.charCodeAt(0) < 0x100 ? `\\x${hex(c, 2)}` : `\\u${hex(c, 4)}`));
}

/** JSON text with the characters JSON.stringify leaves raw escaped as `\uHHHH`: the same JSON value. */
export function terminalJson(json: string): string {
  return json.replace(UNSAFE_IN_JSON, (c) => `\\u${hex(c, 4)}`);
}
