import { ConditionalCheckFailedException, type DynamoDBClient } from '@aws-sdk/client-dynamodb';
import {
  DeleteCommand,
  DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  UpdateCommand,
} from '@aws-sdk/lib-dynamodb';
import { z } from 'zod';
import { TTL_ATTRIBUTE } from './table.ts';
import {
  claimRunnerUpdate,
  claimScanUpdate,
  conditions,
  dropClaimUpdate,
  runnerEndedUpdate,
  runnerStartedUpdate,
} from './writes.ts';

/**
 * What the github function keeps in the pool's table (docs/table.md) about GitHub jobs on AWS, where no
 * process remembers anything between two events:
 *
 *   pk                            sk        item
 *   GITHUB#DELIVERY#<guid>        DELIVERY  a webhook delivery acted on (X-GitHub-Delivery): a replay is dropped
 *   GITHUB#JOB#<job id>           JOB       a job: where it runs (repository, installation, route), whether
 *                                           GitHub said it completed, its runner once started
 *   GITHUB#COMMAND#<command id>   COMMAND   the SSM command running a job's runner: its end releases the job's node
 *   GITHUB#SCAN                   SCAN      when GitHub's queued jobs were last scanned (one scan at a time)
 *
 * One partition each (a delivery, a job, a command), so a burst of webhooks spreads over the table. Every
 * item carries the table's TTL: a day for a delivery (GitHub redelivers within hours), a week for the rest.
 */

const DAY_S = 24 * 3600;
const WEEK_S = 7 * DAY_S;

export const GithubJob = z.object({
  jobId: z.number().int().positive(),
  repository: z.string(),
  installationId: z.number().int().positive().optional(),
  /** The route's runs-on: the runner's labels. */
  runsOn: z.array(z.string()),
  label: z.string(),
  /** The route's lease, seconds: the request's once its runner took the job (in_progress). */
  lease: z.number().int().positive(),
  /** `completed` once GitHub said so: a `queued` arriving later (out of order) makes no request. */
  state: z.enum(['queued', 'completed']),
  /** The runner started for it: its name, the instance and the SSM command running it. */
  runner: z
    .object({
      /** The handling that claimed the start, and when: only it goes on with it (claimRunner). */
      by: z.string(),
      at: z.number().optional(),
      name: z.string().optional(),
      instanceId: z.string().optional(),
      commandId: z.string().optional(),
      /** When its command's end was reported: a later release of its node stops nothing. */
      endedAt: z.number().optional(),
    })
    .optional(),
});
export type GithubJob = z.infer<typeof GithubJob>;

export type QueuedOutcome = 'new' | 'again' | 'completed';
export type RunnerClaimRefusal = 'started' | 'busy' | 'completed' | 'unknown';

const key = {
  delivery: (guid: string) => ({ pk: `GITHUB#DELIVERY#${guid}`, sk: 'DELIVERY' }),
  job: (jobId: number) => ({ pk: `GITHUB#JOB#${jobId}`, sk: 'JOB' }),
  command: (commandId: string) => ({ pk: `GITHUB#COMMAND#${commandId}`, sk: 'COMMAND' }),
  scan: { pk: 'GITHUB#SCAN', sk: 'SCAN' },
};

export class GithubItems {
  private readonly doc: DynamoDBDocumentClient;

  constructor(
    client: DynamoDBClient,
    private readonly table: string,
    private readonly now: () => number = Date.now,
  ) {
    this.doc = DynamoDBDocumentClient.from(client, { marshallOptions: { removeUndefinedValues: true } });
  }

  private expires(seconds: number): number {
    return Math.ceil(this.now() / 1000) + seconds;
  }

  /** True the first time a delivery id is seen (then recorded), false for a replay. */
  async firstDelivery(guid: string): Promise<boolean> {
    return this.putIfAbsent({ ...key.delivery(guid), at: this.now(), [TTL_ATTRIBUTE]: this.expires(DAY_S) });
  }

  /** Forgets a delivery that was not acted on, so that its redelivery is. */
  async forgetDelivery(guid: string): Promise<void> {
    await this.doc.send(new DeleteCommand({ TableName: this.table, Key: key.delivery(guid) }));
  }

  /**
   * A `queued` job: recorded when new; `again` when it was (a second delivery: its request message is sent
   * again, which the request's id makes harmless); `completed` when GitHub said it completed first.
   */
  async jobQueued(job: Omit<GithubJob, 'state' | 'runner'>): Promise<QueuedOutcome> {
    const item = { ...key.job(job.jobId), ...job, state: 'queued', [TTL_ATTRIBUTE]: this.expires(WEEK_S) };
    if (await this.putIfAbsent(item)) return 'new';
    const out = await this.doc.send(
      new GetCommand({ TableName: this.table, Key: key.job(job.jobId), ConsistentRead: true }),
    );
    return out.Item?.state === 'completed' ? 'completed' : 'again';
  }

