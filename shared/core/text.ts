/**
 * Bounds on what the pool writes from untrusted text. A reason is stored on a request (and on each of
 * its nodes) and a backing node, and published in events: a reason that quotes a 250 KB label, or lists
 * thousands of them, would push the item past DynamoDB's 400 KB limit, and the write that records a
 * permanent failure would itself fail, again and again. So reasons are cut to MAX_REASON_LENGTH and the
 * values they quote to MAX_QUOTED_LENGTH (the limits of the request message itself are in messages.ts;
 * test/unit/core.test.ts checks that the largest request the schema admits fits in an item).
 */

/** Characters (UTF-16 code units, at most 3 bytes each in UTF-8) of a stored reason. */
export const MAX_REASON_LENGTH = 500;

/** Characters of one value quoted in a reason (a label, a key). */
export const MAX_QUOTED_LENGTH = 64;

/** Values listed in a reason before the rest is only counted. */
export const MAX_LISTED = 5;

/** `text` cut to at most `max` characters, saying how much was left out. */
export function clip(text: string, max: number): string {
  if (text.length <= max) return text;
  const note = (omitted: number) => `… (${omitted} more characters)`;
  // The note's longest form (it only gets shorter as more is kept) leaves room for this much:
  const room = max - note(text.length).length;
  const noted = room > 0; // else too short for a note: a plain cut
  let keep = noted ? room : max;
  // Do not split a surrogate pair: half a character is not valid UTF-8.
  if (keep > 0 && /[\uD800-\uDBFF]/.test(text.charAt(keep - 1))) keep--;
  return noted ? `${text.slice(0, keep)}${note(text.length - keep)}` : text.slice(0, keep);
}

/** A reason as it is stored and published. */
export function boundedReason(reason: string): string {
  return clip(reason, MAX_REASON_LENGTH);
}

/** A value quoted in a reason: JSON-quoted (control characters escaped), cut to MAX_QUOTED_LENGTH. */
export function quote(value: string): string {
  return JSON.stringify(clip(value, MAX_QUOTED_LENGTH));
}

/** The first MAX_LISTED items joined, then how many more there were: `"a", "b" and 12 more`. */
export function listSome(items: readonly string[], show: (item: string) => string = quote): string {
  const shown = items.slice(0, MAX_LISTED).map(show).join(', ');
  return items.length > MAX_LISTED ? `${shown} and ${items.length - MAX_LISTED} more` : shown;
}

/** The characters JSON.stringify leaves raw that a terminal acts on or hides: DEL, C1, format, separators. */
const UNSAFE_IN_JSON = /[\u007f-\u009f\p{Cf}\p{Zl}\p{Zp}]/gu;

/**
 * JSON text with every character of UNSAFE_IN_JSON escaped as `\uHHHH` (a surrogate pair beyond the first
 * plane): the same JSON value, and inert when shown raw (`tail -f events.jsonl`, `--json` in a terminal).
 * JSON.stringify has escaped the C0 controls already.
 */
export function inertJson(json: string): string {
  return json.replace(UNSAFE_IN_JSON, (c) =>
    c
      .split('')
      .map((unit) => `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`)
      .join(''),
  );
}

/** One word for a POSIX shell, exactly `text` once the shell has read it: single-quoted, `'` as `'\''`. */
export function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}
