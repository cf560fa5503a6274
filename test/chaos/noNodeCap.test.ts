import { describe } from 'vitest';
import { chaosTest } from '../../testkit/chaosSuite.ts';

describe('chaos', () => {
  // Without a metastatic max-servers (a user's default), duplicate deliveries of a request never meet at
  // a capacity place, only at claims and backing records: a different set of races.
  chaosTest({ nodeCap: false, pool: 'no metastatic max-servers' });
});