  /**
   * GitHub said the job completed (recorded even for a job never seen queued: out of order). The job as
   * recorded, when it was seen queued.
   */
  async jobCompleted(jobId: number): Promise<GithubJob | undefined> {
    const out = await this.doc.send(
      new UpdateCommand({
        TableName: this.table,
        Key: key.job(jobId),
        UpdateExpression: 'SET #state = :completed, jobId = :job, #ttl = :ttl',
        ExpressionAttributeNames: { '#state': 'state', '#ttl': TTL_ATTRIBUTE },
        ExpressionAttributeValues: { ':completed': 'completed', ':job': jobId, ':ttl': this.expires(WEEK_S) },
        ReturnValues: 'ALL_NEW',
      }),
    );
    const parsed = GithubJob.safeParse(out.Attributes);
    return parsed.success ? parsed.data : undefined;
  }

  async job(jobId: number): Promise<GithubJob | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.table, Key: key.job(jobId), ConsistentRead: true }),
    );
    const parsed = GithubJob.safeParse(out.Item);
    return parsed.success ? parsed.data : undefined;
  }

  /**
   * Claims the start of a job's runner for one handling (`by`, unique to it): `claimed` when no other
   * handling holds the claim, or the one that does has not started the runner within `takeoverMs` (its
   * function died: no handling outlives the function's timeout); `started` when a runner was started;
   * `busy` when another handling is starting it now; `completed` when GitHub said the job completed,
   * `unknown` when no webhook recorded it. Two copies of one event (EventBridge and SQS deliver at least
   * once) thus start one runner.
   */
  async claimRunner(jobId: number, by: string, takeoverMs: number): Promise<'claimed' | RunnerClaimRefusal> {
    const now = this.now();
    if (await this.accepted(key.job(jobId), claimRunnerUpdate(by, now, now - takeoverMs))) return 'claimed';
    const job = await this.job(jobId);
    if (!job) return 'unknown';
    if (job.state === 'completed') return 'completed';
    return job.runner?.commandId ? 'started' : 'busy';
  }

  /** Gives back a claim whose handling failed before it started the runner, so a retry takes it at once. */
  async dropClaim(jobId: number, by: string): Promise<void> {
    await this.accepted(key.job(jobId), dropClaimUpdate(by));
  }

  /** The runner started: its name, instance and SSM command, and the command's pointer back to the job. */
  async runnerStarted(
    jobId: number,
    requestId: string,
    runner: {
      readonly by: string;
      readonly name: string;
      readonly instanceId: string;
      readonly commandId: string;
    },
  ): Promise<void> {
    await this.doc.send(
      new PutCommand({
        TableName: this.table,
        Item: {
          ...key.command(runner.commandId),
          jobId,
          requestId,
          instanceId: runner.instanceId,
          [TTL_ATTRIBUTE]: this.expires(WEEK_S),
        },
      }),
    );
    // Beside the claim (`by`, `at`), which stays: a later copy of the event finds the runner started.
    const update = runnerStartedUpdate(runner.by, runner);
    await this.doc.send(new UpdateCommand({ TableName: this.table, Key: key.job(jobId), ...update }));
  }

  /** The runner's command ended (its status event). */
  async runnerEnded(jobId: number): Promise<void> {
    await this.accepted(key.job(jobId), runnerEndedUpdate(this.now()));
  }

  /**
   * Claims the next scan of GitHub's queued jobs: true when none was made within `intervalMs` (less a
   * tenth, so that a schedule's jitter skips none), then recorded as made now; false for a second run
   * meanwhile, in whatever container.
   */
  async claimScan(intervalMs: number, now = this.now()): Promise<boolean> {
    return this.accepted(key.scan, claimScanUpdate(now, now - Math.floor(intervalMs * 0.9)));
  }

  /** The job and request an SSM command ran the runner of, if it was one of ours. */
  async commandOwner(
    commandId: string,
  ): Promise<{ jobId: number; requestId: string; instanceId: string } | undefined> {
    const out = await this.doc.send(
      new GetCommand({ TableName: this.table, Key: key.command(commandId), ConsistentRead: true }),
    );
    const parsed = z
      .object({ jobId: z.number(), requestId: z.string(), instanceId: z.string() })
      .safeParse(out.Item);
    return parsed.success ? parsed.data : undefined;
  }

  private async putIfAbsent(item: Record<string, unknown>): Promise<boolean> {
    return this.refusedIsFalse(
      new PutCommand({ TableName: this.table, Item: item, ConditionExpression: conditions.itemDoesNotExist }),
    );
  }

  /** Applies a conditional update (writes.ts): false when its condition did not hold. */
  private accepted(
    itemKey: Record<string, string>,
    update: Parameters<typeof expressionOf>[0],
  ): Promise<boolean> {
    return this.refusedIsFalse(
      new UpdateCommand({ TableName: this.table, Key: itemKey, ...expressionOf(update) }),
    );
  }

  private async refusedIsFalse(command: PutCommand | UpdateCommand): Promise<boolean> {
    try {
      await this.doc.send(command as UpdateCommand);
      return true;
    } catch (err) {
      if (err instanceof ConditionalCheckFailedException) return false;
      throw err;
    }
  }
}

/** An update's expressions, without an empty name map (DynamoDB refuses one). */
function expressionOf(update: {
  UpdateExpression?: string;
  ConditionExpression: string;
  ExpressionAttributeNames: Record<string, string>;
  ExpressionAttributeValues?: Record<string, unknown>;
}) {
  const { ExpressionAttributeNames, ...rest } = update;
  return Object.keys(ExpressionAttributeNames).length > 0 ? { ...rest, ExpressionAttributeNames } : rest;
}
