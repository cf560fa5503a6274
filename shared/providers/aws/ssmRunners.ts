import {
  CancelCommandCommand,
  DeleteParameterCommand,
  InvalidCommandId,
  InvalidInstanceId,
  ParameterNotFound,
  PutParameterCommand,
  SendCommandCommand,
  type SSMClient,
} from '@aws-sdk/client-ssm';

/**
 * The channel from the pool's functions to an EC2 backing node: SSM Run Command (the instance's SSM
 * agent runs a shell script as root) and a SecureString parameter for what the script must not carry
 * in the clear (an SSM command's parameters stay in its history). The script's end is reported by SSM
 * as an `EC2 Command Invocation Status-change Notification` on the account's default event bus.
 */

/** AWS's document that runs shell commands (its `commands` and `executionTimeout` parameters). */
export const RUN_SHELL_DOCUMENT = 'AWS-RunShellScript';
/** A Standard parameter holds 4 KB; an Advanced one 8 KB (and costs). */
const STANDARD_PARAMETER_BYTES = 4096;
/** SSM's bounds on a command's executionTimeout, seconds. */
const MAX_EXECUTION_TIMEOUT_S = 172_800;

export interface StartInput {
  readonly instanceId: string;
  readonly parameterName: string;
  readonly secret: string;
  readonly script: string;
  /** How long the script may run, seconds (SSM's executionTimeout). */
  readonly timeoutSeconds: number;
  /** Shown in the SSM console (at most 100 characters). */
  readonly comment: string;
}

export interface RunnerChannel {
  /** Stores the secret, then sends the script: the SSM command's id. */
  start(input: StartInput): Promise<string>;
  /** Deletes a secret the instance never read (gone already: nothing to do). */
  forget(parameterName: string): Promise<void>;
  /** Stops a command still running (SSM ends the processes it started); one that ended: nothing to do. */
  stop(commandId: string, instanceId: string): Promise<void>;
}

export class SsmRunnerChannel implements RunnerChannel {
  constructor(private readonly ssm: SSMClient) {}

  async start(input: StartInput): Promise<string> {
    const bytes = Buffer.byteLength(input.secret, 'utf8');
    await this.ssm.send(
      new PutParameterCommand({
        Name: input.parameterName,
        Value: input.secret,
        Type: 'SecureString',
        Overwrite: true,
        Tier: bytes > STANDARD_PARAMETER_BYTES ? 'Advanced' : 'Standard',
        Description: 'metastatic: a just-in-time runner configuration, read once by its instance',
      }),
    );
    const timeout = Math.min(Math.max(input.timeoutSeconds, 1), MAX_EXECUTION_TIMEOUT_S);
    const out = await this.ssm.send(
      new SendCommandCommand({
        InstanceIds: [input.instanceId],
        DocumentName: RUN_SHELL_DOCUMENT,
        Comment: input.comment.slice(0, 100),
        Parameters: { commands: [input.script], executionTimeout: [String(timeout)] },
        // How long SSM tries to deliver it to an agent not reachable yet (the node is ready: seconds).
        TimeoutSeconds: 600,
      }),
    );
    const id = out.Command?.CommandId;
    if (!id) throw new Error(`SSM SendCommand to ${input.instanceId} returned no command id`);
    return id;
  }

  async stop(commandId: string, instanceId: string): Promise<void> {
    try {
      await this.ssm.send(new CancelCommandCommand({ CommandId: commandId, InstanceIds: [instanceId] }));
    } catch (err) {
      // Ended already, or its instance gone: there is nothing left to stop.
      if (!(err instanceof InvalidCommandId || err instanceof InvalidInstanceId)) throw err;
    }
  }

  async forget(parameterName: string): Promise<void> {
    try {
      await this.ssm.send(new DeleteParameterCommand({ Name: parameterName }));
    } catch (err) {
      if (!(err instanceof ParameterNotFound)) throw err;
    }
  }
}
