import type { PoolRequest } from '../client/records.ts';
import type { NodeRecord } from '../shared/core/records.ts';
import { table } from './format.ts';
import { human, terminalJson, terminalText } from './terminal.ts';

/** What the commands print: text and JSON escaped for the terminal (nothing a record carries reaches it raw). */

/** The exit status of a Unix tool that SIGPIPE ended (128 + 13): what a shell reports for `yes | head -1`'s `yes`. */
export const CLOSED_PIPE_EXIT = 141;

/**
 * A reader that stops early (`metastatic list | head -1`, `metastatic validate … | true`) closes the pipe,
 * and the next write fails with EPIPE. Unix tools die of SIGPIPE there, quietly; Node ignores SIGPIPE and
 * would print a stack trace instead. Exit as they do, with nothing on stderr (which may be the same pipe)
 * — unless a command that owns something has said what to do instead (whenOutputCloses).
 */
export function exitQuietlyWhenOutputCloses(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on('error', (err: NodeJS.ErrnoException) => {
      if (outputClosed) return; // its writes after the first EPIPE fail too: nobody reads them
      if (err.code !== 'EPIPE') throw err;
      if (!onOutputClosed) process.exit(CLOSED_PIPE_EXIT);
      outputClosed = true;
      onOutputClosed();
    });
  }
}

let outputClosed = false;
let onOutputClosed: (() => void) | undefined;

/**
 * What a command that owns processes or resources does when its output closes, instead of exiting at
 * once: `metastatic dev` stops the pool as on SIGTERM (`npm start | tee log` and Ctrl-C end tee with it;
 * exiting at the first line of its shutdown left backing processes running and dev.json behind). Its
 * later writes are dropped.
 */
export function whenOutputCloses(handler: () => void): void {
  onOutputClosed = handler;
}

export const print = (text: string): void => {
  process.stdout.write(`${terminalText(text)}\n`);
};

export const printJson = (value: unknown): void => {
  process.stdout.write(`${terminalJson(JSON.stringify(value, null, 2))}\n`);
};

export const printError = (text: string): void => {
  process.stderr.write(terminalText(`${text}\n`));
};

export function isLive(n: NodeRecord): boolean {
  return n.state !== 'released' && n.state !== 'failed';
}

/** `1/2 ready` */
export function nodeSummary(r: { readonly nodes: readonly { readonly state: string }[] }): string {
  const ready = r.nodes.filter((n) => n.state === 'ready').length;
  return `${ready}/${r.nodes.length} ready`;
}

/**
 * A request's state as a human reads it: a served request stays `fulfilled` in its record once its nodes
 * are released (`release --request`), which reads as if they were still held; it shows as `released`.
 */
export function requestState(r: PoolRequest): string {
  const released = r.nodes.length > 0 && r.nodes.every((n) => n.state === 'released');
  return r.state === 'fulfilled' && released ? 'released' : r.state;
}

export function printRequest(r: PoolRequest): void {
  print(human`request ${r.id}: ${requestState(r)}${r.reason ? ` (${r.reason})` : ''}`);
  if (r.nodes.length > 0 && r.state !== 'failed') {
    print(
      table(
        ['NODE', 'LABEL', 'STATE', 'HOST:PORT', 'BACKING', 'SLOT'],
        r.nodes.map((n) => [
          n.id,
          n.label,
          n.state,
          n.host ? `${n.host}:${n.port}` : '-',
          n.backingNodeId,
          n.slot,
        ]),
      ),
    );
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
