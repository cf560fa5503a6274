import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { RUN_EXIT } from '../../cli/commands/run.ts';
import { buildProgram } from '../../cli/program.ts';
import { splitCommand } from '../../cli/programJobs.ts';
import { nonUtf8Argument } from '../../cli/rawArgv.ts';
import { watchInterval } from '../../client/leaseKeeper.ts';
import { remoteCommandLine, shellQuote } from '../../client/openssh.ts';

/**
 * What `metastatic run` sends and how it reads its command line, without a pool: the remote command line
 * read back by real shells (as sshd runs it: `<login shell> -c <line>`) gives exactly the argv it was
 * made from, and a command killed by a signal ends the shell with 128+n.
 */
const NASTY = [
  'a b',
  "it's",
  '"q"',
  '$HOME',
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a parameter expansion no shell may expand
  '${x:-y}',
  'x;y',
  'l1\nl2',
  '',
  '*',
  '`id`',
  '\\',
  "'",
  '-n',
  '$(echo no)',
];
const shells = ['sh', 'bash', 'dash'].filter((s) => spawnSync(s, ['-c', 'true']).status === 0);

describe('the remote command line', () => {
  for (const shell of shells) {
    it(`reads back as exactly the argv under ${shell}, with the environment exported`, () => {
      const line = remoteCommandLine(['printf', '[%s]\\n', ...NASTY], { METASTATIC_NODES: "a 1\nb 'x'" });
      const out = spawnSync(shell, ['-c', line], { encoding: 'utf8' });
      expect(out.status).toBe(0);
      expect(out.stdout).toBe(NASTY.map((a) => `[${a}]\n`).join(''));
      const env = spawnSync(
        shell,
        [
          '-c',
          remoteCommandLine(['sh', '-c', 'printf %s "$METASTATIC_NODES"'], {
            METASTATIC_NODES: "a 1\nb 'x'",
          }),
        ],
        { encoding: 'utf8' },
      );
      expect(env.stdout).toBe("a 1\nb 'x'");
    });

    it(`ends ${shell} with 128+n when signal n killed the command, and with the command's status`, () => {
      expect(spawnSync(shell, ['-c', remoteCommandLine(['sh', '-c', 'kill -TERM $$'])]).status).toBe(143);
      expect(spawnSync(shell, ['-c', remoteCommandLine(['sh', '-c', 'exit 7'])]).status).toBe(7);
    });
  }

  it('quotes a word so no shell reads anything in it', () => {
    expect(shellQuote("it's")).toBe(`'it'\\''s'`);
    expect(() => remoteCommandLine([])).toThrow('no command');
    expect(() => remoteCommandLine(['true'], { 'A;B': 'x' })).toThrow('not an environment variable name');
  });
});

describe('metastatic run: its command line', () => {
  it('splits labels from the command at the -- that ended the options', () => {
    const argv = (rest: string[]) => ['node', 'metastatic', '--state-dir', 'd', 'run', ...rest];
    expect(
      splitCommand(['small-node', 'sh', '-c', 'x'], argv(['small-node', '--', 'sh', '-c', 'x'])),
    ).toEqual({
      labels: ['small-node'],
      command: ['sh', '-c', 'x'],
    });
    // A later -- belongs to the command; one given as an option's value is not the separator.
    expect(splitCommand(['a', 'git', 'log', '--', 'f'], argv(['a', '--', 'git', 'log', '--', 'f']))).toEqual({
      labels: ['a'],
      command: ['git', 'log', '--', 'f'],
    });
    expect(splitCommand(['a', 'true'], argv(['--requestor', '--', 'a', '--', 'true']))).toEqual({
      labels: ['a'],
      command: ['true'],
    });
    expect(splitCommand(['a', 'b'], argv(['a', 'b']))).toEqual({ labels: ['a', 'b'], command: [] });
  });

  it('has exit codes of its own, distinct, and its --help explains them', () => {
    const codes = Object.values(RUN_EXIT);
    expect(new Set(codes).size).toBe(codes.length);
    const run = buildProgram().commands.find((c) => c.name() === 'run');
    let help = '';
    run?.configureOutput({ writeOut: (s) => (help += s) });
    run?.outputHelp();
    for (const code of codes) expect(help).toMatch(new RegExp(`^  ${code} `, 'm'));
    expect(help).toContain('128+n');
  });
});

