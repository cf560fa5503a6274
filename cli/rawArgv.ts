import { isUtf8 } from 'node:buffer';
import { readFileSync } from 'node:fs';

/**
 * Node decodes its arguments as UTF-8 and turns bytes that are not into U+FFFD, so `metastatic run`
 * would run another command than the one given (`printf %s $'\xff'` would print EF BF BD). The bytes as
 * the kernel passed them are in /proc/self/cmdline (Linux): there such an argument can be seen, and
 * refused. Elsewhere, or when the cmdline does not end with the command (a process that renamed
 * itself), nothing can be told.
 */

/** This process's arguments as the kernel passed them, NUL-terminated; undefined without /proc. */
function readCmdline(): Buffer | undefined {
  try {
    return readFileSync('/proc/self/cmdline');
  } catch {
    return undefined;
  }
}

/**
 * Why `command` (the tail of process.argv) cannot be run as given: the first of its arguments whose raw
 * bytes are not valid UTF-8, named with its bytes and what to do instead; undefined when every one is
 * (a real U+FFFD, EF BF BD, is a character like any other) or the raw bytes cannot be read.
 */
export function nonUtf8Argument(
  command: readonly string[],
  cmdline: Buffer | undefined = readCmdline(),
  verb = 'metastatic run',
): string | undefined {
  if (!cmdline || command.length === 0) return undefined;
  const parts: Buffer[] = [];
  for (let at = 0; at < cmdline.length; ) {
    const end = cmdline.indexOf(0, at);
    parts.push(cmdline.subarray(at, end < 0 ? cmdline.length : end));
    at = end < 0 ? cmdline.length : end + 1;
  }
  const raw = parts.slice(-command.length);
  if (raw.length !== command.length) return undefined;
  let bad: number | undefined;
  for (const [i, bytes] of raw.entries()) {
    const given = command[i] as string;
    if (isUtf8(bytes)) {
      if (bytes.toString('utf8') !== given) return undefined; // not this command's bytes
    } else if (!given.includes('\uFFFD')) return undefined;
    else bad ??= i;
  }
  if (bad === undefined) return undefined;
  const shown = [...(raw[bad] as Buffer).subarray(0, 60)]
    .map((b) =>
      b >= 0x20 && b < 0x7f && b !== 0x22 && b !== 0x5c
        ? String.fromCharCode(b)
        : `\\x${b.toString(16).padStart(2, '0')}`,
    )
    .join('');
  return (
    `argument ${bad + 1} of the command ("${shown}") is not valid UTF-8: ${verb} passes the command ` +
    'to the node as text, and these bytes would arrive changed (as U+FFFD). Pass binary data on stdin or ' +
    "in a file, or encoded (printf's octal escapes, base64)"
  );
}
