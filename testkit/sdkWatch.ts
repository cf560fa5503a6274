import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';

/** What a watcher sees of each command the client sends: its name and input, and awaits its output. */
type Watcher = (
  command: string,
  input: Record<string, unknown>,
  send: () => Promise<{ output: unknown }>,
) => Promise<{ output: unknown }>;

/**
 * Runs `work` with `watch` seeing every command the client sends meanwhile (an SDK middleware added for
 * the call and removed after it, whatever `work` does).
 */
export async function whileWatching(
  client: DynamoDBClient,
  watch: Watcher,
  work: () => Promise<unknown>,
): Promise<void> {
  const name = `watch-${Math.random()}`;
  client.middlewareStack.add(
    (next, context) => async (args) =>
      (await watch(context.commandName ?? '', args.input as Record<string, unknown>, () =>
        next(args),
      )) as Awaited<ReturnType<typeof next>>,
    { step: 'initialize', name },
  );
  try {
    await work();
  } finally {
    client.middlewareStack.remove(name);
  }
}

/**
 * Capacity units consumed, as DynamoDB bills them (dynalite reports ConsumedCapacity), by the commands
 * whose name matches `commands` (`/Put|Update|Delete/`: writes; `/Get|Query|Scan/`: reads) while `work` runs.
 */
export async function consumedUnits(
  client: DynamoDBClient,
  commands: RegExp,
  work: () => Promise<unknown>,
): Promise<number> {
  let units = 0;
  await whileWatching(
    client,
    async (command, input, send) => {
      input.ReturnConsumedCapacity = 'TOTAL';
      const out = await send();
      // One table's figure, or a list of them (transactions and batches: one entry per table).
      type Consumed = { CapacityUnits?: number };
      const consumed = (out.output as { ConsumedCapacity?: Consumed | Consumed[] }).ConsumedCapacity;
      const all = Array.isArray(consumed) ? consumed : consumed ? [consumed] : [];
      if (commands.test(command)) for (const c of all) units += c.CapacityUnits ?? 0;
      return out;
    },
    work,
  );
  return units;
}
