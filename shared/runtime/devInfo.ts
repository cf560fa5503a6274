import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';

/** `<state-dir>/dev.json`: how any AWS SDK client (and the CLI) reaches a running embedded stack. */
export const DevInfo = z.object({
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
export type DevInfo = z.infer<typeof DevInfo>;

export const DEFAULT_STATE_DIR = '.metastatic';

export function stateDirFrom(option: string | undefined): string {
  return option ?? process.env.METASTATIC_STATE_DIR ?? DEFAULT_STATE_DIR;
}

export function devInfoPath(stateDir: string): string {
  return join(stateDir, 'dev.json');
}

export async function readDevInfo(stateDir: string): Promise<DevInfo | undefined> {
  let text: string;
  try {
    text = await readFile(devInfoPath(stateDir), 'utf8');
  } catch {
    return undefined;
  }
  return DevInfo.parse(JSON.parse(text));
}
