import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import {
  buildInventory,
  groupName,
  hostName,
  type Inventory,
  inventoryJson,
  inventoryKnownHosts,
  inventoryNodes,
  inventoryYaml,
  pythonInterpreter,
  Unsafe,
} from '../../cli/ansibleInventory.ts';
import { knownHostsText } from '../../client/openssh.ts';
import type { NodeRecord } from '../../shared/core/records.ts';

/**
 * The inventory builder as a pure function: node records in, Ansible's inventory out (host names,
 * connection variables, python-path, groups), and its YAML and JSON text, in which nothing a record
 * carries can add YAML, a template Ansible would run, or a terminal escape.
 */

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAX6KXqDdN6CVw710zrfJwiqCI16xI07DWIdiaUpjx42';
const FILES = { knownHosts: '/state/known_hosts.d/job', identity: '/state/client_ed25519' };

function node(over: Partial<NodeRecord> & { id: string }): NodeRecord {
  return {
    label: 'small-node',
    state: 'ready',
    host: '127.0.0.1',
    port: 40000,
    slot: 0,
    username: 'slot0',
    connectionType: 'ssh',
    pythonPath: 'auto',
    hostKeys: [KEY],
    backingNodeId: 'bn-1',
    ...over,
  };
}

/** The inventory with every Unsafe unwrapped to its text (what Ansible sees as values). */
function plain(value: unknown): unknown {
  if (value instanceof Unsafe) return value.text;
  if (Array.isArray(value)) return value.map(plain);
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  }
  return value;
}

/** YAML as Ansible reads it: `!unsafe` a tag on strings. */
const readYaml = (text: string) =>
  parse(text, {
    customTags: [{ tag: '!unsafe', resolve: (s: string) => ({ unsafe: s }) }],
  }) as unknown;
/** JSON as Ansible's JSON loader reads it: `{"__ansible_unsafe": s}` an unsafe string. */
const readJson = (text: string) =>
  JSON.parse(text, (_k, v) =>
    v !== null && typeof v === 'object' && '__ansible_unsafe' in v ? { unsafe: v.__ansible_unsafe } : v,
  ) as unknown;
/** The inventory as the two readers above return it: every Unsafe as `{ unsafe: text }`. */
function tagged(value: unknown): unknown {
  if (value instanceof Unsafe) return { unsafe: value.text };
  if (Array.isArray(value)) return value.map(tagged);
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, tagged(v)]));
  }
  return value;
}

// biome-ignore lint/complexity/useRegexLiterals: a literal would hold control characters, which noControlCharactersInRegex refuses
const RAW_UNSAFE = new RegExp(
  '[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]',
);

