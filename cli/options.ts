/** Option parsers and options the commands of program.ts share. */
import { type Command, InvalidArgumentError } from 'commander';
import { MAX_PRIORITY } from '../shared/core/priority.ts';

export const seconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0)
    throw new InvalidArgumentError(`${name} must be a number of seconds >= 0`);
  return n;
};

export const positiveSeconds = (name: string) => (value: string) => {
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0.1 || n > 3600)
    throw new InvalidArgumentError(`${name} must be a number of seconds from 0.1 to 3600`);
  return n;
};

/**
 * A priority as a message carries it: an integer written in decimal, within the bounds. Strict, where
 * parseInt read `1e300` as 1 and `0x10` as 0.
 */
export const priority = (value: string) => {
  const n = Number(value);
  if (!/^[+-]?\d{1,7}$/.test(value.trim()) || Math.abs(n) > MAX_PRIORITY)
    throw new InvalidArgumentError(`--priority must be an integer from ${-MAX_PRIORITY} to ${MAX_PRIORITY}`);
  return n;
};

/** What a request is made of, as `request` and `run` take it: labels or a shape, and how to place it. */
export function requestOptions(command: Command, kept: string): Command {
  return command
    .option('--cores <n>', 'by shape: cores each node needs', (v) => {
      const n = Number(v);
      if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError('--cores must be a number > 0');
      return n;
    })
    .option('--memory <size>', 'by shape: memory each node needs ("4GiB")')
    .option('--disk <size>', 'by shape: disk each node needs ("20GiB")')
    .option('--count <n>', 'by shape: how many nodes of that shape, served together (default: 1)', (v) =>
      Number(v),
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
