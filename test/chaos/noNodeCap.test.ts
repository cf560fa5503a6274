import { describe } from 'vitest';
import { chaosTest } from '../../testkit/chaosSuite.ts';

describe('chaos', () => {
  // Without a metastatic max-servers (a user's default), duplicate deliveries of a request never meet at
  // a capacity place, only at claims and backing records: a different set of races. Its label holds
  // ready nodes by forecast (min-ready auto, issue 27): the decisions and their upkeep under the same
  // faults, and never more untaken ready nodes than max-ready.
  chaosTest({ nodeCap: false, readyAuto: true, pool: 'no metastatic max-servers, min-ready auto' });
});
