import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: ['node_modules/**'],
    testTimeout: 60_000,
    hookTimeout: 30_000,
    // Integration tests start their own dynalite/fauxqs on port 0, so files can run in parallel;
    // two workers match the two cores CI has.
    maxWorkers: 2,
    allowOnly: false,
    // What a passing test prints (a chaos summary, CDK's "Bundling asset") is noise in CI's output; a
    // failing test's output is kept.
    silent: 'passed-only',
    // After the usual report: the slowest files and the tests close to their timeouts (drift, seen early).
    reporters: ['default', './testkit/durationReport.ts'],
    // Node 20 is supported for local use; the SDK's notice that it will need 22 is noise in test output.
    env: { AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true' },
  },
});
