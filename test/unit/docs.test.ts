import { execFileSync } from 'node:child_process';
import {
  accessSync,
  constants,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import type { Command } from 'commander';
import { afterAll, describe, expect, it } from 'vitest';
import { buildProgram } from '../../cli/program.ts';
import { cliCommand, NPX_COMMAND } from '../../client/cliCommand.ts';
import { loadConfigOrThrow } from '../../shared/config/load.ts';
import { BEGIN_KEYS } from '../../shared/providers/aws/consoleHostKeys.ts';
import { composeUserData, poolCloudConfig } from '../../shared/providers/aws/userData.ts';
import { ED25519_KEY } from '../../testkit/sshKeys.ts';

/**
 * The documentation checked against the tree and the code: every relative link in the Markdown resolves
 * (to a file, and to a heading when it names one), docs/cli.md documents exactly the commands and
 * options the CLI defines, and docs/deploy.md's image requirements name what the pool's user data uses.
 */

const ROOT = resolve(import.meta.dirname, '..', '..');

const markdownFiles = (): string[] =>
  execFileSync('git', ['ls-files', '-co', '--exclude-standard', '*.md'], { cwd: ROOT, encoding: 'utf8' })
    .split('\n')
    .filter((f) => f !== '' && !f.includes('node_modules/') && existsSync(join(ROOT, f)));

/** The text outside fenced code blocks and inline code, where a link is a link. */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '``');
}

/** GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/`/g, '')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/**
 * Every anchor a Markdown file offers: its headings (repeated ones get -1, -2, ... as on GitHub) and
 * explicit `<a id="...">` / `<a name="...">` anchors.
 */
function anchorsOf(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  const text = markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
  for (const match of text.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) out.add(match[1] as string);
  for (const line of text.split('\n')) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1];
    if (heading === undefined) continue;
    const base = slug(heading);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The relative links of a file that do not resolve, as `file: target (why)`. */
function brokenLinks(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const broken: string[] = [];
  for (const match of prose(text).matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
    const target = match[1] as string;
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
    const [path, anchor] = target.split('#', 2) as [string, string | undefined];
    const resolved = path === '' ? join(ROOT, file) : resolve(ROOT, dirname(file), decodeURI(path));
    if (!existsSync(resolved)) {
      broken.push(`${file}: ${target} (no such file)`);
      continue;
    }
    if (
      anchor === undefined ||
      anchor === '' ||
      !resolved.endsWith('.md') ||
      statSync(resolved).isDirectory()
    )
      continue;
    if (!anchorsOf(readFileSync(resolved, 'utf8')).has(decodeURIComponent(anchor))) {
      broken.push(`${file}: ${target} (no heading #${anchor} in ${relative(ROOT, resolved)})`);
    }
  }
  return broken;
}

describe('the Markdown links', () => {
  it('resolve to a file, and to a heading where they name one', () => {
    const files = markdownFiles();
    expect(files.length).toBeGreaterThan(10);
    expect(files.flatMap(brokenLinks)).toEqual([]);
  });

  it('are checked: a missing file or heading is reported', () => {
    expect(slug('`--json` shapes (`cli/format.ts`)')).toBe('--json-shapes-cliformatts');
    expect(slug('Why no single writer is needed')).toBe('why-no-single-writer-is-needed');
    expect(anchorsOf('# A\n## A\n```\n# not a heading\n```\n<a id="here"></a>')).toEqual(
      new Set(['a', 'a-1', 'here']),
    );
    expect(prose('[x](a.md) `[y](b.md)`\n```\n[z](c.md)\n```\n')).toBe('[x](a.md) ``\n\n');
  });
});

/** The rows of the table in docs/cli.md whose first header cell is `header`: first cell -> the whole row. */
function tableRows(markdown: string, header: string): Map<string, string> {
  const lines = markdown.split('\n');
  const start = lines.findIndex((l) => new RegExp(`^\\|\\s*${header}\\s*\\|`).test(l));
  const rows = new Map<string, string>();
  if (start < 0) return rows;
  for (const line of lines.slice(start + 2)) {
    if (!line.startsWith('|')) break;
    const first = line.split(/(?<!\\)\|/)[1]?.trim() ?? '';
    rows.set(first, line);
  }
  return rows;
}

