import type { Reporter, TestModule, Vitest } from 'vitest/node';

/**
 * A reporter printed after the default one, so drift is seen before it becomes a failure: the slowest
 * test files (the suite must finish in 6 minutes on a 2-core machine), and every test that took more than
 * a third of its timeout (each must have 3x headroom, or it fails on a busy machine). Tests that set no
 * timeout of their own count against the configured one. It only reports; a test's own timeout fails it.
 */
export default class DurationReport implements Reporter {
  private config: { testTimeout: number; maxWorkers: number } = { testTimeout: 5_000, maxWorkers: 1 };

  onInit(vitest: Vitest): void {
    this.config = { testTimeout: vitest.config.testTimeout, maxWorkers: vitest.config.maxWorkers };
  }

  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const report = formatDurationReport(modules, {
      defaultTimeoutMs: this.config.testTimeout,
      workers: this.config.maxWorkers,
    });
    process.stdout.write(`\n${report}\n`);
  }
}

export function formatDurationReport(
  modules: ReadonlyArray<TestModule>,
  options: { files?: number; defaultTimeoutMs?: number; workers?: number } = {},
): string {
  const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
  const files = [...modules]
    .map((m) => {
      // The file's own time: its environment, import and collection, then its tests and hooks.
      const d = m.diagnostic();
      const ms =
        d.environmentSetupDuration + d.prepareDuration + d.collectDuration + d.setupDuration + d.duration;
      return { name: m.relativeModuleId, ms };
    })
    .sort((a, b) => b.ms - a.ms);
  const total = files.reduce((sum, f) => sum + f.ms, 0);
  const lines = [
    `Slowest test files (of ${files.length}, ${seconds(total)} in all, ${options.workers ?? 1} at a time):`,
    ...files.slice(0, options.files ?? 8).map((f) => `  ${seconds(f.ms).padStart(8)}  ${f.name}`),
  ];
  const close: string[] = [];
  for (const module of modules) {
    for (const test of module.children.allTests()) {
      const { duration } = test.diagnostic() ?? { duration: 0 };
      const timeout = test.options.timeout ?? options.defaultTimeoutMs ?? 0;
      if (timeout > 0 && duration * 3 > timeout) {
        close.push(
          `  ${seconds(duration)} of ${seconds(timeout)}  ${module.relativeModuleId} > ${test.fullName}`,
        );
      }
    }
  }
  lines.push(
    close.length === 0
      ? 'Every test took less than a third of its timeout.'
      : `Tests that took more than a third of their timeout (${close.length}): raise the timeout or make them cheaper`,
    ...close,
  );
  return lines.join('\n');
}
