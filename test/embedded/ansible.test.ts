import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import ssh2 from 'ssh2';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connect, type PoolClient } from '../../cli/client.ts';
import { type InventoryOptions, inventoryText } from '../../cli/commands/inventory.ts';
import { CliError } from '../../cli/errors.ts';
import { newEd25519PrivateKey } from '../../shared/providers/local/hostKey.ts';
import { ansibleEnv, describeWithAnsible } from '../../testkit/ansible.ts';
import { startDev, stopDev, until } from '../../testkit/processes.ts';

/**
 * Zuul's way in: `metastatic inventory` for a request of two nodes on one `metastatic dev`, and real
 * ansible-core playbooks through it, over OpenSSH with ControlMaster, sftp, `-tt` and python modules, as
 * Ansible runs them by default, with host-key checking on: facts gathered, a file copied byte for byte
 * into each slot's directory, commands run, a failing task failing the play (and naming its host), and a
 * known_hosts with another key refusing the hosts. Then the requests an inventory must refuse.
 */
const root = resolve(import.meta.dirname, '..', '..');
const bin = join(root, 'bin', 'metastatic.mjs');

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(
  file: string,
  args: readonly string[],
  env?: NodeJS.ProcessEnv,
  timeoutMs = 90_000,
): Promise<Run> {
  return new Promise((done, fail) => {
    const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'], env: env ?? process.env });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => {
      stdout += d;
    });
    child.stderr.on('data', (d) => {
      stderr += d;
    });
    child.on('error', fail);
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
  });
}

interface Node {
  id: string;
  slot: number;
  host: string;
  port: number;
  attributes: { resourceId: string };
}

/** A playbook: facts, a copy into the home directory, a command; then a play in which slot 1 fails. */
const PLAYBOOK = `
- name: use the nodes
  hosts: small_node
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: copy the payload
      ansible.builtin.copy:
        src: "{{ payload }}"
        dest: "~/payload.bin"
        mode: "0600"
    - name: report facts and the node
      ansible.builtin.shell: >-
        echo "{{ ansible_facts.system }} {{ ansible_facts.python.version.major }}
        {{ metastatic.node_id }} $METASTATIC_NODE_ID {{ metastatic.attributes.note | length }}" > facts.txt
- name: a task that fails on one node
  hosts: all
  gather_facts: false
  tasks:
    - name: fail on slot 1
      ansible.builtin.command: sh -c 'test "$METASTATIC_SLOT" != 1'
`;

const PING = `
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.ping:
`;

