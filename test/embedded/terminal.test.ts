import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { SendMessageCommand } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { consoleLog } from '../../cli/consoleLog.ts';
import { table } from '../../cli/format.ts';
import { human, terminalJson, terminalText, terminalValue } from '../../cli/terminal.ts';
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
  'zero\u200bwidth\ufeffand\u2060joined', // invisible: two strings that look alike but differ
];
/** A label that would print a forged row under `list requests --all`, were its newline printed raw. */
const FORGED_ROW = 'x\nreq-admin  fulfilled  small-node';
/** Whether a terminal would act on something in the text (tab and newline are layout, not commands). */
const active = (text: string) =>
  // biome-ignore lint/suspicious/noControlCharactersInRegex: looking for control characters is the test
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u2028\u2029]|\p{Cf}/u.test(text);

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

  it('escapes tabs and newlines too in a value quoted in a line: a label cannot print a forged row', () => {
    expect(terminalValue(FORGED_ROW)).toBe('x\\x0areq-admin  fulfilled  small-node');
    expect(terminalValue('a\tb\u200bc')).toBe('a\\x09b\\u200bc');
    expect(terminalText('a\u200bb\ufeffc\u2060d\u{e0041}')).toBe('a\\u200bb\\ufeffc\\u2060d\\u{e0041}');
    const reason = 'changed\nmy mind';
    expect(human`request ${'r-1'}: failed (${reason})`).toBe('request r-1: failed (changed\\x0amy mind)');
    expect(table(['ID', 'LABELS'], [['r-1', FORGED_ROW]]).split('\n')).toHaveLength(2);
  });

  it('writes each log line of metastatic dev as one line, whatever its fields hold', () => {
    const written: string[] = [];
    const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk) => {
      written.push(String(chunk));
      return true;
    });
    try {
      consoleLog('info').info('request cancelled', {
        requestId: 'r-1',
        reason: `a\n12:00:00.000 INFO  forged${ESC}[2J`,
      });
    } finally {
      spy.mockRestore();
    }
    expect(written).toHaveLength(1);
    expect(written[0]?.split('\n')).toEqual([
      expect.stringContaining('reason=a\\x0a12:00:00.000 INFO  forged\\x1b[2J'),
      '',
    ]);
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
    for (const message of [
      { kind: 'request', id: 'hostile-1', labels: hostile },
      { kind: 'request', id: 'hostile-2', labels: [FORGED_ROW] },
      { kind: 'cancel', id: 'hostile-3', reason: 'changed\nreq-admin  fulfilled  my mind' },
    ]) {
      await stack.sqs.send(
        new SendMessageCommand({
          QueueUrl: stack.info.requestQueueUrl,
          MessageBody: JSON.stringify(message),
        }),
      );
    }
    const deadline = Date.now() + 30_000;
    for (const id of ['hostile-1', 'hostile-2', 'hostile-3']) {
      while ((await stack.context.store.getRequest(id))?.state !== 'failed') {
        if (Date.now() > deadline) throw new Error(`request ${id} not recorded failed in 30 s`);
        await new Promise((r) => setTimeout(r, 100));
      }
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
    // One line per request, the header first: a newline in a label or a reason forged none.
    expect(
      human.stdout
        .trimEnd()
        .split('\n')
        .map((line) => line.split(/\s+/)[0]),
    ).toEqual(['ID', 'hostile-1', 'hostile-2', 'hostile-3']);
    const json = await run(['list', 'requests', '--all', '--json']);
    expect(active(json.stdout)).toBe(false);
    const parsed = JSON.parse(json.stdout) as Array<{ id: string; labels: string[] }>;
    expect(parsed.find((r) => r.id === 'hostile-1')?.labels).toEqual(hostile);
    // The events file is inert to `tail -f` too, and still the same values.
    const events = await readFile(join(stateDir, 'events.jsonl'), 'utf8');
    expect(events).toContain('hostile-2');
    expect(active(events)).toBe(false);
    const failed = events
      .trim()
      .split('\n')
      .map((line) => JSON.parse(line) as { detail: { requestId?: string; reason?: string } })
      .find((e) => e.detail.requestId === 'hostile-1');
    expect(failed?.detail.reason).toContain('\u202e');
  }, 120_000);
});