const longOptions = (c: Command): string[] =>
  c.options.map((o) => o.long).filter((l): l is string => l !== undefined && l !== '--help');

/** The long options a table cell names. */
const optionsIn = (text: string): string[] => [...new Set(text.match(/--[a-z][a-z-]*/g) ?? [])];

describe('docs/cli.md', () => {
  const doc = readFileSync(join(ROOT, 'docs', 'cli.md'), 'utf8');
  const program = buildProgram();

  it('documents every command the CLI has, and no other', () => {
    const documented = [...tableRows(doc, 'Command').keys()].map((cell) => /^`([a-z-]+)/.exec(cell)?.[1]);
    expect(documented.sort()).toEqual(program.commands.map((c) => c.name()).sort());
  });

  it("documents each command's options, and no option it does not have", () => {
    const rows = tableRows(doc, 'Command');
    for (const command of program.commands) {
      const row = [...rows.entries()].find(([cell]) => cell.startsWith(`\`${command.name()}`))?.[1] ?? '';
      const optionsCell = row.split(/(?<!\\)\|/)[2] ?? '';
      expect({ command: command.name(), options: optionsIn(optionsCell).sort() }).toEqual({
        command: command.name(),
        options: longOptions(command).sort(),
      });
    }
  });

  it('documents the global options', () => {
    const documented = [...tableRows(doc, 'Option').keys()].flatMap(optionsIn);
    expect(documented.sort()).toEqual(longOptions(program).sort());
  });
});

describe("docs/deploy.md's What your image needs (issue 40, defect 8)", () => {
  const deploy = readFileSync(join(ROOT, 'docs', 'deploy.md'), 'utf8');
  const section = /\n### What your image needs\n([\s\S]*?)(?=\n#{1,3} )/.exec(deploy)?.[1] ?? '';
  /** The top-level keys of a cloud-config document. */
  const topLevelKeys = (yaml: string) => [...yaml.matchAll(/^([a-z_]+):/gm)].map((m) => m[1] as string);

  it('is there, and the Prerequisites point to it rather than asking only for sshd', () => {
    expect(section.length).toBeGreaterThan(500);
    expect(deploy).toContain('[What your image needs](#what-your-image-needs)');
    expect(deploy).not.toMatch(/an AMI that runs sshd/);
  });

  it('names every cloud-config key the user data the pool generates relies on, and the console host-key block', () => {
    const keys = [ED25519_KEY];
    const generated = [
      poolCloudConfig(keys),
      poolCloudConfig(keys, { username: 'zuul', slots: 2 }),
      poolCloudConfig(keys, {
        username: 'zuul',
        slots: 2,
        contain: { limits: { millicores: 500, memoryMiB: 256, pids: 1024 }, imds: false },
      }),
      composeUserData({ own: '#!/bin/sh\ntrue\n', authorizedKeys: keys }) ?? '',
    ].join('\n');
    const used = [...new Set(topLevelKeys(generated))].sort();
    expect(used).toEqual(['merge_how', 'runcmd', 'ssh_authorized_keys', 'users', 'write_files']);
    for (const key of used) expect(section, key).toContain(`\`${key}\``);
    expect(section).toContain(BEGIN_KEYS);
    // The pool's own user data never turns the key block off (a label's own userdata could: named).
    for (const off of ['emit_keys_to_console', 'ssh_key_console_blacklist']) {
      expect(generated).not.toContain(off);
      expect(section).toContain(off);
    }
    // What the image must also be and have: the default user, a Nitro type, the time the block takes.
    for (const needed of [
      'default user',
      'Nitro',
      'boot-timeout: 300',
      'useradd',
      'sshd',
      'sshd_config.d',
      'pam_namespace',
      'nft',
    ]) {
      expect(section, needed).toContain(needed);
    }
  });

  it("is what examples/aws.yaml does: its boot-timeout leaves time for the console's host keys", async () => {
    const config = await loadConfigOrThrow(join(ROOT, 'examples', 'aws.yaml'));
    expect(config.metastaticPools.map((p) => p.bootTimeout)).toEqual([300]);
  });
});

