import { describe } from 'vitest';
import { chaosTest } from '../../testkit/chaosSuite.ts';

describe('chaos', () => {
  chaosTest({ nodeCap: true, pool: 'max-servers on both pools' });
});
