import { type EC2Client, GetConsoleOutputCommand } from '@aws-sdk/client-ec2';
import { RetryableError } from '../../core/errors.ts';
import type { ReportedHostKeys } from '../../core/provider.ts';
import { MAX_CONSOLE_CHARS, parseConsoleHostKeys } from './consoleHostKeys.ts';
import { type CallPolicy, ec2Call, type RetryBudget } from './ec2Calls.ts';
import { classifyEc2Error, describeEc2Error, ec2ErrorCode } from './ec2Errors.ts';

/** MAX_CONSOLE_CHARS as base64: a multiple of 4, so the end of a longer answer decodes whole. */
const MAX_CONSOLE_BASE64 = Math.ceil(MAX_CONSOLE_CHARS / 3) * 4;

/**
 * The error codes with which EC2 refuses `Latest` itself (an instance not built on the Nitro system):
 * an unsupported operation, or a parameter it does not take (the call's only other parameter is the
 * instance id, whose errors are InvalidInstanceID.*). Only these are asked again without `Latest`: a
 * missing permission, an opt-in or a state error would be refused again.
 */
export const LATEST_REFUSED_CODES: ReadonlySet<string> = new Set([
  'UnsupportedOperation',
  'InvalidParameterCombination',
  'InvalidParameterValue',
  'InvalidParameter',
]);

/**
 * The SSH host keys cloud-init printed to the instance's serial console (consoleHostKeys.ts parses them),
 * read with GetConsoleOutput. `Latest: true` reads the console as it is now, which Nitro instances
 * support; others refuse it (LATEST_REFUSED_CODES), and are asked again without it (the output EC2
 * buffered at the last state change, which can be minutes late: validation refuses `host-keys: console`
 * on the instance types known not to be Nitro, shared/providers/aws/nitro.ts). Any other error is not asked
 * again. An instance EC2 does not know (yet) has no keys yet.
 */
export async function readConsoleHostKeys(
  client: EC2Client,
  policy: CallPolicy,
  instanceId: string,
  budget: RetryBudget,
): Promise<ReportedHostKeys> {
  const read = (latest: boolean) =>
    ec2Call(policy, 'GetConsoleOutput', budget, () =>
      client.send(
        new GetConsoleOutputCommand({ InstanceId: instanceId, ...(latest ? { Latest: true } : {}) }),
      ),
    );
  let output: string | undefined;
  try {
    output = (
      await read(true).catch((err: unknown) => {
        if (err instanceof RetryableError || !LATEST_REFUSED_CODES.has(ec2ErrorCode(err))) throw err;
        return read(false); // not a Nitro instance: no `Latest`
      })
    ).Output;
  } catch (err) {
    if (err instanceof RetryableError) throw err;
    if (classifyEc2Error(err) === 'not-found') return { kind: 'none' };
    throw new Error(`GetConsoleOutput ${instanceId} failed: ${describeEc2Error(err)}`, { cause: err });
  }
  if (!output) return { kind: 'none' }; // nothing posted yet
  // EC2 sends at most 64 KB; a longer answer is cut to its end (whole 4-character groups) first.
  const tail = output.length > MAX_CONSOLE_BASE64 ? output.slice(-MAX_CONSOLE_BASE64) : output;
  return parseConsoleHostKeys(Buffer.from(tail, 'base64').toString('utf8'));
}