/**
 * The commands in a text that could run a package fetched from the npm registry under this project's
 * name, which it does not publish (anyone may register it): `npx metastatic` without `--no` (npx installs
 * what it does not find), `npm exec` / `dlx` alike, and installs of `metastatic` or `metastatic@<version>`
 * by name. Installs of a tarball (`./metastatic-0.1.0.tgz`, a URL, `"$METASTATIC_TARBALL"`) are fine.
 */
function registryCommands(text: string): string[] {
  const found: string[] = [];
  const runner =
    /\b(npx|npm\s+(?:exec|x)|(?:pnpm|yarn)\s+dlx|bunx)((?:\s+-[^\s]+)*)\s+metastatic(?![\w./-])/g;
  for (const m of text.matchAll(runner)) {
    const options = (m[2] ?? '').trim().split(/\s+/);
    const refusesInstall =
      !/dlx|bunx/.test(m[1] as string) && options.some((o) => o === '--no' || o === '--no-install');
    if (!refusesInstall) found.push(m[0]);
  }
  for (const m of text.matchAll(/\b(?:npm|pnpm|yarn|bun)\s+(?:install|i|add)\b([^\n`#;&|)]*)/g)) {
    const words = (m[1] ?? '').split(/[\s;&|)]+/).map((w) => w.replace(/^['"`]+|['"`]+$/g, ''));
    if (words.some((w) => /^metastatic(@.*)?$/.test(w))) found.push(m[0]);
  }
  for (const m of text.matchAll(/(?<![\w./-])metastatic@[\w^~.*-]+/g)) found.push(m[0]);
  return found;
}

describe('the commands the documentation gives and the CLI prints (issue 41, defect 9)', () => {
  /** What a user copies commands from: the Markdown, the examples, and the sources of what the CLI prints. */
  const readFiles = (): string[] =>
    execFileSync(
      'git',
      [
        'ls-files',
        '-co',
        '--exclude-standard',
        '*.md',
        'examples',
        'cli',
        'client',
        'shared',
        'bin',
        'scripts',
      ],
      { cwd: ROOT, encoding: 'utf8' },
    )
      .split('\n')
      .filter(
        (f) =>
          f !== '' &&
          f !== 'CHANGELOG.md' && // history: what earlier versions said
          !f.includes('node_modules/') &&
          existsSync(join(ROOT, f)) &&
          statSync(join(ROOT, f)).isFile(),
      );

  it('finds what would run or install a package from the registry, and nothing else', () => {
    for (const bad of [
      'npx metastatic run small-node',
      'Try it from another shell:  npx metastatic request small-node --wait',
      'npx -y metastatic dev',
      'npm exec metastatic -- list',
      'pnpm dlx metastatic',
      'npm install --global metastatic@0.1',
      'npm i metastatic',
      'run: npm install -g "metastatic"',
      'yarn add metastatic@^0.1.0',
    ]) {
      expect({ bad, found: registryCommands(bad).length > 0 }).toEqual({ bad, found: true });
    }
    for (const good of [
      'npx --no metastatic run small-node',
      'npx --no-install metastatic --version',
      'npm i ./metastatic-0.1.0.tgz && npm i ../metastatic/metastatic-*.tgz',
      'npm install --global "$METASTATIC_TARBALL"',
      'bin/metastatic request small-node --wait',
      'npx cdk deploy -c config=my-pool.yaml',
      "import { MetastaticPool } from 'metastatic/cdk';",
    ]) {
      expect({ good, found: registryCommands(good) }).toEqual({ good, found: [] });
    }
  });

  it('gives none in the documentation, the examples, or the hints the CLI prints', () => {
    const files = readFiles();
    expect(files).toEqual(expect.arrayContaining(['README.md', 'docs/install.md', 'cli/commands/dev.ts']));
    const found = files.flatMap((f) =>
      readFileSync(join(ROOT, f), 'utf8')
        .split('\n')
        .flatMap((line, i) => registryCommands(line).map((c) => `${f}:${i + 1}: ${c}`)),
    );
    expect(found).toEqual([]);
  });

  it("runs this repository's CLI as bin/metastatic, which is bin/metastatic.mjs; the package's bin stays", () => {
    const bin = join(ROOT, 'bin', 'metastatic');
    expect(realpathSync(bin)).toBe(realpathSync(join(ROOT, 'bin', 'metastatic.mjs')));
    expect(() => accessSync(bin, constants.X_OK)).not.toThrow();
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    expect(pkg.bin).toEqual({ metastatic: 'bin/metastatic.mjs' });
    expect(pkg.files).toContain('bin/metastatic.mjs');
    // `npm start` and bin/metastatic alike suggest bin/metastatic from the repository's root.
    const path = '/usr/bin:/bin';
    for (const script of ['bin/metastatic.mjs', 'bin/metastatic']) {
      expect(cliCommand({ script: join(ROOT, script), cwd: ROOT, path })).toBe('bin/metastatic');
    }
    // From a directory outside the checkout (a new one: the checkout itself may be in the temp dir).
    const elsewhere = mkdtempSync(join(tmpdir(), 'metastatic-elsewhere-'));
    try {
      expect(cliCommand({ script: join(ROOT, 'bin', 'metastatic'), cwd: elsewhere, path })).toBe(bin);
    } finally {
      rmSync(elsewhere, { recursive: true, force: true });
    }
  });

  describe('the command the CLI suggests is the one it was started by', () => {
    const work = realpathSync(mkdtempSync(join(tmpdir(), 'metastatic-cli-command-')));
    afterAll(() => rmSync(work, { recursive: true, force: true }));
    /** A package directory as npm installs it: package.json and bin/metastatic.mjs. */
    const aPackage = (dir: string): string => {
      mkdirSync(join(dir, 'bin'), { recursive: true });
      writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'metastatic' }));
      writeFileSync(join(dir, 'bin', 'metastatic.mjs'), '#!/usr/bin/env node\n', { mode: 0o755 });
      return join(dir, 'bin', 'metastatic.mjs');
    };
    const link = (target: string, at: string): string => {
      mkdirSync(dirname(at), { recursive: true });
      symlinkSync(target, at);
      return at;
    };
    const app = join(work, 'my app');
    const installed = aPackage(join(app, 'node_modules', 'metastatic'));
    const dotBin = link('../metastatic/bin/metastatic.mjs', join(app, 'node_modules', '.bin', 'metastatic'));
    const globalBin = join(work, 'prefix', 'bin');
    const global = link(
      aPackage(join(work, 'prefix', 'lib', 'node_modules', 'metastatic')),
      join(globalBin, 'metastatic'),
    );
    const path = ['/usr/bin', globalBin].join(':');

    it('installed in the project worked in: npx --no metastatic, however it was run', () => {
      mkdirSync(join(app, 'sub'));
      for (const script of [dotBin, installed]) {
        for (const cwd of [app, join(app, 'sub')]) {
          expect(cliCommand({ script, cwd, path })).toBe(NPX_COMMAND);
        }
      }
      expect(NPX_COMMAND).toBe('npx --no metastatic');
      // Installed from a directory (node_modules/metastatic a link to a checkout) alike.
      const linked = join(work, 'linked');
      link(dirname(dirname(aPackage(join(work, 'checkout')))), join(linked, 'node_modules', 'metastatic'));
      const linkedBin = link(
        '../metastatic/bin/metastatic.mjs',
        join(linked, 'node_modules', '.bin', 'metastatic'),
      );
      expect(cliCommand({ script: linkedBin, cwd: linked, path: `${dirname(linkedBin)}:${path}` })).toBe(
        NPX_COMMAND,
      );
      // From outside that project, its path (quoted for the shell).
      expect(cliCommand({ script: dotBin, cwd: work, path })).toBe("'my app/node_modules/.bin/metastatic'");
    });

    it('installed globally: metastatic when it is the first on PATH, else its path', () => {
      expect(cliCommand({ script: global, cwd: app, path })).toBe('metastatic');
      expect(cliCommand({ script: global, cwd: join(work, 'prefix'), path: '/usr/bin' })).toBe(
        'bin/metastatic',
      );
    });

    it('not started by the CLI (a program using the client library): npx --no metastatic', () => {
      writeFileSync(join(work, 'mine.mjs'), '');
      expect(cliCommand({ script: join(work, 'mine.mjs'), cwd: work, path })).toBe(NPX_COMMAND);
      expect(cliCommand({ script: undefined, cwd: work, path })).toBe(NPX_COMMAND);
      expect(cliCommand({ script: join(work, 'gone'), cwd: work, path })).toBe(NPX_COMMAND);
    });
  });
});
