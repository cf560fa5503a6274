import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { supervise } from '../../shared/providers/local/supervisor.ts';

/**
 * What a backing process says on stderr reaches the pool's log (issue 41: a backing node bounding a
 * connection flood said so only to a pipe nobody read), at most 20 lines a minute, and its tail is kept
 * for a failure's reason.
 */
describe('the supervisor of a backing process', () => {
  it("relays the process's stderr lines to the log as warnings, at most 20 a minute", async () => {
    const warnings: Array<{ msg: string; extra?: object }> = [];
    const logger = {
      info: () => {},
      error: () => {},
      warn: (msg: string, extra?: object) => warnings.push({ msg, extra }),
    };
    const proc = spawn('/bin/sh', [
      '-c',
      'echo "backing node: closed 3 connection(s) that had not logged in" >&2; i=0; while [ $i -lt 30 ]; do echo "line $i" >&2; i=$((i+1)); done',
    ]);
    const closed = new Promise<void>((resolve) => {
      const run = supervise(proc, 'r-1', logger, { onLine: () => {}, onClosed: () => resolve() });
      void run.exited;
    });
    await closed;
    expect(warnings[0]).toEqual({
      msg: 'local provider: backing node says',
      extra: { resourceId: 'r-1', line: 'backing node: closed 3 connection(s) that had not logged in' },
    });
    expect(warnings).toHaveLength(20);
  });
});
