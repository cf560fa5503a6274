/**
 * One function's "container" in the rehearsal (started by lambdaRuntime.ts): a Node process with the
 * function's deployed environment, which loads its bundle from LAMBDA_TASK_ROOT once (a cold start) and
 * runs one invocation at a time, as the Lambda runtime for Node.js does: the handler gets the event and a
 * context whose remaining time counts down to the function's timeout. Nothing of the project is imported:
 * the bundle is all the function's code.
 */
import { randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { join } from 'node:path';

type Handler = (event: unknown, context: unknown) => Promise<unknown>;

interface Invoke {
  readonly type: 'invoke';
  readonly id: number;
  readonly event: unknown;
  /** Epoch ms when the function times out. */
  readonly deadline: number;
}

let handler: Handler | undefined;

function load(): Handler {
  const root = process.env.LAMBDA_TASK_ROOT as string;
  const [file, exported] = (process.env._HANDLER ?? 'index.handler').split('.') as [string, string];
  const mod = createRequire(join(root, 'noop.js'))(join(root, `${file}.js`)) as Record<string, unknown>;
  const found = mod[exported];
  if (typeof found !== 'function') throw new Error(`${root}/${file}.js exports no function ${exported}`);
  return found as Handler;
}

function send(message: unknown): void {
  process.send?.(message);
}

process.on('message', (message: Invoke) => {
  if (message?.type !== 'invoke') return;
  const functionName = process.env.AWS_LAMBDA_FUNCTION_NAME ?? 'function';
  const context = {
    callbackWaitsForEmptyEventLoop: true,
    functionName,
    functionVersion: '$LATEST',
    invokedFunctionArn: process.env.METASTATIC_REHEARSAL_FUNCTION_ARN ?? functionName,
    memoryLimitInMB: process.env.AWS_LAMBDA_FUNCTION_MEMORY_SIZE ?? '128',
    awsRequestId: randomUUID(),
    logGroupName: `/aws/lambda/${functionName}`,
    logStreamName: 'rehearsal',
    getRemainingTimeInMillis: () => Math.max(0, message.deadline - Date.now()),
    done: () => undefined,
    fail: () => undefined,
    succeed: () => undefined,
  };
  Promise.resolve()
    .then(() => {
      handler ??= load();
      return handler(message.event, context);
    })
    .then(
      (result) => send({ type: 'result', id: message.id, ok: true, result: result ?? null }),
      (err: unknown) => {
        const e = err instanceof Error ? err : new Error(String(err));
        send({ type: 'result', id: message.id, ok: false, error: { name: e.name, message: e.message } });
      },
    );
});

// The rehearsal that started this process is gone (it ended, or was killed): so is its container.
process.on('disconnect', () => process.exit(0));

// Lambda's runtime logs an unhandled rejection and goes on to the next invocation.
process.on('unhandledRejection', (reason) => {
  console.error('unhandled rejection', reason);
});

send({ type: 'ready' });
