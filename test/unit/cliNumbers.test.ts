import { CommanderError } from 'commander';
import { describe, expect, it } from 'vitest';
import { buildProgram } from '../../cli/program.ts';

/**
 * Issue 41, defect 7: every number option of the CLI takes a number written in plain decimal only (as
 * `--priority` does): `0x20`, `1e1`, ` 30` and an empty string were read by Number() as 32, 10, 30 and 0.
 * Parsed with every command's action replaced, so an option accepted by mistake starts nothing.
 */
function parse(args: string[]): unknown {
  const program = buildProgram();
  const quiet = (c: typeof program) => c.configureOutput({ writeErr: () => {}, writeOut: () => {} });
  quiet(program);
  for (const c of program.commands) {
    quiet(c);
    c.action(() => {
      throw new Error('accepted');
    });
  }
  try {
    program.parse(['node', 'metastatic', ...args]);
  } catch (err) {
    return err;
  }
  return undefined;
}

/** A command line with `X` where the value goes, and the option it is given to. */
const CASES: Array<[string[], string]> = [
  [['request', 'small-node', '--lease', 'X'], '--lease'],
  [['request', 'small-node', '--wait', '--timeout', 'X'], '--timeout'],
  [['request', 'small-node', '--priority', 'X'], '--priority'],
  [['request', 'small-node', '--expected-duration', 'X'], '--expected-duration'],
  [['request', '--cores', 'X'], '--cores'],
  [['request', '--cores', '1', '--count', 'X'], '--count'],
  [['release', 'a/0', '--timeout', 'X'], '--timeout'],
  [['renew', 'a', '--lease', 'X'], '--lease'],
  [['renew', 'a', '--timeout', 'X'], '--timeout'],
  [['cancel', 'a', '--timeout', 'X'], '--timeout'],
  [['ssh', 'a/0', '--timeout', 'X'], '--timeout'],
  [['run', 'small-node', '--lease', 'X', '--', 'true'], '--lease'],
  [['run', 'small-node', '--timeout', 'X', '--', 'true'], '--timeout'],
  [['run', '--cores', '1', '--count', 'X', '--', 'true'], '--count'],
  [['inventory', 'a', '--timeout', 'X'], '--timeout'],
  [['status', '--watch', '--interval', 'X'], '--interval'],
  [['dev', '--reaper-interval', 'X'], '--reaper-interval'],
  [['rehearse', '--port', 'X'], '--port'],
  [['rehearse', '--concurrency', 'X'], '--concurrency'],
  [['rehearse', '--reaper-interval', 'X'], '--reaper-interval'],
];
const BAD = ['0x20', '1e1', ' 30', '30 ', '', '+30', '30s', '0b11', 'Infinity', '1_0'];

describe('number options', () => {
  for (const [args, option] of CASES) {
    it(`${args[0]} ${option}: refuses anything but decimal digits, naming the option (exit 2)`, () => {
      for (const bad of BAD) {
        const err = parse(args.map((a) => (a === 'X' ? bad : a)));
        expect(err, `${option} ${JSON.stringify(bad)}`).toBeInstanceOf(CommanderError);
        expect((err as CommanderError).code, `${option} ${JSON.stringify(bad)}`).toBe(
          'commander.invalidArgument',
        );
        expect((err as CommanderError).message).toContain(option);
      }
      // A decimal value gets through to the command.
      const good = option === '--priority' ? '-30' : '30';
      expect((parse(args.map((a) => (a === 'X' ? good : a))) as Error).message).toBe('accepted');
    });
  }

  it('keeps fractions where seconds may have them, and refuses them for whole numbers', () => {
    expect((parse(['status', '--watch', '--interval', '0.5']) as Error).message).toBe('accepted');
    expect((parse(['ssh', 'a/0', '--timeout', '2.5']) as Error).message).toBe('accepted');
    expect((parse(['request', '--cores', '0.5']) as Error).message).toBe('accepted');
    for (const args of [
      ['request', 'x', '--lease', '30.5'],
      ['request', '--cores', '1', '--count', '1.5'],
      ['rehearse', '--port', '80.0'],
    ]) {
      expect((parse(args) as CommanderError).code, args.join(' ')).toBe('commander.invalidArgument');
    }
  });
});
