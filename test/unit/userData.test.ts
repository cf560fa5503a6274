import { execFileSync } from 'node:child_process';
import { gunzipSync } from 'node:zlib';
import { beforeAll, describe, expect, it } from 'vitest';
import { nodeContract } from '../../shared/core/contract.ts';
import { launchUserData } from '../../shared/providers/aws/runInstancesRequest.ts';
import type { AwsLabelSettings } from '../../shared/providers/aws/settings.ts';
import {
  composeUserData,
  MAX_USERDATA_BYTES,
  poolCloudConfig,
  userDataBytes,
  userDataType,
} from '../../shared/providers/aws/userData.ts';
import { SLOT_PROGRAM } from '../../shared/providers/slot/slotProgram.ts';
import { ED25519_KEY, RSA_KEY } from '../../testkit/sshKeys.ts';

const MERGE = 'merge_how: "list(append)+dict(no_replace,recurse_list)+str()"';

type ReadPart = { type: string; payload: string; yaml?: unknown };

/**
 * User data as cloud-init reads it: Python's email parser (cloud-init's user_data.convert_string and
 * util.fully_decoded_payload), each part's type and decoded payload, every cloud-config part's YAML
 * loaded with yaml.safe_load. One python3 run for all the texts (it starts slowly); undefined where
 * python3 with PyYAML is not installed, and then only the exact texts are checked.
 */
function readAsCloudInit(texts: readonly string[]): ReadPart[][] | undefined {
  const script = `
import email, json, sys, yaml
out = []
for text in json.load(sys.stdin):
    parts = []
    for part in email.message_from_string(text).walk():
        if part.get_content_maintype() == 'multipart':
            continue
        payload = part.get_payload(decode=True).decode(part.get_content_charset() or 'utf-8', 'surrogateescape')
        entry = {'type': part.get_content_type(), 'payload': payload}
        if entry['type'] == 'text/cloud-config':
            entry['yaml'] = yaml.safe_load(payload)
        parts.append(entry)
    out.append(parts)
print(json.dumps(out))
`;
  try {
    const out = execFileSync('python3', ['-c', script], { input: JSON.stringify(texts), encoding: 'utf8' });
    return JSON.parse(out);
  } catch (err) {
    if (/No module named 'yaml'|ENOENT/.test(String((err as Error).message))) return undefined;
    throw err;
  }
}

const SCRIPT = '#!/bin/bash\nset -e\necho "préparé" > /etc/motd\n';
const OWN_CLOUD_CONFIG = '#cloud-config\npackages: [git]\nruncmd:\n  - echo own\n';
const OWN_MIME = [
  'Content-Type: multipart/mixed; boundary="inner"',
  'MIME-Version: 1.0',
  '',
  '--inner',
  'Content-Type: text/x-shellscript',
  '',
  '#!/bin/sh',
  'echo inner',
  '--inner--',
  '',
].join('\n');
const withScript = composeUserData({ own: SCRIPT, authorizedKeys: [ED25519_KEY] }) as string;
const withCloudConfig = composeUserData({ own: OWN_CLOUD_CONFIG, authorizedKeys: [ED25519_KEY] }) as string;
const withMime = composeUserData({ own: OWN_MIME, authorizedKeys: [ED25519_KEY] }) as string;
const perSlot = composeUserData({
  authorizedKeys: [ED25519_KEY],
  slotUsers: { username: 'zuul', slots: 3 },
}) as string;

let read: ReadPart[][] | undefined;
beforeAll(() => {
  read = readAsCloudInit([
    withScript,
    withCloudConfig,
    withMime,
    `Content-Type: text/cloud-config\nMIME-Version: 1.0\n\n${perSlot}`,
  ]);
}, 30_000);

