import { createHash } from 'node:crypto';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';

/** `<state-dir>/dev.json`: how any AWS SDK client (and the CLI) reaches a running embedded pool. */
export const EmbeddedInfo = z.object({
  region: z.string(),
  dynamodbEndpoint: z.string(),
  sqsEndpoint: z.string(),
  requestQueueUrl: z.string(),
  /** Lease renewals' queue (absent from an older pool's dev.json: renewals then go to the request queue). */
  leaseQueueUrl: z.string().optional(),
  requestDlqUrl: z.string(),
  fulfilQueueUrl: z.string(),
  tableName: z.string(),
  stateDir: z.string(),
  configPath: z.string().optional(),
  /** sha256 (hex) of the configuration file's text as the pool read it: the configuration it acts with. */
  configHash: z.string().optional(),
  /** Where the operator verbs are posted (operatorEndpoint.ts), and the bearer token they carry. */
  operatorUrl: z.string().optional(),
  operatorToken: z.string().optional(),
  /** Where GitHub's workflow_job webhooks are posted, when the configuration has a `github` section. */
  githubWebhookUrl: z.string().optional(),
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

/** Writes dev.json atomically (write, then rename): a CLI or test reading it never sees half a file. */
export async function writeEmbeddedInfo(info: EmbeddedInfo): Promise<void> {
  const path = embeddedInfoPath(info.stateDir);
  const tmp = `${path}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(info, null, 2)}\n`);
  await rename(tmp, path);
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

/** The hash recorded as `configHash`: sha256 of a configuration file's text. */
export function configHash(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}
