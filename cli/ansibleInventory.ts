import { Document, isScalar, visit } from 'yaml';
import { badHost, hostTrustOptions, knownHostsText } from '../client/openssh.ts';
import { type ConnectionType, DEFAULT_CONNECTION_TYPE } from '../shared/core/contract.ts';
import type { NodeRecord } from '../shared/core/records.ts';
import { CliError } from './errors.ts';
import { human, terminalJson, terminalText } from './terminal.ts';

/**
 * A request's ready nodes as an Ansible inventory, the way Zuul turns Nodepool's node records into one:
 * `ansible_host`, `ansible_port`, `ansible_user`, `ansible_connection`, `ansible_python_interpreter`
 * (python-path), `ansible_shell_type` (shell-type), and a known_hosts from the host keys that the ssh
 * connection is pointed at with strict checking. Pure: records in, an inventory object (and its text) out.
 *
 * Every string taken from a record (or a path) reaches Ansible marked unsafe (YAML `!unsafe`, JSON
 * `{"__ansible_unsafe": ...}`): Ansible templates inventory variables, so a label or attribute holding
 * `{{ lookup('pipe', ...) }}` would otherwise run on the controller. Keys are not templated.
 */

/** Where the inventory sends Ansible for trust and identity (absolute paths: Ansible runs elsewhere). */
export interface InventoryFiles {
  /** The known_hosts file written with the nodes' host keys (knownHostsText). */
  readonly knownHosts: string;
  /** The private key to log in with; absent: ssh's own choice (agent, ~/.ssh/id_*). */
  readonly identity?: string;
}

/** A string Ansible must take as data, never as a template. */
export class Unsafe {
  constructor(readonly text: string) {}
}

export type InventoryValue =
  | Unsafe
  | number
  | boolean
  | null
  | readonly InventoryValue[]
  | { readonly [key: string]: InventoryValue };

export interface Inventory {
  readonly all: {
    readonly hosts: Record<string, Record<string, InventoryValue>>;
    readonly children: Record<string, { readonly hosts: Record<string, null> }>;
  };
}

/** Nodepool's default python-path, which Ansible (2.8 and later) reads as "discover the interpreter". */
const AUTO = 'auto';

/**
 * `ansible_python_interpreter` for a node's python-path. Nodepool's default, `auto`, is Ansible's own
 * `auto` (interpreter discovery, as Zuul passes it); so is an absent one. A path (or another of Ansible's
 * discovery modes, `auto_silent`, `auto_legacy`...) is passed as it is.
 */
export function pythonInterpreter(pythonPath: string | undefined): string {
  return pythonPath === undefined || pythonPath.trim() === '' ? AUTO : pythonPath;
}

/**
 * A valid Ansible host name for a node id: `<request-id>/<index>` becomes `<request-id>-<index>`, and
 * any character but letters, digits, `.`, `_` and `-` becomes `_` (`:` would read as a port, `[`, `,`,
 * `!`, `&`, `*` as pattern syntax); a name not starting with a letter or digit gets `n` in front.
 */
