/**
 * Which EC2 instance types give the console output as it is now (GetConsoleOutput with `Latest`), which
 * `host-keys: console` needs (shared/providers/aws/consoleOutput.ts): AWS supports `Latest` "on instance
 * types that use the Nitro hypervisor". The others give only the output EC2 buffered "shortly after an
 * instance transition state" (start, stop, reboot, terminate): the host-key block cloud-init prints a
 * minute or more after `running` may not be in it within boot-timeout, or until the next transition
 * (reports of up to 20 minutes), and every backing node would fail at boot-timeout with its instance
 * launched for nothing.
 *
 * Data, not a lookup (the configuration is checked offline, at synth and by `metastatic validate`):
 * - XEN_FAMILIES: the families AWS lists as Xen-based (EC2 User Guide, "Instances built on the AWS Nitro
 *   System", its list of Xen-based instances, and the older generations before them). Certainly not
 *   Nitro: with `host-keys: console` they are refused.
 * - Nitro: every family of the 5th generation and later (m5, c6g, r7i, x8g, ...: AWS has launched no Xen
 *   instance type since 2017), and the earlier-numbered families NITRO_FAMILIES lists. Accepted.
 * - Anything else (a family not listed here, a bare metal size, which runs no hypervisor at all, a typo)
 *   is unknown: a warning, not an error, since the type may well support it and the list cannot follow
 *   every launch. The warning says how to be sure: `aws ec2 describe-instance-types --instance-types T
 *   --query 'InstanceTypes[].Hypervisor'` answers `nitro`.
 */

/** Xen-based families: `Latest` is refused and the buffered console output may come minutes late. */
export const XEN_FAMILIES: ReadonlySet<string> = new Set([
  // general purpose
  'm1',
  'm2',
  'm3',
  'm4',
  't1',
  't2',
  // compute optimized
  'c1',
  'c3',
  'c4',
  'cc1',
  'cc2',
  // memory optimized
  'r3',
  'r4',
  'x1',
  'x1e',
  'cr1',
  // storage optimized (i3.metal is bare metal, below)
  'd2',
  'h1',
  'i2',
  'i3',
  'hi1',
  'hs1',
  // accelerated computing (p3dn is Nitro: another family)
  'f1',
  'g2',
  'g3',
  'g3s',
  'p2',
  'p3',
  'cg1',
]);

/** Families numbered below 5 that are built on the Nitro hypervisor (5th generation and later all are). */
export const NITRO_FAMILIES: ReadonlySet<string> = new Set([
  'a1',
  't3',
  't3a',
  't4g',
  'z1d',
  'd3',
  'd3en',
  'i3en',
  'i4g',
  'i4i',
  'im4gn',
  'is4gen',
  'g4ad',
  'g4dn',
  'p3dn',
  'p4d',
  'p4de',
  'inf1',
  'inf2',
  'trn1',
  'trn1n',
  'trn2',
  'dl1',
  'dl2q',
  'vt1',
  'f2',
  'x2gd',
  'x2idn',
  'x2iedn',
  'x2iezn',
]);

/** A family name: EC2's series letters, the generation, then attributes (`c7gn`, `m5zn`, `r8i-flex`). */
const FAMILY = /^(a|c|d|dl|f|g|gr|h|hpc|i|im|inf|is|m|p|r|t|trn|vt|x|z)(\d+)[a-z-]*$/;

/** How GetConsoleOutput serves an instance type: as it is now, only as buffered, or not known here. */
export type ConsoleOutputSupport = 'latest' | 'buffered' | 'unknown';

export function consoleOutputSupport(instanceType: string): ConsoleOutputSupport {
  const [family = '', size = ''] = instanceType.trim().toLowerCase().split('.', 2);
  if (XEN_FAMILIES.has(family)) return size === 'metal' ? 'unknown' : 'buffered';
  if (size === '' || size === 'metal' || size.endsWith('-metal')) return 'unknown';
  if (NITRO_FAMILIES.has(family)) return 'latest';
  // High memory (u-6tb1.56xlarge, u7i-12tb.224xlarge): virtualized ones are Nitro.
  if (/^u\d*[a-z]*-/.test(family)) return 'latest';
  const generation = FAMILY.exec(family)?.[2];
  return generation !== undefined && Number(generation) >= 5 ? 'latest' : 'unknown';
}
