/** Option parsers and options the commands of program.ts share. */
import { type Command, InvalidArgumentError } from 'commander';
import { MAX_PRIORITY } from '../shared/core/priority.ts';

/*
 * Every number option takes a number written in plain decimal, as a message carries it: digits, and a
 * fraction where one makes sense. Number() alone read `0x20` as 32, `1e1` as 10, ` 30` as 30 and `` as 0.
 */
const WHOLE = /^\d{1,15}$/;
const DECIMAL = /^\d{1,15}(\.\d{1,15})?$/;

/** A whole number written in decimal digits, from `min` to `max`. */
export const whole =
  (name: string, what: string, min = 0, max = Number.MAX_SAFE_INTEGER) =>
  (value: string) => {
    const n = Number(value);
    if (!WHOLE.test(value) || n < min || n > max)
      throw new InvalidArgumentError(`${name} must be ${what}, written in decimal digits`);
    return n;
  };

/** A number written in decimal (digits, an optional fraction), above 0 when `positive`. */
export const decimal =
  (name: string, what: string, positive = false) =>
  (value: string) => {
    const n = Number(value);
    if (!DECIMAL.test(value) || (positive && n <= 0))
      throw new InvalidArgumentError(`${name} must be ${what}, written in decimal (as 30 or 0.5)`);
    return n;
  };

export const seconds = (name: string) => decimal(name, 'a number of seconds >= 0');

export const positiveSeconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!DECIMAL.test(value) || n < 0.1 || n > 3600)
    throw new InvalidArgumentError(
      `${name} must be a number of seconds from 0.1 to 3600, written in decimal`,
    );
  return n;
};

/** A lease length: whole seconds in decimal; its bounds are the message schema's (`lease: ...`). */
export const leaseSeconds = whole('--lease', 'a whole number of seconds');

/**
 * A priority as a message carries it: an integer written in decimal, within the bounds. Strict, where
 * parseInt read `1e300` as 1 and `0x10` as 0.
 */
export const priority = (value: string) => {
  const n = Number(value);
  if (!/^-?\d{1,7}$/.test(value) || Math.abs(n) > MAX_PRIORITY)
    throw new InvalidArgumentError(`--priority must be an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY}`);
  return n;
};

/** What a request is made of, as `request` and `run` take it: labels or a shape, and how to place it. */
export function requestOptions(command: Command, kept: string): Command {
  return command
    .option('--cores <n>', 'by shape: cores each node needs', decimal('--cores', 'a number > 0', true))
    .option('--memory <size>', 'by shape: memory each node needs ("4GiB")')
    .option('--disk <size>', 'by shape: disk each node needs ("20GiB")')
    .option(
      '--count <n>',
      'by shape: how many nodes of that shape, served together (default: 1)',
      whole('--count', 'a whole number'), // its bounds: requestSpecOf,
    )
    .option('--id <id>', 'request id (default: generated); re-sending the same id never allocates twice')
    .option('--requestor <name>', 'who asks (recorded with the request)', 'cli')
    .option(
      '--priority <n>',
      `request priority: an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY}, lower first (default: 100)`,
      priority,
    )
    .option(
      '--expected-duration <seconds>',
      `how long ${kept}: placed beside nodes expected to end about then`,
      seconds('--expected-duration'),
    );
}
