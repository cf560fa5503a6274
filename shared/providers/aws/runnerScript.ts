import { shellQuote } from '../../core/text.ts';
import { SLOT_PROGRAM_PATH, SLOTS_FILE } from './slotBoot.ts';

/**
 * The shell script an EC2 backing node runs, as root, through SSM Run Command (AWS-RunShellScript), to
 * start a job's just-in-time runner in a slot (docs/github.md, "On AWS"). The JIT configuration is not in
 * it (an SSM command's parameters are kept in its history, readable with ssm:ListCommands): it waits in
 * a SecureString parameter that the script reads with the AWS CLI, through the instance's role, and
 * deletes at once. The runner gets it on stdin (`$METASTATIC_JITCONFIG`, as `metastatic dev` gives it),
 * never on a command line the pool builds.
 *
 * The runner runs as the slot's user in its home:
 * - in a contained slot (`isolation: contain`: the slot user is in the slot program's file) through the
 *   slot program's `run`: the slot's cgroup and limits, its own /tmp and /home, its own PID namespace,
 *   no capabilities;
 * - otherwise as the node's user (setpriv, its groups), as an SSH session of that user would.
 * The command runs in the foreground: its end (the runner took its one job and exited, or it was killed)
 * is the end of the SSM command, whose status event releases the node.
 */

export interface RunnerScriptInput {
  readonly region: string;
  /** The SecureString parameter holding the encoded JIT configuration. */
  readonly parameterName: string;
  /** The slot's user (the node's `username`). */
  readonly user: string;
  /** github.runner-command: run with sh in the user's home. */
  readonly runnerCommand: string;
}

/** Where a contained slot's runner gets its /tmp: a directory of its own, emptied at each start. */
export const RUNNER_TMP_ROOT = '/var/lib/metastatic/runner-tmp';

/** The runner's PATH: a login's, with /usr/local first (where images put tools). */
export const RUNNER_PATH = '/usr/local/bin:/usr/bin:/bin';

export function runnerScript(input: RunnerScriptInput): string {
  const inner =
    'IFS= read -r METASTATIC_JITCONFIG && export METASTATIC_JITCONFIG && { cd "$HOME" 2>/dev/null || cd /; } && exec sh -c "$1"';
  return [
    'set -eu',
    `region=${shellQuote(input.region)} parameter=${shellQuote(input.parameterName)} user=${shellQuote(input.user)}`,
    `command=${shellQuote(input.runnerCommand)}`,
    'jit=$(aws ssm get-parameter --region "$region" --name "$parameter" --with-decryption --query Parameter.Value --output text)',
    'aws ssm delete-parameter --region "$region" --name "$parameter" >/dev/null 2>&1 || true',
    'entry=$(getent passwd "$user") || { echo "metastatic: no user $user on this instance" >&2; exit 125; }',
    'home=$(printf %s "$entry" | cut -d: -f6) uid=$(id -u "$user") gid=$(id -g "$user")',
    // Nothing of the agent's (root's) environment reaches the runner: what a login would set, no more.
    `ENVIRONMENT="USER=$user LOGNAME=$user SHELL=/bin/sh LANG=C.UTF-8 PATH=${RUNNER_PATH}"`,
    `if [ -x ${SLOT_PROGRAM_PATH} ] && [ -f ${SLOTS_FILE} ] && id -nG "$user" | tr ' ' '\\n' | grep -qx metastatic-slot; then`,
    `  tmp=${RUNNER_TMP_ROOT}/$user`,
    '  rm -rf "$tmp" && mkdir -p "$tmp" && chown "$uid:$gid" "$tmp" && chmod 0700 "$tmp"',
    `  printf '%s\\n' "$jit" | env -i HOME="/home/$user" $ENVIRONMENT ${SLOT_PROGRAM_PATH} run "$user" "$uid" "$gid" "$home" "$tmp" "$user" -- sh -c ${shellQuote(inner)} sh "$command"`,
    'else',
    '  cd "$home" 2>/dev/null || cd /',
    `  printf '%s\\n' "$jit" | env -i HOME="$home" $ENVIRONMENT setpriv --reuid="$uid" --regid="$gid" --init-groups -- sh -c ${shellQuote(inner)} sh "$command"`,
    'fi',
  ].join('\n');
}
