import { randomBytes } from 'node:crypto';
import { chmod, mkdir, rename, unlink, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { checkIdentity } from '../../client/openssh.ts';
import { requestIdPattern } from '../../shared/core/ids.ts';
import type { NodeRecord } from '../../shared/core/records.ts';
import { clientKeyPath } from '../../shared/runtime/clientKey.ts';
import {
  buildInventory,
  inventoryJson,
  inventoryKnownHosts,
  inventoryNodes,
  inventoryYaml,
} from '../ansibleInventory.ts';
import { connect, type PoolClient, type Target } from '../client.ts';
import { CliError } from '../errors.ts';
import { sleep } from '../output.ts';
import { human, terminalText } from '../terminal.ts';

export interface InventoryOptions {
  /** Print JSON instead of YAML. */
  readonly json?: boolean;
  /** Where to write the known_hosts file; default (embedded pool): `<state-dir>/known_hosts.d/<request-id>`. */
  readonly knownHosts?: string;
  /** Private key for Ansible to log in with; default (embedded pool): the dev client key. */
  readonly identity?: string;
  /** Seconds to wait for a request still being served. */
  readonly timeout: number;
  /** Leave released or failed nodes out instead of refusing. */
  readonly readyOnly?: boolean;
}

/** Where the embedded pool's inventories keep their known_hosts files (inside the private state dir). */
export const KNOWN_HOSTS_DIR = 'known_hosts.d';

const POLL_MS = 500;

/**
 * The request once it is fulfilled, waiting (progress on stderr) while it is still being served, up to
 * `timeoutSeconds`; an unknown request is refused.
 */
async function servedRequest(
  client: PoolClient,
  requestId: string,
  timeoutSeconds: number,
  readyOnly: boolean,
  progress: (text: string) => void,
): Promise<{ ready: readonly NodeRecord[]; left: readonly NodeRecord[] }> {
  const deadline = Date.now() + timeoutSeconds * 1000;
  let said = '';
  const endLine = () => {
    if (said) progress('\n');
  };
  for (;;) {
    const request = await client.store.getRequest(requestId);
    if (!request) {
      endLine();
      throw new CliError(`there is no request ${requestId}`);
    }
    let nodes: ReturnType<typeof inventoryNodes>;
    try {
      nodes = inventoryNodes(request, readyOnly);
    } catch (err) {
      endLine();
      throw err;
    }
    if (nodes.kind === 'nodes') {
      endLine();
      return nodes;
    }
    if (Date.now() >= deadline) {
      endLine();
      throw new CliError(
        `request ${requestId} is still ${nodes.state} after ${timeoutSeconds} s (--timeout)`,
      );
    }
    if (said !== nodes.state) {
      progress(`${said ? '\n' : ''}waiting for request ${requestId} (${nodes.state})`);
      said = nodes.state;
    } else progress('.');
    await sleep(POLL_MS);
  }
}

/**
 * Writes `text` to `file` readable by its owner only (0600), whole: a private temporary file beside it,
 * then renamed over it, so nobody ever reads a half-written file and a symbolic link at `file` is
 * replaced, never followed. `makeDir`: the directory is created (0700) if missing.
 */
async function writePrivateFile(file: string, text: string, makeDir: boolean): Promise<void> {
  if (makeDir) await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    await writeFile(tmp, text, { mode: 0o600, flag: 'wx' });
    await chmod(tmp, 0o600); // the umask may have taken bits away, never added: still, be exact
    await rename(tmp, file);
  } catch (err) {
    await unlink(tmp).catch(() => {});
    throw new CliError(`cannot write ${file}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`);
  }
}

/** An inventory as text, and what it says on the side (nodes left out, the known_hosts file written). */
export interface InventoryText {
  readonly text: string;
  readonly knownHosts: string;
  readonly notes: readonly string[];
}

/**
 * The inventory of `requestId`'s ready nodes as text (YAML, or JSON with `json`), once the request is
 * fulfilled, after writing the known_hosts file it points ssh at (0600). `progress` gets the waiting
 * messages (the command sends them to stderr). Refusals are CliErrors with the reason.
 */
export async function inventoryText(
  target: Target,
  requestId: string,
  opts: InventoryOptions,
  progress: (text: string) => void,
): Promise<InventoryText> {
  if (!requestIdPattern.test(requestId)) {
    throw new CliError(`"${requestId}" is not a request id`, 2);
  }
  const knownHostsOption = opts.knownHosts;
  if (knownHostsOption === undefined && target.stack) {
    throw new CliError('against a stack, say where to write the known_hosts file: --known-hosts FILE', 2);
  }
  const knownHosts = resolve(knownHostsOption ?? join(target.stateDir, KNOWN_HOSTS_DIR, requestId));
  const identityOption = opts.identity ?? (target.stack ? undefined : clientKeyPath(target.stateDir));
  const identity = identityOption === undefined ? undefined : resolve(identityOption);

  // Connected first: without a running pool, that is the error to see, not a missing client key.
  const client = await connect(target);
  let served: { ready: readonly NodeRecord[]; left: readonly NodeRecord[] };
  try {
    if (identity !== undefined) await checkIdentity(identity);
    served = await servedRequest(client, requestId, opts.timeout, opts.readyOnly === true, progress);
  } finally {
    client.close();
  }
  const { ready, left } = served;
  const built = buildInventory(requestId, ready, { knownHosts, identity });
  // The default file is in the state dir (private); a file named by the user is written where it says.
  await writePrivateFile(knownHosts, inventoryKnownHosts(ready), knownHostsOption === undefined);
  const notes = left.map(
    (node) => human`left out: node ${node.id} is ${node.state}${node.reason ? ` (${node.reason})` : ''}`,
  );
  const text = opts.json
    ? inventoryJson(built)
    : inventoryYaml(built, `metastatic inventory of request ${requestId}; known_hosts: ${knownHosts}`);
  return { text, knownHosts, notes };
}

/**
 * `metastatic inventory REQUEST-ID`: prints an Ansible inventory of the request's ready nodes (YAML, or
 * JSON with --json) and writes the known_hosts file it points ssh at (0600), from the nodes' recorded
 * host keys; waiting and notes on stderr. Against the embedded pool the inventory logs in with the dev
 * client key.
 */
export async function inventory(target: Target, requestId: string, opts: InventoryOptions): Promise<void> {
  const stderr = (text: string) => process.stderr.write(terminalText(text));
  const { text, notes } = await inventoryText(target, requestId, opts, stderr);
  for (const note of notes) stderr(`${note}\n`);
  process.stdout.write(text);
}
