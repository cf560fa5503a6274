import { z } from 'zod';
import {
  type BackingContract,
  CONNECTION_TYPES,
  DEFAULT_CONNECTION_TYPE,
  DEFAULT_PYTHON_PATH,
} from '../core/contract.ts';
import { bool } from './fields.ts';

/**
 * The node contract's keys of a backing label (Nodepool's names: `username`, `python-path`,
 * `shell-type`, `connection-type`; `connection-port` is the aws label's own key) and the aws pools'
 * `authorized-keys`, with their defaults (core/contract.ts says what a node does with them).
 */

/**
 * The aws driver's default username. Amazon Linux (2 and 2023), RHEL, SUSE, CentOS and Fedora images
 * log in as `ec2-user` (AWS's "default user name for your AMI" list); Ubuntu's is `ubuntu`, Debian's
 * `admin`: set `username` for those. Nodepool's aws driver has no default of its own beyond its
 * images' `username` (its cloud images default to `zuul`, which EC2 images do not have).
 */
export const DEFAULT_AWS_USERNAME = 'ec2-user';

/**
 * A login name: what useradd accepts and cloud-init passes to it (at most 32 characters, starting with a
 * letter or `_`), with `.` and upper case allowed for images whose users have them.
 */
export const USERNAME_PATTERN = /^[A-Za-z_][A-Za-z0-9._-]{0,31}$/;
const USERNAME = 'a user name of 1-32 characters of A-Z a-z 0-9 . _ - starting with a letter or _';

/**
 * With per-slot-users the username is the prefix of each slot's user (`<username>-<slot>`): lower case
 * (Debian's adduser refuses upper case by default) and room for `-999` within useradd's 32.
 */
export const PER_SLOT_USERNAME_PATTERN = /^[a-z_][a-z0-9_-]{0,27}$/;
export const PER_SLOT_USERNAME =
  'a user name of 1-28 characters of a-z 0-9 _ - starting with a letter or _ (with per-slot-users, slot users are <username>-<slot>)';

/**
 * Ansible's interpreter discovery modes (python-path `auto`, Nodepool's default, and its variants) or
 * an interpreter's path (`/usr/bin/python3`, `/usr/bin/env python3`). Bounded, one line of ASCII.
 */
export const MAX_PYTHON_PATH_CHARS = 255;
const PYTHON_PATH = `"auto" or an interpreter's path, one line of at most ${MAX_PYTHON_PATH_CHARS} printable ASCII characters`;

/** Ansible's shell plugins (ansible_shell_type); absent means sh. */
export const SHELL_TYPES = ['sh', 'csh', 'fish', 'powershell', 'cmd'] as const;

/** `authorized-keys`: at most this many lines, each at most this long (a 16384-bit RSA key is ~2,800). */
export const MAX_AUTHORIZED_KEYS = 32;
export const MAX_AUTHORIZED_KEY_CHARS = 4096;

/**
 * The public key types OpenSSH accepts in authorized_keys by default (ssh-dss is off since OpenSSH 7.0
 * and gone in 9.8; certificates are trusted with `cert-authority`, which is an option, not a key).
 */
export const SSH_KEY_TYPES = [
  'ssh-ed25519',
  'ssh-rsa',
  'ecdsa-sha2-nistp256',
  'ecdsa-sha2-nistp384',
  'ecdsa-sha2-nistp521',
  'sk-ssh-ed25519@openssh.com',
  'sk-ecdsa-sha2-nistp256@openssh.com',
] as const;

const AUTHORIZED_KEY = `an OpenSSH public key line (${SSH_KEY_TYPES.join(', ')}; then the base64 key; then an optional comment) of at most ${MAX_AUTHORIZED_KEY_CHARS} characters, without options`;

/**
 * Why a line is not an OpenSSH public key line as authorized_keys takes it (no options), or undefined.
 * The base64 blob must decode and name the same key type as the line: a key pasted with the wrong
 * type, or cut short, is caught here rather than by a failed login.
 */