export function hostName(nodeId: string): string {
  const name = nodeId.replace(/\//g, '-').replace(/[^A-Za-z0-9._-]/g, '_');
  return /^[A-Za-z0-9]/.test(name) ? name : `n${name}`;
}

const RESERVED_GROUPS = new Set(['all', 'ungrouped']);

/**
 * A valid Ansible group name for a label: letters, digits and `_` only (Ansible warns about others and
 * patterns cannot name them), not starting with a digit, not `all` or `ungrouped`.
 */
export function groupName(label: string): string {
  const name = label.replace(/[^A-Za-z0-9_]/g, '_');
  return /^[A-Za-z_]/.test(name) && !RESERVED_GROUPS.has(name) ? name : `label_${name}`;
}

/** `name`, or `name_2`, `name_3`... the first not in `taken`; recorded in `taken`. */
function unique(name: string, taken: Set<string>): string {
  let out = name;
  for (let n = 2; taken.has(out); n++) out = `${name}_${n}`;
  taken.add(out);
  return out;
}

/** One shell word as Python's shlex.split (which Ansible applies to ansible_ssh_common_args) reads it. */
function shellWord(word: string): string {
  return /^[A-Za-z0-9@%+=:,./_-]+$/.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

/** Deep-copies attributes as inventory values: every string marked unsafe; what JSON cannot hold dropped. */
function dataOf(value: unknown): InventoryValue {
  if (typeof value === 'string') return new Unsafe(value);
  if (typeof value === 'number') return Number.isFinite(value) ? value : null;
  if (typeof value === 'boolean' || value === null) return value;
  if (Array.isArray(value)) return value.map(dataOf);
  if (typeof value === 'object' && value !== undefined) {
    const out: Record<string, InventoryValue> = {};
    for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
      if (v !== undefined) out[k] = dataOf(v);
    }
    return out;
  }
  return null;
}

/**
 * The `ansible_connection` of each connection type the pool hands out (core/contract.ts), and only those:
 * a record saying `local` would drop the host-key options and run the tasks on the controller.
 */
const ANSIBLE_CONNECTION: Readonly<Record<ConnectionType, string>> = { ssh: 'ssh' };

/** Why a ready node cannot be put in an inventory, or undefined. */
function unusable(node: NodeRecord): string | undefined {
  if (!node.host || node.port === undefined) return `node ${node.id} records no host and port`;
  const host = badHost(node.host);
  if (host) return `node ${node.id}: ${host}`;
  const connection = node.connectionType ?? DEFAULT_CONNECTION_TYPE;
  if (!Object.hasOwn(ANSIBLE_CONNECTION, connection)) {
    return `node ${node.id} records the connection type ${JSON.stringify(connection)}: metastatic nodes are ssh only`;
  }
  if (!node.hostKeys?.length) {
    return `node ${node.id} records no host keys: its host cannot be verified`;
  }
  return undefined;
}

/**
 * The inventory of `nodes` (each `ready`, with host, port and host keys: refused with the reason
 * otherwise): one host per node, named hostName(node id) (made unique), its connection variables and a
 * `metastatic` variable (node id, request id, label, slot, backing node, attributes); one group per
 * label (groupName). Connection variables are per host, not under `all.vars`: an inventory merged with
 * others (`-i a -i b`) must not hand its trust settings to their hosts.
 */
export function buildInventory(
  requestId: string,
  nodes: readonly NodeRecord[],
  files: InventoryFiles,
): Inventory {
  const hosts: Record<string, Record<string, InventoryValue>> = {};
  const children: Record<string, { hosts: Record<string, null> }> = {};
  const hostNames = new Set<string>();
  const groupOfLabel = new Map<string, string>();
  const groupNames = new Set<string>();
  for (const node of nodes) {
    if (node.state !== 'ready') throw new CliError(`node ${node.id} is ${node.state}, not ready`);
    const why = unusable(node);
    if (why) throw new CliError(why);
    const connection = ANSIBLE_CONNECTION[(node.connectionType ?? DEFAULT_CONNECTION_TYPE) as ConnectionType];
    const name = unique(hostName(node.id), hostNames);
    const vars: Record<string, InventoryValue> = {
      ansible_host: new Unsafe(node.host as string),
      ansible_port: node.port as number,
    };
    if (node.username !== undefined) vars.ansible_user = new Unsafe(node.username);
    vars.ansible_connection = new Unsafe(connection);
    vars.ansible_python_interpreter = new Unsafe(pythonInterpreter(node.pythonPath));
    if (node.shellType !== undefined) vars.ansible_shell_type = new Unsafe(node.shellType);
    if (connection === 'ssh') {
      // The variable wins over ansible.cfg and ANSIBLE_HOST_KEY_CHECKING=False: with checking off,
      // Ansible puts StrictHostKeyChecking=no before these options, and ssh takes the first it reads.
      vars.ansible_host_key_checking = true;
      const options = [
        ...hostTrustOptions(files.knownHosts),
        ...(files.identity === undefined ? [] : ['-o', 'IdentitiesOnly=yes']),
      ];
      vars.ansible_ssh_common_args = new Unsafe(options.map(shellWord).join(' '));
      if (files.identity !== undefined) vars.ansible_ssh_private_key_file = new Unsafe(files.identity);
    }
    vars.metastatic = dataOf({
      node_id: node.id,
      request_id: requestId,
      label: node.label,
      slot: node.slot ?? null,
      backing_node_id: node.backingNodeId ?? null,
      attributes: node.attributes ?? {},
    });
    hosts[name] = vars;
    let group = groupOfLabel.get(node.label);
    if (group === undefined) {
      group = unique(groupName(node.label), groupNames);
      groupOfLabel.set(node.label, group);
    }
    children[group] ??= { hosts: {} };
    (children[group] as { hosts: Record<string, null> }).hosts[name] = null;
  }
  return { all: { hosts, children } };
}

/** The known_hosts text for the nodes of an inventory (each host:port's recorded keys, each line once). */
export function inventoryKnownHosts(nodes: readonly NodeRecord[]): string {
  return knownHostsText(
    nodes.map((n) => ({ host: n.host ?? '', port: n.port ?? 22, hostKeys: n.hostKeys ?? [] })),
  );
}

/** Plain JSON values, unsafe strings as `{"__ansible_unsafe": text}` (read so by Ansible's JSON loader). */
function toJsonValue(value: InventoryValue): unknown {
  if (value instanceof Unsafe) return { __ansible_unsafe: value.text };
  if (Array.isArray(value)) return value.map(toJsonValue);
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value as Record<string, InventoryValue>).map(([k, v]) => [k, toJsonValue(v)]),
    );
  }
  return value;
}

