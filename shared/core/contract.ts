import { z } from 'zod';

/**
 * The node contract: what a job needs besides host and port to log in to a node and drive it, named as
 * Nodepool names it (`username`, `connection-type`, `python-path`, `shell-type`; Zuul turns them into
 * `ansible_user`, `ansible_connection`, `ansible_python_interpreter`, `ansible_shell_type`).
 *
 * It is set per backing label in the configuration (shared/fields/contractFields.ts) and written on
 * the backing record when the backing node is launched (the intent, core/backing.ts newBackingRecord):
 * every node served on that backing node copies it, as Nodepool's metastatic adapter copies them from
 * its backing node. Recording it at launch matters for per-slot users: the user names a node gets must
 * be the ones its backing node was launched with, whatever the configuration says later.
 */

/** The connection types a node may have. Nodepool knows ssh, winrm, network_cli; this pool serves ssh. */
export const CONNECTION_TYPES = ['ssh'] as const;
export type ConnectionType = (typeof CONNECTION_TYPES)[number];
export const DEFAULT_CONNECTION_TYPE: ConnectionType = 'ssh';

/** Nodepool's default python-path: Ansible discovers the interpreter. */
export const DEFAULT_PYTHON_PATH = 'auto';

export const BackingContract = z.object({
  /** Whom a job logs in as; with perSlotUsers, the prefix of each slot's user (slotUserName). */
  username: z.string().optional(),
  connectionType: z.string(),
  pythonPath: z.string(),
  /** Absent: sh (Nodepool's and Ansible's default). */
  shellType: z.string().optional(),
  /** Each slot has a user of its own (aws `per-slot-users`), named by slotUserName. */
  perSlotUsers: z.boolean().optional(),
});
export type BackingContract = z.infer<typeof BackingContract>;

/** The contract of a backing record written before it existed: Nodepool's defaults, no username. */
export const LEGACY_CONTRACT: BackingContract = {
  connectionType: DEFAULT_CONNECTION_TYPE,
  pythonPath: DEFAULT_PYTHON_PATH,
};

/**
 * The user of one slot when each slot has its own: `<username>-<slot>` (`zuul-0`, `zuul-1`, ...), slots
 * counted from 0 as in the node record. Short enough for useradd (32) whenever the username is
 * (shared/fields/contractFields.ts bounds it to 28 characters with per-slot-users).
 */
export function slotUserName(username: string, slot: number): string {
  return `${username}-${slot}`;
}

/** The contract fields of a node on `slot` of a backing node with this contract. */
export function nodeContract(
  contract: BackingContract,
  slot: number | undefined,
): { username?: string; connectionType: string; pythonPath: string; shellType?: string } {
  const username =
    contract.username !== undefined && contract.perSlotUsers && slot !== undefined
      ? slotUserName(contract.username, slot)
      : contract.username;
  return {
    ...(username === undefined ? {} : { username }),
    connectionType: contract.connectionType,
    pythonPath: contract.pythonPath,
    ...(contract.shellType === undefined ? {} : { shellType: contract.shellType }),
  };
}
