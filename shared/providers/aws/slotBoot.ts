import { gzipSync } from 'node:zlib';
import type { SlotLimits } from '../../core/slotLimits.ts';
import { SLOT_PROGRAM } from '../slot/slotProgram.ts';

/**
 * What an aws label with `isolation: contain` adds to its instances' cloud-config (userData.ts): the slot
 * program (slotProgram.ts, the same text a local backing node runs), the slots it sets up, and the lines
 * that make sshd the door into them. cloud-init writes the files in its first stage, before sshd starts,
 * and runs `metastatic-slot boot` in its last, at every boot (a per-boot script); until boot has finished, the PAM hook refuses every slot
 * user's session (and the users do not exist yet), so no job runs uncontained. Plain data in, text out.
 *
 * - `/usr/local/sbin/metastatic-slot` (0700, root): the slot program, gzip and base64 as cloud-init's
 *   `gz+b64` encoding (a third of its size, for EC2's 16 KB).
 * - `/etc/metastatic/slots` (0600): `USERNAME SLOTS MILLICORES MEMORY_MIB PIDS IMDS`, one line for all
 *   the slots (users `USERNAME-0` ...), so that a thousand slots cost no more user data than one.
 * - `/etc/metastatic/authorized_keys` (0644, root): the pool's keys, the only ones a slot user is let in
 *   with. A key a job writes to its own `~/.ssh/authorized_keys` opens nothing.
 * - `/etc/ssh/sshd_config.d/50-metastatic.conf`: `Match Group metastatic-slot` (boot puts every slot
 *   user in it) ->
 *   `AuthorizedKeysFile /etc/metastatic/authorized_keys` (the image's sshd_config must include
 *   sshd_config.d, as Ubuntu 20.04+, Debian 11+ and Amazon Linux 2023 do).
 * - appended to `/etc/pam.d/sshd`: pam_namespace (a /tmp, /var/tmp and /dev/shm per slot user, as boot
 *   configures it; ignored where the module is missing, so that no other user is locked out: boot then
 *   fails, and so does every slot user's session) and pam_exec running `metastatic-slot pam` (the
 *   session into its slot's cgroup).
 */

export const SLOT_PROGRAM_PATH = '/usr/local/sbin/metastatic-slot';
export const SLOTS_FILE = '/etc/metastatic/slots';
export const SLOT_KEYS_FILE = '/etc/metastatic/authorized_keys';
export const SSHD_DROP_IN = '/etc/ssh/sshd_config.d/50-metastatic.conf';
export const PAM_SSHD = '/etc/pam.d/sshd';

export interface ContainedSlots {
  /** The slot users are `<username>-<slot>` (core/contract.ts slotUserName), for each of `slots`. */
  readonly username: string;
  readonly slots: number;
  readonly limits: SlotLimits;
  /** Whether slot users may reach the instance metadata service (and so the instance profile). */
  readonly imds: boolean;
  readonly authorizedKeys: readonly string[];
}

/** The slots file boot and the PAM hook read. */
export function slotsFile(slots: ContainedSlots): string {
  const { millicores, memoryMiB, pids } = slots.limits;
  const imds = slots.imds ? 1 : 0;
  return [
    '# metastatic: USERNAME SLOTS MILLICORES MEMORY_MIB PIDS IMDS (0: the instance metadata service refused)',
    `${slots.username} ${slots.slots} ${millicores} ${memoryMiB} ${pids} ${imds}`,
    '',
  ].join('\n');
}

/** The lines appended to sshd's PAM stack (after its own, so the session ends up in the slot's cgroup). */
export function pamLines(): string {
  return [
    '# metastatic (isolation: contain): a slot user gets its own /tmp, /var/tmp, /dev/shm and its slot',
    // Loaded where it is; where it is not, boot refuses to finish, and the hook below every slot session.
    'session [success=ok ignore=ignore module_unknown=ignore default=bad] pam_namespace.so',
    `session required pam_exec.so quiet ${SLOT_PROGRAM_PATH} pam ${SLOTS_FILE}`,
    '',
  ].join('\n');
}

/** The group of the slot users (slotProgram.ts boot), which sshd's Match names. */
export const SLOT_GROUP = 'metastatic-slot';

/** sshd's drop-in: the slot users are let in with the pool's keys, from a file no job can write. */
export function sshdDropIn(): string {
  return [
    '# metastatic (isolation: contain): the slot users log in with the pool keys only',
    `Match Group ${SLOT_GROUP}`,
    `    AuthorizedKeysFile ${SLOT_KEYS_FILE}`,
    '',
  ].join('\n');
}

/** The slot program as cloud-init's gz+b64 content (deterministic: gzip's header carries no time). */
export function packedSlotProgram(): string {
  return gzipSync(Buffer.from(SLOT_PROGRAM, 'utf8'), { level: 9 }).toString('base64');
}

/** Every string is written as a JSON string: a valid YAML double-quoted scalar, whatever it holds. */
const q = (s: string) => JSON.stringify(s);

/**
 * Where cloud-init runs a script at every boot, in its last stage (scripts-per-boot), the first one
 * included: the slots are set up again after a reboot (cgroups, firewall rules and /run are gone).
 */
export const PER_BOOT_SCRIPT = '/var/lib/cloud/scripts/per-boot/metastatic-slot';

/** The cloud-config lines (a top-level `write_files:`) of contained slots. */
export function containedCloudConfig(slots: ContainedSlots): string[] {
  const file = (path: string, permissions: string, content: string, extra: string[] = []) => [
    `  - path: ${q(path)}`,
    '    owner: "root:root"',
    `    permissions: ${q(permissions)}`,
    ...extra,
    `    content: ${q(content)}`,
  ];
  const keys = slots.authorizedKeys.map((k) => `${k}\n`).join('');
  return [
    'write_files:',
    ...file(SLOT_PROGRAM_PATH, '0700', packedSlotProgram(), ['    encoding: "gz+b64"']),
    ...file(SLOTS_FILE, '0600', slotsFile(slots)),
    ...file(SLOT_KEYS_FILE, '0644', keys),
    ...file(SSHD_DROP_IN, '0644', sshdDropIn()),
    ...file(PAM_SSHD, '0644', pamLines(), ['    append: true']),
    ...file(PER_BOOT_SCRIPT, '0700', `#!/bin/sh\nexec ${SLOT_PROGRAM_PATH} boot ${SLOTS_FILE}\n`),
  ];
}