describe('buildInventory', () => {
  it("gives each ready node a host with Zuul's connection variables, and a group per label", () => {
    const inventory = buildInventory(
      'job',
      [
        node({ id: 'job/0', attributes: { zone: 'a' } }),
        node({ id: 'job/1', slot: 1, username: 'slot1', pythonPath: '/usr/bin/python3', shellType: 'bash' }),
      ],
      FILES,
    );
    expect(plain(inventory)).toEqual({
      all: {
        hosts: {
          'job-0': {
            ansible_host: '127.0.0.1',
            ansible_port: 40000,
            ansible_user: 'slot0',
            ansible_connection: 'ssh',
            ansible_python_interpreter: 'auto',
            ansible_host_key_checking: true,
            ansible_ssh_common_args:
              '-o StrictHostKeyChecking=yes -o UserKnownHostsFile=/state/known_hosts.d/job ' +
              '-o GlobalKnownHostsFile=/dev/null -o UpdateHostKeys=no -o CheckHostIP=no ' +
              '-o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o IdentitiesOnly=yes',
            ansible_ssh_private_key_file: '/state/client_ed25519',
            metastatic: {
              node_id: 'job/0',
              request_id: 'job',
              label: 'small-node',
              slot: 0,
              backing_node_id: 'bn-1',
              attributes: { zone: 'a' },
            },
          },
          'job-1': expect.objectContaining({
            ansible_user: 'slot1',
            ansible_python_interpreter: '/usr/bin/python3',
            ansible_shell_type: 'bash',
          }),
        },
        children: { small_node: { hosts: { 'job-0': null, 'job-1': null } } },
      },
    });
  });

  it('leaves out what a node does not record: no user, no shell type, no key file without an identity', () => {
    const { username: _u, shellType: _s, ...bare } = node({ id: 'job/0' });
    const vars = plain(buildInventory('job', [bare], { knownHosts: '/k' }).all.hosts['job-0']) as Record<
      string,
      unknown
    >;
    expect(Object.keys(vars)).not.toContain('ansible_user');
    expect(Object.keys(vars)).not.toContain('ansible_shell_type');
    expect(Object.keys(vars)).not.toContain('ansible_ssh_private_key_file');
    expect(vars.ansible_ssh_common_args).not.toContain('IdentitiesOnly');
  });

  it("maps python-path auto (Nodepool's default, or none) to Ansible's interpreter discovery", () => {
    expect(pythonInterpreter('auto')).toBe('auto');
    expect(pythonInterpreter(undefined)).toBe('auto');
    expect(pythonInterpreter(' ')).toBe('auto');
    expect(pythonInterpreter('/usr/bin/python3')).toBe('/usr/bin/python3');
    expect(pythonInterpreter('auto_silent')).toBe('auto_silent');
    const { pythonPath: _p, ...none } = node({ id: 'job/0' });
    const vars = plain(buildInventory('job', [none], FILES).all.hosts['job-0']) as Record<string, unknown>;
    expect(vars.ansible_python_interpreter).toBe('auto');
  });

  it('names hosts after node ids, as valid Ansible host names, unique, and groups after labels', () => {
    expect(hostName('job/0')).toBe('job-0');
    expect(hostName('ci:build.7/12')).toBe('ci_build.7-12');
    expect(hostName('[a],b!/0')).toBe('n_a__b_-0');
    expect(groupName('small-node')).toBe('small_node');
    expect(groupName('9lives')).toBe('label_9lives');
    expect(groupName('all')).toBe('label_all');
    const inventory = buildInventory(
      'r',
      [
        node({ id: 'r:1/0', label: 'a-b' }),
        node({ id: 'r_1/0', label: 'a.b' }),
        node({ id: 'r.1/0', label: 'a-b' }),
      ],
      FILES,
    );
    expect(Object.keys(inventory.all.hosts)).toEqual(['r_1-0', 'r_1-0_2', 'r.1-0']);
    expect(plain(inventory.all.children)).toEqual({
      a_b: { hosts: { 'r_1-0': null, 'r.1-0': null } },
      a_b_2: { hosts: { 'r_1-0_2': null } },
    });
    expect(plain((inventory.all.hosts['r_1-0_2'] as Record<string, unknown>).metastatic)).toMatchObject({
      node_id: 'r_1/0',
    });
  });

  it('quotes ssh options as one shell word each (Ansible splits them with shlex)', () => {
    const files = { knownHosts: `/tmp/it's a dir/known_hosts`, identity: '/k' };
    const vars = plain(buildInventory('job', [node({ id: 'job/0' })], files).all.hosts['job-0']) as Record<
      string,
      string
    >;
    const words = spawnSync('/bin/sh', ['-c', `printf '%s\\n' ${vars.ansible_ssh_common_args}`], {
      encoding: 'utf8',
    }).stdout.split('\n');
    expect(words).toContain(`UserKnownHostsFile=/tmp/it's a dir/known_hosts`);
    expect(words[0]).toBe('-o');
  });

  it('refuses a node that is not ready, has no host keys, or a host that is no address', () => {
    expect(() => buildInventory('job', [node({ id: 'job/0', state: 'pending' })], FILES)).toThrow(
      'node job/0 is pending, not ready',
    );
    expect(() => buildInventory('job', [node({ id: 'job/0', hostKeys: [] })], FILES)).toThrow(
      'records no host keys',
    );
    expect(() =>
      buildInventory('job', [node({ id: 'job/0', host: '1.2.3.4 -oProxyCommand=x' })], FILES),
    ).toThrow('is not an address or a host name');
    expect(() => buildInventory('job', [node({ id: 'job/0', host: '-G' })], FILES)).toThrow(
      'is not an address or a host name',
    );
  });

  it('refuses a connection type the pool does not hand out: a record saying local would run tasks here', () => {
    for (const connectionType of ['local', 'paramiko', 'winrm', 'ssh ', '']) {
      expect(
        () => buildInventory('job', [node({ id: 'job/0', connectionType })], FILES),
        connectionType,
      ).toThrow(/node job\/0 records the connection type .* metastatic nodes are ssh only/);
    }
    const { connectionType: _c, ...none } = node({ id: 'job/0' });
    for (const n of [none, node({ id: 'job/0', connectionType: 'ssh' })]) {
      const vars = plain(buildInventory('job', [n], FILES).all.hosts['job-0']) as Record<string, unknown>;
      expect(vars.ansible_connection).toBe('ssh');
      expect(vars.ansible_host_key_checking).toBe(true);
    }
  });
});

