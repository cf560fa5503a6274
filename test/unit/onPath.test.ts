import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { onPath } from '../../testkit/onPath.ts';

describe('onPath (how tests find moto_server and ansible-playbook)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'metastatic-onpath-'));
  const [a, b] = [join(dir, 'a'), join(dir, 'b')];
  mkdirSync(a);
  mkdirSync(b);
  mkdirSync(join(a, 'tool')); // a directory of that name is not the program
  writeFileSync(join(a, 'plain'), '#!/bin/sh\n'); // nor is a file that cannot be executed
  chmodSync(join(a, 'plain'), 0o644);
  for (const name of ['tool', 'plain']) {
    writeFileSync(join(b, name), '#!/bin/sh\n');
    chmodSync(join(b, name), 0o755);
  }
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('finds the first executable file of that name on the path, skipping directories and plain files', () => {
    const path = ['', a, b].join(delimiter);
    expect(onPath('tool', path)).toBe(join(b, 'tool'));
    expect(onPath('plain', path)).toBe(join(b, 'plain'));
    expect(onPath('absent', path)).toBeUndefined();
    expect(onPath('tool', a)).toBeUndefined();
  });
});
