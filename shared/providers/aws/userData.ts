import { createHash } from 'node:crypto';
import { slotUserName } from '../../core/contract.ts';
import type { SlotLimits } from '../../core/slotLimits.ts';
import { containedCloudConfig } from './slotBoot.ts';

/**
 * The user data an instance is launched with: the label's own (or its launch template's), combined with
 * what the pool puts on every backing node it launches (its `authorized-keys`, and with `per-slot-users`
 * one user per slot), as cloud-init reads it. Plain data in, text out; no EC2 call.
 *
 * - Nothing of ours (no authorized-keys): the label's own user data, unchanged.
 * - Ours only: one `#cloud-config` document.
 * - Both: a MIME `multipart/mixed` message (cloud-init's own format for several parts, as `cloud-init
 *   devel make-mime` writes it): the label's part first, with the type cloud-init would have read from
 *   its first line (`#!` -> text/x-shellscript, `#cloud-config` -> text/cloud-config, a MIME message ->
 *   nested as it is, ...), then ours as `text/cloud-config`.
 *
 * Our cloud-config carries `merge_how: list(append)+dict(no_replace,recurse_list)+str()`, cloud-init's
 * documented way for a later part to add to an earlier one: when the label's own part is cloud-config
 * too, our users, keys and runcmd are appended to its lists and none of its keys is replaced (without
 * it, cloud-init's default merge would let the later part's lists replace the earlier's).
 */

export { MAX_USERDATA_BYTES } from './configSchema.ts';

export interface UserDataParts {
  /** The label's own user data (its `userdata`, else its launch template's), as written. */
  readonly own?: string;
  /** The pool's authorized-keys (OpenSSH public key lines). */
  readonly authorizedKeys: readonly string[];
  /** With per-slot-users: the username the slot users are named after, and how many slots. */
  readonly slotUsers?: SlotUsers;
}

export interface SlotUsers {
  readonly username: string;
  readonly slots: number;
  /** With `isolation: contain`: each slot's limits, and whether its user may reach IMDS (slotBoot.ts). */
  readonly contain?: { readonly limits: SlotLimits; readonly imds: boolean };
}

/** The user data to launch with, or undefined when there is none. */
export function composeUserData(parts: UserDataParts): string | undefined {
  const own = parts.own === undefined || parts.own.trim() === '' ? undefined : parts.own;
  if (parts.authorizedKeys.length === 0 && parts.slotUsers === undefined) return own;
  const ours = poolCloudConfig(parts.authorizedKeys, parts.slotUsers);
  if (own === undefined) return ours;
  return multipart([userPart(own), textPart('text/cloud-config', ours, 'metastatic-cloud-config')]);
}

/** Bytes of user data as EC2 counts them (UTF-8, before base64). */
export function userDataBytes(text: string): number {
  return Buffer.byteLength(text, 'utf8');
}

/** The names of the slot users of a backing node (`zuul-0` ... `zuul-<slots-1>`). */
export function slotUsers(username: string, slots: number): string[] {
  return Array.from({ length: slots }, (_, slot) => slotUserName(username, slot));
}

/** Every string is written as a JSON string: a valid YAML double-quoted scalar, whatever it holds. */
const q = (s: string) => JSON.stringify(s);

/**
 * Our `#cloud-config`. Without per-slot users the keys go to the image's default user (cloud-init's
 * top-level `ssh_authorized_keys`; the label's `username` must name that user). With them, one user
 * per slot gets the keys (written once, a YAML anchor, so a thousand slots do not repeat them), a home
 * directory of its own made private (useradd's mode varies: 0755 on older Ubuntu), a locked password
 * and no sudo; the default user is kept (`- default`) but gets no key from the pool. Contained
 * (`isolation: contain`), the slot program makes the users at boot instead, and the keys are in one
 * root-owned file sshd reads for them (slotBoot.ts).
 */
