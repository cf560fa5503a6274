import { describe, expect, it } from 'vitest';
import type { TestModule } from 'vitest/node';
import { formatDurationReport } from '../../testkit/durationReport.ts';

/** A test module as the reporter reads it: its id, its diagnostic, and its tests with theirs. */
function module(name: string, ms: number, tests: Array<{ name: string; ms: number; timeout?: number }>) {
  return {
    relativeModuleId: name,
    diagnostic: () => ({
      environmentSetupDuration: 0,
      prepareDuration: 100,
      collectDuration: 400,
      setupDuration: 0,
      duration: ms - 500,
    }),
    children: {
      allTests: () =>
        tests.map((t) => ({
          fullName: t.name,
          options: { timeout: t.timeout },
          diagnostic: () => ({ duration: t.ms }),
        })),
    },
  } as unknown as TestModule;
}

describe('the duration report', () => {
  it('lists the slowest files first and every test past a third of its timeout', () => {
    const report = formatDurationReport(
      [
        module('test/a.test.ts', 2_000, [{ name: 'quick', ms: 100 }]),
        module('test/b.test.ts', 90_000, [
          { name: 'slow with its own timeout', ms: 80_000, timeout: 200_000 },
          { name: 'close to the default', ms: 25_000 },
        ]),
      ],
      { defaultTimeoutMs: 60_000, workers: 2 },
    );
    expect(report.split('\n')).toEqual([
      'Slowest test files (of 2, 92.0 s in all, 2 at a time):',
      '    90.0 s  test/b.test.ts',
      '     2.0 s  test/a.test.ts',
      'Tests that took more than a third of their timeout (2): raise the timeout or make them cheaper',
      '  80.0 s of 200.0 s  test/b.test.ts > slow with its own timeout',
      '  25.0 s of 60.0 s  test/b.test.ts > close to the default',
    ]);
  });

  it('says so when every test has its headroom', () => {
    const report = formatDurationReport([module('test/a.test.ts', 1_000, [{ name: 'quick', ms: 10 }])], {
      defaultTimeoutMs: 60_000,
    });
    expect(report).toContain('Every test took less than a third of its timeout.');
  });
});