describe("the user data an aws pool's instances are launched with", () => {
  it("is the label's own, unchanged, when the pool puts nothing on its instances", () => {
    expect(composeUserData({ authorizedKeys: [] })).toBeUndefined();
    expect(composeUserData({ own: '#!/bin/sh\necho hi\n', authorizedKeys: [] })).toBe('#!/bin/sh\necho hi\n');
  });

  it('is one #cloud-config giving the keys to the image default user when the label has none of its own', () => {
    expect(composeUserData({ authorizedKeys: [ED25519_KEY, RSA_KEY] })).toBe(
      [
        '#cloud-config',
        "# metastatic: the backing pool's authorized-keys (and per-slot users), added to the label's own user data",
        MERGE,
        'ssh_authorized_keys:',
        `  - ${JSON.stringify(ED25519_KEY)}`,
        `  - ${JSON.stringify(RSA_KEY)}`,
        '',
      ].join('\n'),
    );
  });

  it("combines a label's shell script with ours as MIME multipart/mixed: the script as text/x-shellscript, then our cloud-config", () => {
    const text = withScript;
    const boundary = /^Content-Type: multipart\/mixed; boundary="([^"]+)"\nMIME-Version: 1\.0\n\n/.exec(
      text,
    )?.[1];
    expect(boundary).toMatch(/^metastatic-[0-9a-f]{32}$/);
    // Not ASCII: UTF-8 in base64, as cloud-init's make-mime writes it (8bit would reach it mangled).
    const base64 = (
      Buffer.from(SCRIPT, 'utf8')
        .toString('base64')
        .match(/.{1,76}/g) ?? []
    ).join('\n');
    expect(text).toBe(
      [
        `Content-Type: multipart/mixed; boundary="${boundary}"`,
        'MIME-Version: 1.0',
        '',
        `--${boundary}`,
        'Content-Type: text/x-shellscript; charset="utf-8"',
        'MIME-Version: 1.0',
        'Content-Transfer-Encoding: base64',
        'Content-Disposition: attachment; filename="userdata"',
        '',
        base64,
        `--${boundary}`,
        'Content-Type: text/cloud-config; charset="us-ascii"',
        'MIME-Version: 1.0',
        'Content-Transfer-Encoding: 7bit',
        'Content-Disposition: attachment; filename="metastatic-cloud-config"',
        '',
        poolCloudConfig([ED25519_KEY]),
        `--${boundary}--`,
        '',
      ].join('\n'),
    );
    if (read) {
      const parts = read[0] ?? [];
      expect(parts.map((p) => p.type)).toEqual(['text/x-shellscript', 'text/cloud-config']);
      expect(parts[0]?.payload).toBe(SCRIPT);
      expect(parts[1]?.yaml).toEqual({
        merge_how: 'list(append)+dict(no_replace,recurse_list)+str()',
        ssh_authorized_keys: [ED25519_KEY],
      });
    }
  });

  it("puts ours after a label's own cloud-config, which cloud-init then appends to (merge_how) instead of replacing", () => {
    const text = withCloudConfig;
    expect(text.indexOf('Content-Type: text/cloud-config; charset="us-ascii"')).toBeGreaterThan(0);
    expect(text.indexOf(OWN_CLOUD_CONFIG)).toBeGreaterThan(0);
    expect(text.indexOf(OWN_CLOUD_CONFIG)).toBeLessThan(text.indexOf(MERGE));
    if (read) {
      const parts = read[1] ?? [];
      expect(parts.map((p) => p.type)).toEqual(['text/cloud-config', 'text/cloud-config']);
      expect(parts[0]?.yaml).toEqual({ packages: ['git'], runcmd: ['echo own'] });
      expect(parts[1]?.yaml).toMatchObject({ ssh_authorized_keys: [ED25519_KEY] });
    }
  });

  it('nests a label user data that is a MIME message already, as cloud-init walks nested multiparts', () => {
    expect(withMime).toContain(`\n${OWN_MIME}`);
    if (read) {
      const parts = read[2] ?? [];
      expect(parts.map((p) => p.type)).toEqual(['text/x-shellscript', 'text/cloud-config']);
      expect(parts[0]?.payload.trim()).toBe('#!/bin/sh\necho inner');
    }
  });

  it("reads a label's part type from its first line as cloud-init does", () => {
    expect(
      [
        '#!/usr/bin/env python3',
        '  #cloud-config',
        '#cloud-config-archive',
        '#cloud-boothook',
        '#include https://x',
        '## template: jinja',
        'echo plain',
        '#!/bin/sh\n# Content-Type: x\n# MIME-Version: 1.0',
      ].map(userDataType),
    ).toEqual([
      'text/x-shellscript',
      'text/cloud-config',
      'text/cloud-config-archive',
      'text/cloud-boothook',
      'text/x-include-url',
      'text/jinja2',
      'text/plain',
      // cloud-init parses it as MIME too (mime-version: in its first 4096 bytes), so it is nested as one.
      'multipart/mixed',
    ]);
  });

  it('creates one user per slot with the keys (written once), a private home and no sudo; the default user gets none', () => {
    expect(perSlot).toBe(
      [
        '#cloud-config',
        "# metastatic: the backing pool's authorized-keys (and per-slot users), added to the label's own user data",
        MERGE,
        'users:',
        '  - default',
        '  - name: "zuul-0"',
        '    gecos: "metastatic slot 0"',
        '    homedir: "/home/zuul-0"',
        '    lock_passwd: true',
        '    ssh_authorized_keys: &keys',
        `      - ${JSON.stringify(ED25519_KEY)}`,
        '  - name: "zuul-1"',
        '    gecos: "metastatic slot 1"',
        '    homedir: "/home/zuul-1"',
        '    lock_passwd: true',
        '    ssh_authorized_keys: *keys',
        '  - name: "zuul-2"',
        '    gecos: "metastatic slot 2"',
        '    homedir: "/home/zuul-2"',
        '    lock_passwd: true',
        '    ssh_authorized_keys: *keys',
        'runcmd:',
        '  - ["chmod", "0700", "/home/zuul-0", "/home/zuul-1", "/home/zuul-2"]',
        '',
      ].join('\n'),
    );
    if (read) {
      const users = (read[3]?.[0]?.yaml as { users: unknown[] } | undefined)?.users ?? [];
      expect(users[0]).toBe('default');
      expect(users[2]).toMatchObject({ name: 'zuul-1', ssh_authorized_keys: [ED25519_KEY] });
      expect(users[2]).not.toHaveProperty('sudo');
    }
  });

  it('contained (isolation: contain): writes the slot program, one slots line, the keys for sshd and PAM, and boots', () => {
    const text = poolCloudConfig([ED25519_KEY], {
      username: 'zuul',
      slots: 3,
      contain: { limits: { millicores: 1500, memoryMiB: 2048, pids: 1024 }, imds: false },
    });
    const lines = text.split('\n');
    // No users list: boot makes them, so the keys are not repeated per slot.
    expect(lines).not.toContain('users:');
    const content = (path: string) => {
      const at = lines.indexOf(`  - path: ${JSON.stringify(path)}`);
      const line = lines.slice(at).find((l) => l.startsWith('    content: '));
      return at < 0 || !line ? undefined : (JSON.parse(line.slice('    content: '.length)) as string);
    };
    // The program is the text a local backing node runs, gzip and base64 (cloud-init's gz+b64).
    const packed = content('/usr/local/sbin/metastatic-slot');
    expect(packed && gunzipSync(Buffer.from(packed, 'base64')).toString('utf8')).toBe(SLOT_PROGRAM);
    expect(content('/etc/metastatic/slots')).toMatch(/\nzuul 3 1500 2048 1024 0\n$/);
    expect(content('/etc/metastatic/authorized_keys')).toBe(`${ED25519_KEY}\n`);
    expect(content('/etc/ssh/sshd_config.d/50-metastatic.conf')).toContain(
      'Match Group metastatic-slot\n    AuthorizedKeysFile /etc/metastatic/authorized_keys\n',
    );
    expect(content('/etc/pam.d/sshd')).toContain(
      'session required pam_exec.so quiet /usr/local/sbin/metastatic-slot pam /etc/metastatic/slots\n',
    );
    expect(content('/var/lib/cloud/scripts/per-boot/metastatic-slot')).toBe(
      '#!/bin/sh\nexec /usr/local/sbin/metastatic-slot boot /etc/metastatic/slots\n',
    );
    // IMDS open to the slot users only when the label says so.
    expect(
      poolCloudConfig([ED25519_KEY], {
        username: 'zuul',
        slots: 3,
        contain: { limits: { millicores: 0, memoryMiB: 0, pids: 1024 }, imds: true },
      }),
    ).toContain('zuul 3 0 0 1024 1\\n');
  });

  it("names each node's user after its slot, as the user data created them", () => {
    const contract = { username: 'zuul', connectionType: 'ssh', pythonPath: 'auto', perSlotUsers: true };
    expect(nodeContract(contract, 2)).toEqual({
      username: 'zuul-2',
      connectionType: 'ssh',
      pythonPath: 'auto',
    });
    expect(nodeContract({ ...contract, perSlotUsers: false }, 2)).toMatchObject({ username: 'zuul' });
    expect(nodeContract({ connectionType: 'ssh', pythonPath: 'auto', shellType: 'csh' }, 0)).toEqual({
      connectionType: 'ssh',
      pythonPath: 'auto',
      shellType: 'csh',
    });
  });

  it("combines a launch template's user data like a label's, and refuses a launch over EC2's 16 KB, naming the parts", () => {
    const settings = {
      poolKey: 'ec2/main',
      label: 'large',
      authorizedKeys: [RSA_KEY],
      perSlotUsers: true,
      username: 'zuul',
    } as unknown as AwsLabelSettings;
    const spec = { backingNodeId: 'b', attempt: 1, poolKey: 'ec2/main', label: 'large', slots: 2 };
    const fromTemplate = launchUserData(spec, settings, '#!/bin/sh\necho template\n') as string;
    expect(fromTemplate).toContain('Content-Type: text/x-shellscript');
    expect(fromTemplate).toContain('"zuul-1"');
    const big = `#!/bin/sh\n${'#'.repeat(MAX_USERDATA_BYTES)}\n`;
    expect(() => launchUserData(spec, settings, big)).toThrow(
      /^the user data of label large in ec2\/main would be \d+ bytes, over EC2's 16384: launch template's user data, authorized-keys, per-slot-users \(2 users\) together; make them smaller$/,
    );
    expect(userDataBytes('é')).toBe(2);
  });
});
