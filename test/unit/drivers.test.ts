import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * Adding a backing driver (docs/architecture.md, "Adding a provider"): its module under
 * shared/providers/<driver>/ and one line in shared/providers/drivers.ts, nothing else. Shown on a copy
 * of shared/ with a made-up `proxmox` driver (a schema of its own, a rule, what its machines give, its
 * resource ids): the configuration's schema, rules, error messages and resolution take it from the
 * registry, as they take `local` and `aws`.
 */

const root = join(import.meta.dirname, '../..');
const execFileP = promisify(execFile);

const DRIVER = `import { z } from 'zod';
import { intBetween, MAPPING, name, nonEmptyList } from '../../fields/fields.ts';
import { asRecord } from '../../fields/paths.ts';
import type { BackingDriver } from '../driver.ts';

const label = z.strictObject({ name: name(), 'vmid-template': intBetween(1, 999_999) }, { error: MAPPING });
const pool = z.strictObject(
  { name: name(), 'max-servers': intBetween(1, 100).optional(), labels: nonEmptyList(label, 'labels') },
  { error: MAPPING },
);

export const proxmoxDriver = {
  schema: z.strictObject(
    { name: name(), driver: z.literal('proxmox'), node: name(), pools: nonEmptyList(pool, 'pools') },
    { error: MAPPING },
  ),
  rules: (provider, path) =>
    (Array.isArray(provider.pools) ? provider.pools : []).flatMap((p, pi) =>
      (Array.isArray(asRecord(p)?.labels) ? (asRecord(p)?.labels as unknown[]) : []).flatMap((l, li) => {
        const vmid = asRecord(l)?.['vmid-template'];
        return typeof vmid === 'number' && vmid < 100
          ? [{ path: [...path, 'pools', pi, 'labels', li, 'vmid-template'], message: 'Proxmox keeps ids below 100' }]
          : [];
      }),
    ),
  machine: () => ({ vcpus: 8, memoryMiB: 16_384 }),
  ownsResource: (id) => id.startsWith('pve-'),
  embeddedOnly: false,
} satisfies BackingDriver;
`;

const CONFIG = (vmid: number) => `
providers:
  - name: pve
    driver: proxmox
    node: rack1
    pools:
      - name: main
        labels:
          - name: big
            vmid-template: ${vmid}
  - name: meta
    driver: metastatic
    pools:
      - name: main
        labels:
          - name: small
            backing-label: big
            max-parallel-jobs: 4
            cores: 4
`;

const PROBE = `import { parseConfig } from './shared/config/load.ts';
import { backingDriver } from './shared/providers/drivers.ts';
const out = (text) => {
  const r = parseConfig(text, 'pool.yaml');
  return r.ok
    ? { ok: true, pools: r.config.backingPools.map((p) => [p.key, p.driver]), notices: r.config.notices.map((n) => n.path + ': ' + n.message) }
    : { ok: false, errors: r.errors.map((e) => e.path + ': ' + e.message) };
};
console.log(JSON.stringify({
  good: out(${JSON.stringify(CONFIG(9000))}),
  badRule: out(${JSON.stringify(CONFIG(42))}),
  badDriver: out(${JSON.stringify(CONFIG(9000).replace('driver: proxmox', 'driver: vmware'))}),
  owns: backingDriver('proxmox')?.ownsResource('pve-101'),
}));
`;

describe('a new backing driver', () => {
  let copy: string;
  let registryDiff: string;

  beforeAll(async () => {
    // Inside the repository, so that the copy resolves this repository's node_modules.
    copy = await mkdtemp(join(root, '.driver-test-'));
    await cp(join(root, 'shared'), join(copy, 'shared'), { recursive: true });
    await mkdir(join(copy, 'shared/providers/proxmox'));
    await writeFile(join(copy, 'shared/providers/proxmox/driver.ts'), DRIVER);
    const registry = join(copy, 'shared/providers/drivers.ts');
    const before = await readFile(registry, 'utf8');
    const after = before
      .replace(
        "import { localDriver } from './local/driver.ts';",
        "$&\nimport { proxmoxDriver } from './proxmox/driver.ts';",
      )
      .replace('  aws: awsDriver,', '$&\n  proxmox: proxmoxDriver,');
    await writeFile(registry, after);
    registryDiff = after
      .split('\n')
      .filter((line) => !before.split('\n').includes(line))
      .join('\n');
    await writeFile(join(copy, 'probe.ts'), PROBE);
  });

  afterAll(async () => {
    if (copy) await rm(copy, { recursive: true, force: true });
  });

  it('needs its module and one registry line (with its import), and the configuration takes it', {
    timeout: 60_000,
  }, async () => {
    expect(registryDiff).toBe(
      "import { proxmoxDriver } from './proxmox/driver.ts';\n  proxmox: proxmoxDriver,",
    );
    const { stdout } = await execFileP(join(root, 'node_modules/.bin/tsx'), ['probe.ts'], { cwd: copy });
    const seen = JSON.parse(stdout) as Record<
      string,
      { ok: boolean; errors?: string[]; pools?: string[][]; notices?: string[] }
    >;
    // Parsed by its schema, resolved as a backing pool of its driver; its machines size the slots (4 x 4
    // cores on an 8-vCPU machine: the resolution's warning).
    expect(seen.good).toMatchObject({ ok: true, pools: [['pve/main', 'proxmox']] });
    expect(seen.good?.notices).toEqual([
      expect.stringMatching(/cores: 4 slots of 4 cores need 16; a backing node gives 8/),
    ]);
    // Its rule, at the YAML path of the key at fault.
    expect(seen.badRule?.errors).toEqual([
      'providers[0].pools[0].labels[0].vmid-template: Proxmox keeps ids below 100',
    ]);
    // Named among the drivers a section may give.
    expect(seen.badDriver?.errors?.join('\n')).toMatch(
      /driver must be one of metastatic, local, aws, proxmox/,
    );
    expect(seen.owns).toBe(true);
  });
});
