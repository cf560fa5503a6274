import { afterEach, describe, expect, it, vi } from 'vitest';
import { printRequest } from '../../cli/output.ts';
import type { PoolRequest } from '../../client/records.ts';

/**
 * Issue 41, defect 12: `metastatic release --request <id>` printed `request <id>: fulfilled` for the
 * request it had just released (its record stays `fulfilled`: that is how it was served). What a human
 * reads says it is released; `--json` prints the record as it is.
 */
const node = (state: string) =>
  ({
    id: `r/${state}`,
    label: 'small-node',
    state,
    host: '127.0.0.1',
    port: 22,
  }) as unknown as PoolRequest['nodes'][0];
const request = (states: string[]): PoolRequest =>
  ({ id: 'r', state: 'fulfilled', labels: ['small-node'], nodes: states.map(node) }) as PoolRequest;

describe('printRequest', () => {
  let out = '';
  afterEach(() => {
    vi.restoreAllMocks();
    out = '';
  });
  const printed = (r: PoolRequest) => {
    vi.spyOn(process.stdout, 'write').mockImplementation((s) => {
      out += String(s);
      return true;
    });
    printRequest(r);
    return out.split('\n')[0];
  };

  it('says released for a served request whose nodes are all released', () => {
    expect(printed(request(['released', 'released']))).toBe('request r: released');
  });

  it('says fulfilled while any node is still held, and as recorded otherwise', () => {
    expect(printed(request(['ready', 'released']))).toBe('request r: fulfilled');
  });
});