describe('run: how often it reads its request while the job runs', () => {
  it('every second on an embedded pool, only at each renewal on a stack (each read is a DynamoDB call)', () => {
    expect(watchInterval('embedded', 20_000)).toBe(1000);
    expect(watchInterval('embedded', 500)).toBe(500);
    expect(watchInterval('stack', 20_000)).toBe(20_000);
  });
});

describe('run: arguments that are not UTF-8 (issue 41, defect 5)', () => {
  const cmdline = (...args: (string | Buffer)[]) =>
    Buffer.concat(args.flatMap((a) => [Buffer.from(a), Buffer.from([0])]));
  const node = ['node', '/x/bin/metastatic.mjs', 'run', 'small-node', '--'];

  it('names the argument whose raw bytes are not UTF-8, and passes a real U+FFFD', () => {
    const raw = cmdline(...node, 'printf', '%s', Buffer.from([0x61, 0xff, 0x62]));
    const why = nonUtf8Argument(['printf', '%s', 'a\uFFFDb'], raw);
    expect(why).toContain('argument 3 of the command ("a\\xffb") is not valid UTF-8');
    expect(why).toContain('stdin');
    // U+FFFD given as such (EF BF BD) is a character like any other.
    expect(nonUtf8Argument(['printf', '%s', 'a\uFFFDb'], cmdline(...node, 'printf', '%s', 'a\uFFFDb'))).toBe(
      undefined,
    );
    // Empty arguments keep their places; a cmdline that does not end as the command does says nothing.
    expect(nonUtf8Argument(['', '\uFFFD'], cmdline(...node, '', Buffer.from([0xc3])))).toContain(
      'argument 2',
    );
    expect(nonUtf8Argument(['other', '\uFFFD'], cmdline(...node, 'x', Buffer.from([0xc3])))).toBe(undefined);
    expect(nonUtf8Argument(['true'], undefined)).toBe(undefined);
  });

  it('refuses such an argument on the command line with exit 2, before looking for a pool', () => {
    const bin = new URL('../../bin/metastatic.mjs', import.meta.url).pathname;
    const dir = join(tmpdir(), `metastatic-none-${process.pid}`);
    // The shell passes the byte 0xff as it is; Node's own spawn could only pass UTF-8.
    const line = (arg: string) => `exec "$0" "$1" --state-dir "$2" run small-node -- printf %s ${arg}`;
    const bad = spawnSync('sh', ['-c', line(`"$(printf 'a\\377b')"`), process.execPath, bin, dir], {
      encoding: 'utf8',
    });
    expect(bad.status, bad.stderr).toBe(2);
    expect(bad.stderr).toContain('argument 3 of the command ("a\\xffb") is not valid UTF-8');
    const replacement = spawnSync('sh', ['-c', line('"a\uFFFDb"'), process.execPath, bin, dir], {
      encoding: 'utf8',
    });
    expect(replacement.status, replacement.stderr).toBe(RUN_EXIT.ownFailure); // no pool there, but not refused
    expect(replacement.stderr).not.toContain('UTF-8');
  });

  it('refuses one given to metastatic ssh alike, with exit 2, before looking for a pool', () => {
    const bin = new URL('../../bin/metastatic.mjs', import.meta.url).pathname;
    const dir = join(tmpdir(), `metastatic-none-${process.pid}`);
    const line = `exec "$0" "$1" --state-dir "$2" ssh some-node -- printf %s "$(printf 'a\\377b')"`;
    const bad = spawnSync('sh', ['-c', line, process.execPath, bin, dir], { encoding: 'utf8' });
    expect(bad.status, bad.stderr).toBe(2);
    expect(bad.stderr).toContain('argument 3 of the command ("a\\xffb") is not valid UTF-8: metastatic ssh');
  });
});
