import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';

/** `<state-dir>/dev.json`: how any AWS SDK client (and the CLI) reaches a running embedded pool. */
export const EmbeddedInfo = z.object({
  region: z.string(),
  dynamodbEndpoint: z.string(),
  sqsEndpoint: z.string(),
  requestQueueUrl: z.string(),
  requestDlqUrl: z.string(),
  fulfilQueueUrl: z.string(),
  tableName: z.string(),
  stateDir: z.string(),
  configPath: z.string().optional(),
  pid: z.number(),
  startedAt: z.string(),
});
export type EmbeddedInfo = z.infer<typeof EmbeddedInfo>;

export const DEFAULT_STATE_DIR = '.metastatic';

export function stateDirFrom(option: string | undefined): string {
  return option ?? process.env.METASTATIC_STATE_DIR ?? DEFAULT_STATE_DIR;
}

export function embeddedInfoPath(stateDir: string): string {
  return join(stateDir, 'dev.json');
}

export async function readEmbeddedInfo(stateDir: string): Promise<EmbeddedInfo | undefined> {
  let text: string;
  try {
    text = await readFile(embeddedInfoPath(stateDir), 'utf8');
  } catch {
    return undefined;
  }
  return EmbeddedInfo.parse(JSON.parse(text));
}
