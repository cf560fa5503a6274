import { PermanentError } from '../../shared/core/errors.ts';
import { parseNodeId } from '../../shared/core/ids.ts';
import { connect, type Operator, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { backingJson, nodeJson, table } from '../format.ts';
import { print, printError, printJson } from '../output.ts';

/**
 * Runs an operator verb; domain refusals become exit code 1. Against an embedded pool the running
 * `metastatic dev` does the work (client.ts): nothing is left running here when the verb returns.
 */
async function withOperator(target: Target, work: (op: Operator) => Promise<void>): Promise<void> {
  const client = await connect(target);
  try {
    await work(await client.operator());
  } catch (err) {
    if (err instanceof PermanentError) throw new CliError(err.message);
    throw err;
  } finally {
    client.close();
  }
}

/** `metastatic hold NODE-ID` */
export async function hold(target: Target, nodeIdArg: string, opts: { json?: boolean }): Promise<void> {
  if (!parseNodeId(nodeIdArg)) {
    throw new CliError(`"${nodeIdArg}" is not a node id (node ids look like <request-id>/<index>)`, 2);
  }
  await withOperator(target, async (op) => {
    const node = await op.hold(nodeIdArg);
    if (opts.json) printJson(nodeJson(node));
    else print(`holding ${nodeIdArg}; release it with: metastatic release ${nodeIdArg} --force`);
  });
}

/** `metastatic drain BACKING-ID` */
export async function drain(target: Target, id: string, opts: { json?: boolean }): Promise<void> {
  await withOperator(target, async (op) => {
    const b = await op.drain(id);
    if (opts.json) printJson(backingJson(b));
    else print(`draining ${id} (${b.used}/${b.slots} slots in use); it goes when empty`);
  });
}

/** `metastatic reap`: one reaper run now; its errors set exit code 1. */
export async function reap(target: Target, opts: { json?: boolean }): Promise<void> {
  await withOperator(target, async (op) => {
    const report = await op.reap();
    if (opts.json) {
      printJson(report);
      return;
    }
    const columns: Array<[string, number]> = [
      ['RETIRED', report.retired.length],
      ['STOPPED', report.stopped.length],
      ['FAILED', report.failed.length],
      ['MOVED', report.moved],
      ['ORPHANS', report.orphans.length],
      ['SLOTS RECLAIMED', report.reclaimedSlots],
      ['PLACES RECLAIMED', report.reclaimedPlaces],
      ['CONFLICTS', report.conflicts],
      ['ERRORS', report.errors.length],
    ];
    print(
      table(
        columns.map(([name]) => name),
        [columns.map(([, value]) => value)],
      ),
    );
    for (const e of report.errors) printError(`error: ${e}`);
    if (report.errors.length > 0) process.exitCode = 1;
  });
}
