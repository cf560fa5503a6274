import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { SLOT_PROGRAM } from '../../shared/providers/slot/slotProgram.ts';

/**
 * The slot program (issue 42) is POSIX sh that runs as root on every backing node that contains its
 * slots: it parses, is ShellCheck-clean as POSIX sh, and refuses arguments it was not made for before
 * it touches anything. Its work (cgroups, namespaces) is shown by test/embedded/slotIsolation.test.ts.
 */
describe('the slot program', () => {
  const run = (args: readonly string[]) =>
    spawnSync('/bin/sh', ['-s', '--', ...args], { input: SLOT_PROGRAM, encoding: 'utf8' });

  it('parses as POSIX sh', () => {
    expect(spawnSync('/bin/sh', ['-n'], { input: SLOT_PROGRAM }).status).toBe(0);
  });

  it('is shellcheck-clean as POSIX sh (CI requires shellcheck; elsewhere skipped without it)', ({ skip }) => {
    const found = spawnSync('shellcheck', ['--version']);
    if (found.error) {
      if (process.env.METASTATIC_REQUIRE_SHELLCHECK)
        throw new Error('shellcheck is required here and missing');
      return skip('no shellcheck here (Debian: apt-get install shellcheck)');
    }
    const r = spawnSync('shellcheck', ['-s', 'sh', '-'], { input: SLOT_PROGRAM, encoding: 'utf8' });
    expect(r.stdout + r.stderr).toBe('');
    expect(r.status).toBe(0);
  });

  it.each([
    [['setup', '../escape', '0', '0', '0']],
    [['setup', 'g', '1e3', '0', '0']],
    [['setup', 'g', '0', '0']],
    [['run', 'g', 'x', '0', '/d', '/t', 'slot0', '--', 'true']],
    [['run', 'g', '1', '1', '/d', '/t', 'slot 0', '--', 'true']],
    [['kill', '.hidden']],
    [['remove']],
    [['probe', 'g', '0', '0']],
    [['unknown']],
  ])('refuses %j with exit 125 and its usage, before touching anything', (args) => {
    const r = run(args);
    expect(r.status).toBe(125);
    expect(r.stderr).toMatch(/^metastatic-slot: usage: /);
  });
});