describeWithAnsible('Ansible playbooks on the nodes of metastatic dev', { timeout: 120_000 }, () => {
  let stateDir: string;
  let work: string;
  let dev: ChildProcess;
  let devLog = () => '';
  let nodes: Node[];
  let templated: string;
  let client: PoolClient | undefined;

  const cli = (args: string[]) => run(process.execPath, [bin, '--state-dir', stateDir, ...args]);
  const slotDir = (n: Node) => join(stateDir, 'local', `${n.attributes.resourceId}.work`, `slot${n.slot}`);
  const node = (slot: number): Node => {
    const n = nodes.find((x) => x.slot === slot);
    if (!n) throw new Error(`no node on slot ${slot}`);
    return n;
  };

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'metastatic-ansible-'));
    work = await mkdtemp(join(tmpdir(), 'metastatic-ansible-work-'));
    templated = join(work, 'templated');
    // An attribute Ansible would run, were it templated; and a label whose backing node never boots
    // while the test runs (a request for it stays pending).
    const config = join(work, 'pool.yaml');
    await writeFile(
      config,
      `providers:
  - name: local
    driver: local
    pools:
      - name: main
        labels:
          - name: large-node
            boot-delay: 0.2
          - name: slow-large
            boot-delay: 600
  - name: meta
    driver: metastatic
    pools:
      - name: main
        node-attributes:
          note: "{{ lookup('pipe', 'touch ${templated}') }}"
        labels:
          - name: small-node
            backing-label: large-node
            max-parallel-jobs: 2
          - name: slow-node
            backing-label: slow-large
`,
    );
    // The nodes' commands get a login's PATH whatever dev's is (nodeSlots.ts slotEnv), so Ansible's
    // interpreter discovery finds the system Python there, not the test runner's shims (pyenv).
    const started = await startDev(bin, stateDir, ['-c', config]);
    dev = started.process;
    devLog = started.log;
    // The requests are sent from this process (as the CLI's `request` would send them): a CLI start
    // costs a second of CPU, and the CLI is what the tests below run.
    const pool = await connect({ stateDir });
    client = pool;
    await pool.send({ kind: 'request', id: 'job', labels: ['small-node', 'small-node'] });
    await pool.send({ kind: 'request', id: 'slow', labels: ['slow-node'] });
    const job = await until(
      'request job to be fulfilled',
      async () => {
        const r = await pool.store.getRequest('job');
        if (r?.state === 'failed') throw new Error(`request job failed: ${r.reason}\n${devLog()}`);
        return r?.state === 'fulfilled' ? r : undefined;
      },
      60_000,
    );
    nodes = job.nodes.map((n) => ({
      id: n.id,
      slot: n.slot ?? -1,
      host: n.host ?? '',
      port: n.port ?? 0,
      attributes: n.attributes as { resourceId: string },
    }));
  });

  afterAll(async () => {
    client?.close();
    await stopDev(dev);
    await rm(stateDir, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
  });

  it('runs a playbook: facts, an exact copy into each slot, commands; a failing task fails the play', async () => {
    const inventory = await cli(['inventory', 'job']);
    expect(inventory.code, inventory.stderr).toBe(0);
    const knownHosts = join(stateDir, 'known_hosts.d', 'job');
    expect((await stat(knownHosts)).mode & 0o777).toBe(0o600);
    expect(inventory.stdout).toContain(`UserKnownHostsFile=${knownHosts}`);
    await writeFile(join(work, 'inventory.yaml'), inventory.stdout);
    await writeFile(join(work, 'site.yaml'), PLAYBOOK);
    const payload = Buffer.concat([Buffer.from([0, 255, 10, 13]), randomBytes(64 * 1024)]);
    await writeFile(join(work, 'payload.bin'), payload);

    const play = await run(
      'ansible-playbook',
      [
        '-i',
        join(work, 'inventory.yaml'),
        join(work, 'site.yaml'),
        '-e',
        `payload=${join(work, 'payload.bin')}`,
      ],
      ansibleEnv(work),
    );
    const said = `${play.stdout}\n${play.stderr}`;
    // 2: a host failed (4 would be unreachable). The failing host is named; the other went on.
    expect(play.code, said).toBe(2);
    expect(play.stdout).toMatch(/fatal: \[job-1\]: FAILED!/);
    expect(play.stdout).toMatch(/job-0\s+: ok=4 .* failed=0/);
    expect(play.stdout).toMatch(/job-1\s+: ok=3 .* failed=1/);
    for (const n of nodes) {
      const dir = slotDir(n);
      expect((await readFile(join(dir, 'payload.bin'))).equals(payload), n.id).toBe(true);
      // Python's discovered interpreter ran the modules: facts came back and were used.
      const note = `{{ lookup('pipe', 'touch ${templated}') }}`;
      expect((await readFile(join(dir, 'facts.txt'), 'utf8')).trim()).toBe(
        `Linux 3 ${n.id} ${n.id} ${note.length}`,
      );
      // Ansible's own files stayed in the slot's directory; none under a directory called "~slot<N>".
      expect(existsSync(join(dir, '.ansible'))).toBe(true);
    }
    expect(existsSync(templated), 'an attribute was templated').toBe(false);
  });

  it('refuses the hosts when the known_hosts holds another key (JSON inventory, host-key checking on)', async () => {
    const knownHosts = join(work, 'kh', 'known_hosts');
    await mkdir(join(work, 'kh'), { mode: 0o700 });
    const inventory = await cli(['inventory', 'job', '--json', '--known-hosts', knownHosts]);
    expect(inventory.code, inventory.stderr).toBe(0);
    expect((await stat(knownHosts)).mode & 0o777).toBe(0o600);
    const n = node(0);
    expect(await readFile(knownHosts, 'utf8')).toMatch(`[${n.host}]:${n.port} ssh-ed25519 `);
    await writeFile(join(work, 'inventory.json'), inventory.stdout);
    await writeFile(join(work, 'ping.yaml'), PING);
    // The first test proved these hosts answer with the right key; here a known_hosts with another.
    const other = ssh2.utils.parseKey(newEd25519PrivateKey());
    if (other instanceof Error) throw other;
    await writeFile(
      knownHosts,
      `[${n.host}]:${n.port} ssh-ed25519 ${other.getPublicSSH().toString('base64')}\n`,
    );
    // A control directory of its own: a connection the first test left open would skip the key check.
    const refused = await run(
      'ansible-playbook',
      ['-i', join(work, 'inventory.json'), join(work, 'ping.yaml')],
      ansibleEnv(work, join(work, 'cp-wrong')),
    );
    expect(refused.code, refused.stdout + refused.stderr).toBe(4); // every host unreachable
    expect(refused.stdout).toMatch(/UNREACHABLE!/);
    expect(refused.stdout).toMatch(/REMOTE HOST IDENTIFICATION HAS CHANGED|Host key verification failed/);
  });

  it('refuses an unknown request, one still pending after --timeout, and a node set missing a node', async () => {
    // In this process (the command's own function), not through the CLI: each CLI start costs a second
    // of CPU, and what is checked here is the reading of the request, not the printing.
    const target = { stateDir };
    const opts = { timeout: 1 };
    const refusal = (requestId: string, o: Partial<InventoryOptions> = {}, progress = (_: string) => {}) =>
      inventoryText(target, requestId, { ...opts, ...o }, progress).then(
        () => 'no refusal',
        (err: unknown) => (err instanceof CliError ? `${err.exitCode}: ${err.message}` : String(err)),
      );
    let waited = '';
    const [unknown, pending] = await Promise.all([
      refusal('no-such-request'),
      refusal('slow', {}, (text) => {
        waited += text;
      }),
    ]);
    expect(unknown).toBe('1: there is no request no-such-request');
    expect(pending).toMatch(/^1: request slow is still (requested|pending) after 1 s \(--timeout\)$/);
    expect(waited).toMatch(/^waiting for request slow \((requested|pending)\)/);

    const pool = client;
    if (!pool) throw new Error('no pool client');
    await pool.send({ kind: 'release', nodeId: node(1).id });
    await until('node 1 to be released', async () =>
      (await pool.store.getRequest('job'))?.nodes.some((n) => n.id === node(1).id && n.state === 'released')
        ? true
        : undefined,
    );
    expect(await refusal('job')).toMatch(
      new RegExp(`^1: request job has nodes that are not ready: ${node(1).id} is released.*--ready-only`),
    );
    const readyOnly = await inventoryText(target, 'job', { ...opts, json: true, readyOnly: true }, () => {});
    expect(Object.keys(JSON.parse(readyOnly.text).all.hosts)).toEqual(['job-0']);
    expect(readyOnly.notes).toEqual([expect.stringMatching(`^left out: node ${node(1).id} is released`)]);
  });
});
