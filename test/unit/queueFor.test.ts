import { describe, expect, it } from 'vitest';
import { queueFor } from '../../client/connection.ts';

describe('the queue a client sends a message to', () => {
  const pool = { requestQueueUrl: 'https://q/requests', leaseQueueUrl: 'https://q/leases' };

  it('is the lease queue for a renewal, the request queue for anything else (issue 40, defect 1)', () => {
    expect(queueFor({ kind: 'renew' }, pool)).toBe('https://q/leases');
    for (const kind of ['request', 'release', 'cancel'])
      expect(queueFor({ kind }, pool)).toBe('https://q/requests');
  });

  it('is the request queue for a renewal to a pool deployed before it had a lease queue', () => {
    expect(queueFor({ kind: 'renew' }, { requestQueueUrl: 'https://q/requests' })).toBe('https://q/requests');
  });
});