export function poolCloudConfig(authorizedKeys: readonly string[], perSlot?: SlotUsers): string {
  const lines = [
    '#cloud-config',
    "# metastatic: the backing pool's authorized-keys (and per-slot users), added to the label's own user data",
    'merge_how: "list(append)+dict(no_replace,recurse_list)+str()"',
  ];
  const keyList = (indent: string) => authorizedKeys.map((k) => `${indent}- ${q(k)}`);
  if (perSlot === undefined) {
    lines.push('ssh_authorized_keys:', ...keyList('  '));
    return `${lines.join('\n')}\n`;
  }
  if (perSlot.contain) {
    const { username, slots } = perSlot;
    lines.push(...containedCloudConfig({ username, slots, ...perSlot.contain, authorizedKeys }));
    return `${lines.join('\n')}\n`;
  }
  const users = slotUsers(perSlot.username, perSlot.slots);
  lines.push('users:', '  - default');
  users.forEach((name, slot) => {
    lines.push(
      `  - name: ${q(name)}`,
      `    gecos: ${q(`metastatic slot ${slot}`)}`,
      `    homedir: ${q(`/home/${name}`)}`,
      '    lock_passwd: true',
    );
    if (authorizedKeys.length === 0) return;
    if (slot === 0) lines.push('    ssh_authorized_keys: &keys', ...keyList('      '));
    else lines.push('    ssh_authorized_keys: *keys');
  });
  lines.push('runcmd:', `  - [${['chmod', '0700', ...users.map((u) => `/home/${u}`)].map(q).join(', ')}]`);
  return `${lines.join('\n')}\n`;
}

/** cloud-init's first-line prefixes (cloud-init handlers INCLUSION_TYPES_MAP), longest first. */
const STARTS_WITH: readonly (readonly [string, string])[] = [
  ['#cloud-config-archive', 'text/cloud-config-archive'],
  ['#cloud-config-jsonp', 'text/cloud-config-jsonp'],
  ['#cloud-config', 'text/cloud-config'],
  ['#cloud-boothook', 'text/cloud-boothook'],
  ['#include-once', 'text/x-include-once-url'],
  ['#include', 'text/x-include-url'],
  ['#part-handler', 'text/part-handler'],
  ['#upstart-job', 'text/upstart-job'],
  ['## template: jinja', 'text/jinja2'],
  ['#!', 'text/x-shellscript'],
];

/**
 * The content type cloud-init reads user data as: a MIME message when "mime-version:" is in its first
 * 4096 bytes (cloud-init user_data.convert_string), else by its first line; text/plain when it knows
 * none (cloud-init then ignores it).
 */
export function userDataType(text: string): string {
  if (text.slice(0, 4096).toLowerCase().includes('mime-version:')) return 'multipart/mixed';
  const start = text.trimStart().toLowerCase();
  return STARTS_WITH.find(([prefix]) => start.startsWith(prefix))?.[1] ?? 'text/plain';
}

/** A part of ours or the label's: headers and body, or a MIME message of the label's that is a part as it is. */
type Part = { readonly headers: string; readonly body: string } | { readonly nested: string };

/**
 * A text part as cloud-init's `make-mime` writes it (Python's MIMEText): ASCII as 7bit, anything else
 * as UTF-8 in base64. Not 8bit: cloud-init reads a part's bytes back through Python's email module,
 * which turns 8-bit text into Latin-1 bytes that cloud-init then decodes as UTF-8 (mangled).
 */
function textPart(type: string, body: string, filename: string): Part {
  const ascii = Buffer.byteLength(body, 'utf8') === body.length;
  const encoded = ascii
    ? body
    : (
        Buffer.from(body, 'utf8')
          .toString('base64')
          .match(/.{1,76}/g) ?? []
      ).join('\n');
  return {
    headers: [
      `Content-Type: ${type}; charset="${ascii ? 'us-ascii' : 'utf-8'}"`,
      'MIME-Version: 1.0',
      `Content-Transfer-Encoding: ${ascii ? '7bit' : 'base64'}`,
      `Content-Disposition: attachment; filename="${filename}"`,
    ].join('\n'),
    body: encoded,
  };
}

function userPart(own: string): Part {
  const type = userDataType(own);
  // A MIME message already: it is a part as it is (its headers, a blank line, its body); cloud-init
  // walks nested multiparts.
  return type === 'multipart/mixed' ? { nested: own.replace(/^\s+/, '') } : textPart(type, own, 'userdata');
}

/** A multipart/mixed message of the parts, with a boundary that none of them contains. */
function multipart(parts: readonly Part[]): string {
  const texts = parts.map((p) => ('nested' in p ? p.nested : `${p.headers}\n\n${p.body}`));
  const all = texts.join('\n');
  let boundary = `metastatic-${createHash('sha256').update(all).digest('hex').slice(0, 32)}`;
  while (all.includes(boundary)) boundary = `${boundary}x`;
  const out = [`Content-Type: multipart/mixed; boundary="${boundary}"`, 'MIME-Version: 1.0', ''];
  for (const text of texts) out.push(`--${boundary}`, text);
  out.push(`--${boundary}--`, '');
  return out.join('\n');
}