export function authorizedKeyProblem(line: string): string | undefined {
  if (line.length > MAX_AUTHORIZED_KEY_CHARS) return `a line of ${line.length} characters`;
  // The comment may hold any printable text but no line break (it would start another line).
  if (hasControlCharacter(line)) return 'a line with a control character or line break';
  const match = /^(\S+) ([A-Za-z0-9+/]+={0,2})(?: (.*))?$/.exec(line);
  if (!match) return describeStart(line);
  const [, type, blob] = match as unknown as [string, string, string];
  if (!(SSH_KEY_TYPES as readonly string[]).includes(type)) return `key type ${JSON.stringify(type)}`;
  const data = Buffer.from(blob, 'base64');
  // The blob is an SSH string (uint32 length, then the name) holding the type, then the key itself.
  const nameLength = data.length >= 4 ? data.readUInt32BE(0) : -1;
  if (nameLength < 0 || 4 + nameLength >= data.length) return `a ${type} line whose key data is cut short`;
  const named = data.subarray(4, 4 + nameLength).toString('latin1');
  if (named !== type) return `a ${type} line whose key data is a ${JSON.stringify(named)} key`;
  return undefined;
}

/** A C0 control character or DEL (a line break among them): nothing a one-line value may hold. */
export function hasControlCharacter(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x7f) return true;
  }
  return false;
}

function describeStart(line: string): string {
  const shown = line.length > 40 ? `${line.slice(0, 37)}...` : line;
  return JSON.stringify(shown);
}

export const authorizedKeys = () =>
  z
    .array(
      z
        // The length is checked with the rest (authorizedKeyProblem), so the error says what is wrong.
        .string({ error: AUTHORIZED_KEY })
        .superRefine((line, ctx) => {
          const problem = authorizedKeyProblem(line);
          if (problem !== undefined) {
            ctx.addIssue({ code: 'custom', message: AUTHORIZED_KEY, params: { got: problem } });
          }
        }),
      { error: `a list of at most ${MAX_AUTHORIZED_KEYS} public key lines` },
    )
    .max(MAX_AUTHORIZED_KEYS, { error: `a list of at most ${MAX_AUTHORIZED_KEYS} public key lines` });

export const username = () => z.string({ error: USERNAME }).regex(USERNAME_PATTERN, { error: USERNAME });

export const connectionType = () =>
  z.enum(CONNECTION_TYPES, {
    error: `${CONNECTION_TYPES.join(', ')} (the only connection type metastatic nodes offer; Nodepool's winrm and network_cli are not supported)`,
  });

export const pythonPath = () =>
  z
    .string({ error: PYTHON_PATH })
    .min(1, { error: PYTHON_PATH })
    .max(MAX_PYTHON_PATH_CHARS, { error: PYTHON_PATH })
    // ASCII: each node of a request item holds it, so its bytes are bounded too (docs: Limits).
    .regex(/^[ -~]+$/, { error: PYTHON_PATH });

export const shellType = () => z.enum(SHELL_TYPES, { error: `one of ${SHELL_TYPES.join(', ')}` });

/** The contract keys every backing label has (the aws label adds username and per-slot-users). */
export const contractKeys = {
  'connection-type': connectionType()
    .default(DEFAULT_CONNECTION_TYPE)
    .describe(
      "How jobs connect to its nodes (Nodepool's connection-type, Zuul's ansible_connection). Only ssh is supported.",
    ),
  'python-path': pythonPath()
    .default(DEFAULT_PYTHON_PATH)
    .describe(
      "The Python interpreter jobs use on its nodes (Nodepool's python-path, Zuul's ansible_python_interpreter); auto lets Ansible discover it.",
    ),
  'shell-type': shellType()
    .optional()
    .describe(
      "The login shell's type when it is not a POSIX sh (Nodepool's shell-type, Zuul's ansible_shell_type). Default: unset, meaning sh.",
    ),
} as const;

/** The aws label's `per-slot-users` key. */
export const perSlotUsers = () =>
  bool()
    .default(false)
    .describe(
      "Create one user per slot (<username>-<slot>, with the pool's authorized-keys and a home directory of its own, no sudo) in the instance's user data; each node's username is its slot's user. Needs the pool's authorized-keys.",
    );

/**
 * The contract of a backing label from its options as the schema left them (defaults applied), for the
 * resolved model (core/model.ts BackingLabel.contract). `username` is taken wherever a label has one
 * (an aws label always has, by default ec2-user).
 */
export function contractOf(options: Readonly<Record<string, unknown>>): BackingContract {
  const text = (key: string) => (typeof options[key] === 'string' ? (options[key] as string) : undefined);
  const username = text('username');
  const shellType = text('shell-type');
  return {
    ...(username === undefined ? {} : { username }),
    connectionType: text('connection-type') ?? DEFAULT_CONNECTION_TYPE,
    pythonPath: text('python-path') ?? DEFAULT_PYTHON_PATH,
    ...(shellType === undefined ? {} : { shellType }),
    ...(options['per-slot-users'] === true ? { perSlotUsers: true } : {}),
  };
}
