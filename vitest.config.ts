import { defineConfig } from 'vitest/config';
import SlowestFirst from './testkit/slowestFirst.ts';

/**
 * Files that change a module for the whole process run each in a fresh worker: cdkTiming replaces one
 * (vi.mock), and lambda.test and githubEntry.test load the functions' entry points, whose clients and configuration are
 * made once from the environment it sets. Every other file shares its worker's loaded modules with the
 * files before it, which saves loading the AWS SDK, aws-cdk-lib and the handlers again for each of some
 * seventy files (a minute of a 2-core machine's time). Those files start and stop what they use
 * (engines, processes, servers) in their own hooks, and one that stubs an SDK client
 * (aws-sdk-client-mock) restores it when it ends, failed or not: 12 CPU-s less than a worker each,
 * measured on the three that do.
 */
const ISOLATED = ['test/aws/cdkTiming.test.ts', 'test/aws/lambda.test.ts', 'test/aws/githubEntry.test.ts'];

export default defineConfig({
  test: {
    exclude: ['node_modules/**'],
    testTimeout: 60_000,
    // Hooks start engines, pools and processes, and some synthesize stacks: tens of seconds on a busy 2-core
    // machine. A hook that needs longer says so itself.
    hookTimeout: 120_000,
    // Integration tests start their own dynalite/fauxqs on port 0, so files can run in parallel;
    // two workers match the two cores CI has. (Three were measured on a fresh clone of the 2-core
    // machine, the same commit: 373 s against 378 s, for 743 CPU-s against 717: more contention for
    // every test, for nothing worth it.)
    maxWorkers: 2,
    // The longest files start first (testkit/slowestFirst.ts), so that none of them is the run's tail.
    sequence: { sequencer: SlowestFirst },
    allowOnly: false,
    // What a passing test prints (a chaos summary, CDK's "Bundling asset") is noise in CI's output; a
    // failing test's output is kept.
    silent: 'passed-only',
    // After the usual report: the slowest files and the tests close to their timeouts (drift, seen early).
    reporters: ['default', './testkit/durationReport.ts'],
    env: {
      // Node 20 is supported for local use; the SDK's notice that it will need 22 is noise in test output.
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
      // aws-cdk-lib validates every synthesized app against CloudFormation's rules (a WASM cfn-lint), about
      // 7 CPU-seconds an app; the suite synthesizes dozens, to assert on resources, not on that. It is
      // asserted where it is the point: test/aws/cdk.test.ts validates the stack's variants in one app, and
      // the package test's user app is synthesized as a user's is, with validation, and its report read.
      CDK_VALIDATION: 'false',
    },
    projects: [
      {
        extends: true,
        test: { name: 'shared', include: ['test/**/*.test.ts'], exclude: ISOLATED, isolate: false },
      },
      { extends: true, test: { name: 'isolated', include: ISOLATED } },
    ],
  },
});