describe('inventory text', () => {
  const hostile = "{{ lookup('pipe', 'id') }}\u001b]0;title\u0007\u001b[2J\u202eevil\nnext: injected";
  const inventory: Inventory = buildInventory(
    'job',
    [
      node({
        id: 'job/0',
        label: 'small-node',
        attributes: {
          note: hostile,
          'key: with\nnewline\u001b[1m': [1, hostile, { deep: true }],
          n: 2.5,
          yes: 'a key YAML 1.1 would read as true',
          '1': 'a key that looks like a number',
        },
      }),
    ],
    FILES,
  );

  it('YAML: every string !unsafe and read back exactly; no raw control or direction character', () => {
    const text = inventoryYaml(inventory, 'inventory of request job');
    expect(text.startsWith('# inventory of request job\n')).toBe(true);
    expect(text).not.toMatch(RAW_UNSAFE);
    expect(text).toContain('ansible_python_interpreter: !unsafe "auto"');
    expect(text).toContain('"yes": !unsafe');
    expect(text).toContain('"1": !unsafe');
    expect(readYaml(text)).toEqual(tagged(inventory));
  });

  it('JSON: every string as {"__ansible_unsafe": ...} and read back exactly; no raw control character', () => {
    const text = inventoryJson(inventory);
    expect(text).not.toMatch(RAW_UNSAFE);
    expect(readJson(text)).toEqual(tagged(inventory));
  });
});

describe('inventoryNodes', () => {
  const ready = node({ id: 'job/0' });
  const released = node({ id: 'job/1', state: 'released', reason: 'released by cli' });

  it('waits for a request still being served, and refuses a failed one with its reason', () => {
    expect(inventoryNodes({ id: 'job', state: 'pending', nodes: [] }, false)).toEqual({
      kind: 'waiting',
      state: 'pending',
    });
    expect(() =>
      inventoryNodes({ id: 'job', state: 'failed', reason: 'label x is not configured', nodes: [] }, false),
    ).toThrow('request job failed: label x is not configured');
  });

  it('refuses a node set with a released node unless --ready-only, which leaves it out', () => {
    const request = { id: 'job', state: 'fulfilled', nodes: [ready, released] };
    expect(() => inventoryNodes(request, false)).toThrow(
      /job\/1 is released \(released by cli\).*--ready-only leaves them out/,
    );
    expect(inventoryNodes(request, true)).toEqual({ kind: 'nodes', ready: [ready], left: [released] });
    expect(() => inventoryNodes({ ...request, nodes: [released] }, true)).toThrow(
      'request job has no ready node: job/1 is released',
    );
  });
});

describe('known_hosts', () => {
  it('one line per host:port and key, [host]:port unless port 22; a key or host with more is refused', () => {
    expect(
      inventoryKnownHosts([node({ id: 'job/0' }), node({ id: 'job/1' }), node({ id: 'x/0', port: 22 })]),
    ).toBe(`[127.0.0.1]:40000 ${KEY}\n127.0.0.1 ${KEY}\n`);
    expect(() =>
      knownHostsText([{ host: '127.0.0.1', port: 1, hostKeys: [`${KEY}\n@cert-authority * x`] }]),
    ).toThrow('is not "<type> <base64>"');
    expect(() => knownHostsText([{ host: '* ', port: 1, hostKeys: [KEY] }])).toThrow('is not an address');
  });
});
