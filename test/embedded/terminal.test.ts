import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { table } from '../../cli/format.ts';
import { terminalJson, terminalText } from '../../cli/terminal.ts';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { silentLog } from '../../shared/core/log.ts';
import { EmbeddedPool } from '../../shared/runtime/embeddedPool.ts';
import { smallOnLarge } from '../../testkit/configs.ts';

const ESC = '\u001b';
const hostile = [
  `${ESC}[2J${ESC}[H`, // clear the screen, cursor home
  `${ESC}]0;pwned\u0007`, // set the window title (OSC ... BEL)
  'ok\rFAKE', // carriage return overwrites the line
  'abc\u202edcba', // right-to-left override: hides what follows
  '\u009b31m', // the 8-bit CSI
  '\u007f',
];
/** Whether a terminal would act on something in the text (tab and newline are layout, not commands). */
const active = (text: string) =>
  // biome-ignore lint/suspicious/noControlCharactersInRegex: looking for control characters is the test
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/.test(text);

describe('terminal output', () => {
  it('escapes every control and direction character, visibly, and leaves text and layout alone', () => {
    for (const h of hostile) {
      expect(active(h)).toBe(true);
      expect(active(terminalText(h))).toBe(false);
    }
    expect(terminalText(`${ESC}[2J`)).toBe('\\x1b[2J');
    expect(terminalText('a\u202eb')).toBe('a\\u202eb');
    expect(terminalText('tab\there\nnext line, ünïcødé, 日本')).toBe('tab\there\nnext line, ünïcødé, 日本');
    // Idempotent: escaping twice changes nothing more.
    expect(terminalText(terminalText(hostile.join('')))).toBe(terminalText(hostile.join('')));
  });

  it('keeps JSON the same value while making it inert', () => {
    const value = { labels: hostile, reason: `x${ESC}y` };
    const json = terminalJson(JSON.stringify(value));
    expect(active(json)).toBe(false);
    expect(JSON.parse(json)).toEqual(value);
  });

  it('pads table columns by what the terminal shows', () => {
    const out = table(
      ['ID', 'REASON'],
      [
        [`a${ESC}[2J`, 'x'],
        ['bb', 'y'],
      ],
    );
    expect(active(out)).toBe(false);
    const [head, first, second] = out.split('\n');
    expect(first?.indexOf('FIRST')).toBe(second?.indexOf('SECOND'));
    expect(head).toMatch(/^ID +REASON$/);
  });
});

/** `metastatic list requests` against a running pool, on a request whose labels carry escape sequences. */
describe('the CLI on hostile labels', () => {
  let stack: EmbeddedPool;
  let stateDir: string;
  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-terminal-'));
    stack = await EmbeddedPool.start({
      config: parseConfigOrThrow(smallOnLarge(), 'terminal.yaml'),
      stateDir,
      reaperInterval: 3600,
      log: silentLog,
    });
    await stack.sqs.send(
      new SendMessageCommand({
        QueueUrl: stack.info.requestQueueUrl,
        MessageBody: JSON.stringify({ kind: 'request', id: 'hostile-1', labels: hostile }),
      }),
    );
    const deadline = Date.now() + 30_000;
    while ((await stack.context.store.getRequest('hostile-1'))?.state !== 'failed') {
      if (Date.now() > deadline) throw new Error('request not recorded failed in 30 s');
      await new Promise((r) => setTimeout(r, 100));
    }
  });
  afterAll(async () => {
    await stack?.stop();
    await rm(stateDir, { recursive: true, force: true });
  });

  const run = (args: string[]) =>
    new Promise<{ stdout: string; stderr: string }>((done, fail) => {
      execFile(
        process.execPath,
        [resolve(import.meta.dirname, '..', '..', 'bin', 'metastatic.mjs'), '--state-dir', stateDir, ...args],
        { timeout: 60_000 },
        (err, stdout, stderr) => (err ? fail(err) : done({ stdout, stderr })),
      );
    });

  it('prints them escaped in tables and as the same values in --json', async () => {
    const human = await run(['list', 'requests', '--all']);
    expect(human.stdout).toContain('hostile-1');
    expect(human.stdout).toContain('\\x1b[2J');
    expect(active(human.stdout + human.stderr)).toBe(false);
    const json = await run(['list', 'requests', '--all', '--json']);
    expect(active(json.stdout)).toBe(false);
    const parsed = JSON.parse(json.stdout) as Array<{ id: string; labels: string[] }>;
    expect(parsed.find((r) => r.id === 'hostile-1')?.labels).toEqual(hostile);
  }, 120_000);
});
