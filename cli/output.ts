import type { PoolRequest } from '../client/records.ts';
import type { NodeRecord } from '../shared/core/records.ts';
import { table } from './format.ts';
import { terminalJson, terminalText } from './terminal.ts';

/** What the commands print: text and JSON escaped for the terminal (nothing a record carries reaches it raw). */

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

export function printRequest(r: PoolRequest): void {
  print(`request ${r.id}: ${r.state}${r.reason ? ` (${r.reason})` : ''}`);
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