/** The inventory as JSON text (Ansible's yaml inventory plugin reads `.json` files), terminal-safe. */
export function inventoryJson(inventory: Inventory): string {
  return `${terminalJson(JSON.stringify(toJsonValue(inventory as unknown as InventoryValue), null, 2))}\n`;
}

const UNSAFE_TAG = '!unsafe';
/** A key YAML reads back as the same string when written plain (no quoting, no tag, no number). */
const PLAIN_KEY = /^[A-Za-z_][A-Za-z0-9_.-]*$/;
/** Plain words YAML 1.1 (PyYAML, which Ansible uses) reads as a boolean or null, not as a string. */
const YAML11_WORDS = /^(y|n|yes|no|true|false|on|off|null)$/i;

/**
 * The inventory as YAML text: unsafe strings as `!unsafe "..."`, every string and every key that is not
 * a plain name double-quoted, so that the terminal-safe pass may write any control, C1 or direction
 * character as a `\xHH` / `\uHHHH` escape, which a double-quoted YAML scalar reads back as that character.
 */
export function inventoryYaml(inventory: Inventory, comment?: string): string {
  const doc = new Document(toYamlValue(inventory as unknown as InventoryValue));
  visit(doc, {
    Pair(_key, pair) {
      const key = pair.key;
      if (
        isScalar(key) &&
        typeof key.value === 'string' &&
        (!PLAIN_KEY.test(key.value) || YAML11_WORDS.test(key.value))
      ) {
        key.type = 'QUOTE_DOUBLE';
      }
    },
    Scalar(key, node) {
      if (key !== 'key' && typeof node.value === 'string') node.type = 'QUOTE_DOUBLE';
    },
  });
  if (comment !== undefined) doc.commentBefore = ` ${comment.replace(/\n/g, ' ')}`;
  return terminalText(
    doc.toString({ lineWidth: 0, doubleQuotedMinMultiLineLength: Number.MAX_SAFE_INTEGER }),
  );
}

/** Unsafe strings become scalar nodes with the `!unsafe` tag; the rest plain values. */
function toYamlValue(value: InventoryValue): unknown {
  if (value instanceof Unsafe) {
    const doc = new Document();
    const node = doc.createNode(value.text);
    node.tag = UNSAFE_TAG;
    return node;
  }
  if (Array.isArray(value)) return value.map(toYamlValue);
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value as Record<string, InventoryValue>).map(([k, v]) => [k, toYamlValue(v)]),
    );
  }
  return value;
}

/** A request's state as far as an inventory is concerned. */
export type InventoryNodes =
  | { readonly kind: 'waiting'; readonly state: string }
  | { readonly kind: 'nodes'; readonly ready: readonly NodeRecord[]; readonly left: readonly NodeRecord[] };

const nodeState = (n: NodeRecord) => human`${n.id} is ${n.state}${n.reason ? ` (${n.reason})` : ''}`;

/**
 * The nodes of `request` an inventory holds: its ready ones once it is fulfilled (`waiting` until then).
 * Refused with the reason: a failed request, one with no ready node left, and, unless `readyOnly`, one
 * with a node released or failed since (an inventory of part of a node set is not the node set a
 * playbook was written for); with `readyOnly` those are listed in `left`.
 */
export function inventoryNodes(
  request: { id: string; state: string; reason?: string; nodes: readonly NodeRecord[] },
  readyOnly: boolean,
): InventoryNodes {
  if (request.state === 'failed') {
    const why = request.reason ? `: ${request.reason}` : '';
    throw new CliError(human`request ${request.id} failed${why}; it has no nodes for an inventory`);
  }
  if (request.state !== 'fulfilled') return { kind: 'waiting', state: request.state };
  const ready = request.nodes.filter((n) => n.state === 'ready');
  const left = request.nodes.filter((n) => n.state !== 'ready');
  if (ready.length === 0) {
    throw new CliError(`request ${request.id} has no ready node: ${left.map(nodeState).join('; ')}`);
  }
  if (left.length > 0 && !readyOnly) {
    throw new CliError(
      `request ${request.id} has nodes that are not ready: ${left.map(nodeState).join('; ')}. ` +
        'An inventory of part of a node set is refused; --ready-only leaves them out',
    );
  }
  return { kind: 'nodes', ready, left };
}
