import type { PoolFunctionRole } from './deployed.ts';

/** What `metastatic rehearse` is given, and what it reports as it goes (rehearsal.ts). */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export interface RehearsalOptions {
  /** Where the app is (its cdk.json), and where the CDK CLI runs. */
  readonly cwd: string;
  /** The app: a command (as `cdk --app`), or a cloud assembly directory; default: cdk.json's. */
  readonly app?: string;
  /** Context for `cdk synth` (`-c key=value`). */
  readonly context?: Readonly<Record<string, string>>;
  /** The stack to rehearse (by name or artifact id); default: the app's only pool stack. */
  readonly stack?: string;
  /** A running moto_server; default: one started here. */
  readonly endpoint?: string;
  /** The port of the moto_server started here (default: a free one). */
  readonly port?: number;
  /** Seconds between reaper runs (default: the deployed schedule's rate). */
  readonly reaperInterval?: number;
  /**
   * Invocations of one function that may run at once, each in a container (process) of its own; a
   * mapping polls with at most this many pollers, and no more than its maxConcurrency (default 2).
   */
  readonly concurrency?: number;
  /**
   * Add a made-up SSH host-key block to moto's console output (default true); false rehearses an image
   * that prints none (with `host-keys: console`, backing nodes then fail at boot-timeout).
   */
  readonly consoleHostKeys?: boolean;
  /** The functions' log level (POWERTOOLS_LOG_LEVEL; default warn). */
  readonly logLevel?: LogLevel;
  /** More environment for the CDK CLI and the functions' processes. */
  readonly childEnv?: Readonly<Record<string, string>>;
  readonly onEvent?: (event: RehearsalEvent) => void;
  /** Each line a function prints (its Powertools logs). */
  readonly onFunctionOutput?: (role: PoolFunctionRole, line: string) => void;
}

/** What the rehearsal reports as it goes (the CLI prints it; `--json`: one object per line). */
export type RehearsalEvent =
  | { readonly type: 'step'; readonly step: string; readonly message: string; readonly ms?: number }
  | { readonly type: 'warning'; readonly message: string }
  | {
      readonly type: 'delivery';
      readonly function: PoolFunctionRole;
      readonly queue: string;
      readonly records: number;
      readonly failed: number;
      readonly error?: string;
      readonly ms: number;
    }
  | { readonly type: 'ec2'; readonly instanceId: string; readonly state: string }
  | {
      readonly type: 'reaper';
      readonly retired: readonly string[];
      readonly stopped: readonly string[];
      readonly failed: readonly string[];
      readonly errors: readonly string[];
      readonly error?: string;
      readonly ms: number;
    }
  | { readonly type: 'error'; readonly message: string };
