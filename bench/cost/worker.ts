/**
 * A child process of `npm run cost` (bench/cost/main.ts forks one per core): runs the simulations it
 * is sent, one at a time, on a dynalite of its own, and sends each result back.
 */
import { startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { type PolicyResult, type SimOptions, simulate } from './simulate.ts';
import type { Trace } from './traces.ts';

export interface Task {
  readonly id: number;
  readonly trace: Trace;
  readonly options: SimOptions;
  readonly series: boolean;
}

export type TaskReply =
  | { readonly id: number; readonly result: PolicyResult }
  | { readonly id: number; readonly error: string };

const send = (reply: TaskReply) => process.send?.(reply);

if (process.send) {
  // Listen at once (a message that came before a listener would be lost); the engine starts meanwhile.
  const engine = startInProcessDynalite({ http: process.env.COST_SIM_HTTP === '1' });
  process.on('message', (task: Task) => {
    engine
      .then((e) => simulate(e, task.trace, task.options, { series: task.series }))
      .then(
        (result) => send({ id: task.id, result }),
        (err: unknown) => send({ id: task.id, error: (err as Error).stack ?? String(err) }),
      );
  });
  process.on('disconnect', () => {
    void engine.then((e) => e.close()).finally(() => process.exit(0));
  });
}
