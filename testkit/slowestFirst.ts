import { relative } from 'node:path';
import { BaseSequencer, type TestSpecification } from 'vitest/node';

/**
 * The suite's longest files, longest first, as the duration report at the end of `npm test` prints them
 * (a fresh clone of a 2-core machine of this kind). They start first: on two workers, a two-minute file
 * that starts last is a two-minute tail. Vitest orders by the durations it cached on an earlier run, but
 * a fresh clone (CI) has no cache and would start them in the order it found the files. A file missing
 * from this list, or one that moved, costs only that ordering.
 */
export const SLOWEST_FILES = [
  'test/package/package.test.ts',
  'test/aws/deploy.moto.test.ts',
  'test/chaos/maxServers.test.ts',
  'test/embedded/e2e.test.ts',
  'test/embedded/ansible.test.ts',
  'test/aws/ec2Provider.moto.test.ts',
  'test/embedded/nodeAccess.test.ts',
  'test/embedded/run.test.ts',
  'test/chaos/noNodeCap.test.ts',
  'test/aws/cdk.test.ts',
  'test/embedded/ciRecipes.test.ts',
] as const;

/** Vitest's own order (failed first, then by cached duration), the files above first. */
export default class SlowestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files);
    const root = this.ctx.config.root;
    const rank = (spec: TestSpecification) => {
      const at = (SLOWEST_FILES as readonly string[]).indexOf(relative(root, spec.moduleId));
      return at < 0 ? SLOWEST_FILES.length : at;
    };
    return sorted.sort((a, b) => rank(a) - rank(b)); // stable: the rest keep vitest's order
  }
}
