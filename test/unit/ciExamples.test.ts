import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseDocument } from 'yaml';

/**
 * The CI recipes' files that no test runs end to end here: the GitHub Actions workflow (it needs AWS)
 * is valid YAML of a workflow's shape and keeps job data out of its shell code; every driver script
 * parses (and is shellcheck-clean where shellcheck is installed, as on CI's image).
 */
const root = resolve(import.meta.dirname, '..', '..');
const workflow = join(root, 'examples', 'github-actions', 'metastatic-run.yml');

interface Step {
  name?: string;
  uses?: string;
  run?: string;
  with?: Record<string, unknown>;
  env?: Record<string, string>;
}

describe('the GitHub Actions example', () => {
  const doc = parseDocument(readFileSync(workflow, 'utf8'), { uniqueKeys: true, prettyErrors: true });
  const wf = doc.toJS() as {
    on: unknown;
    permissions: Record<string, string>;
    jobs: Record<string, { 'runs-on': string; steps: Step[] }>;
  };

  it('is one YAML document without errors or duplicate keys', () => {
    expect(doc.errors).toEqual([]);
    expect(doc.warnings).toEqual([]);
  });

  it('has the shape of a workflow: triggers, OIDC permission, a job of steps', () => {
    expect(wf.on).toBeTruthy();
    expect(wf.permissions['id-token']).toBe('write');
    const jobs = Object.values(wf.jobs);
    expect(jobs.length).toBe(1);
    const [job] = jobs;
    expect(typeof job?.['runs-on']).toBe('string');
    for (const step of job?.steps ?? []) expect(Boolean(step.uses) !== Boolean(step.run)).toBe(true);
    const uses = (job?.steps ?? []).flatMap((s) => (s.uses ? [s.uses.split('@')[0]] : []));
    expect(uses).toContain('aws-actions/configure-aws-credentials');
  });

  it('runs the tests with metastatic run against a stack, a lease and the key from a secret', () => {
    const steps = Object.values(wf.jobs)[0]?.steps ?? [];
    const run = steps.find((s) => s.run?.includes('metastatic run'))?.run ?? '';
    expect(run).toMatch(/^metastatic run small-node --lease [0-9]+ /);
    expect(run).toContain('--identity "$RUNNER_TEMP/metastatic_ed25519"');
    expect(run).toContain(' -- ');
    expect(JSON.stringify(Object.values(wf.jobs)[0])).toContain('METASTATIC_STACK');
  });

  it('installs the release tarball METASTATIC_TARBALL names, never a package from the registry (issue 41, defect 9)', () => {
    const steps = Object.values(wf.jobs)[0]?.steps ?? [];
    const install = steps.find((s) => s.name === 'Install metastatic');
    expect(install?.env?.METASTATIC_TARBALL).toMatch(/^\$\{\{ vars\.METASTATIC_TARBALL \}\}$/);
    // The step's script with an npm that records what it was asked to install.
    const bin = mkdtempSync(join(tmpdir(), 'metastatic-npm-'));
    try {
      writeFileSync(join(bin, 'npm'), '#!/bin/sh\necho "npm $*"\n', { mode: 0o755 });
      const run = (tarball?: string) => {
        const env = {
          PATH: `${bin}:/usr/bin:/bin`,
          ...(tarball === undefined ? {} : { METASTATIC_TARBALL: tarball }),
        };
        const r = spawnSync('bash', ['-c', install?.run ?? ''], { env, encoding: 'utf8' });
        return { status: r.status, npm: r.stdout.split('\n').filter((l) => l.startsWith('npm ')) };
      };
      for (const refused of [
        undefined,
        '',
        'metastatic',
        'metastatic@0.1',
        'http://example.com/metastatic.tgz',
      ]) {
        expect({ refused, ...run(refused) }).toEqual({ refused, status: 1, npm: [] });
      }
      const url = 'https://example.com/releases/metastatic-0.1.0.tgz';
      expect(run(url)).toEqual({ status: 0, npm: [`npm install --global ${url}`] });
      expect(run('./vendor/metastatic-0.1.0.tgz').npm).toEqual([
        'npm install --global ./vendor/metastatic-0.1.0.tgz',
      ]);
    } finally {
      rmSync(bin, { recursive: true, force: true });
    }
  });

  it('puts no expression into shell code: job data reaches the scripts as environment only', () => {
    const steps = Object.values(wf.jobs)[0]?.steps ?? [];
    for (const step of steps) if (step.run) expect(step.run).not.toContain('${{');
  });
});

describe('the example scripts', () => {
  const dirs = ['gitlab-custom-executor', 'shell'].map((d) => join(root, 'examples', d));
  const scripts = dirs.flatMap((d) =>
    readdirSync(d)
      .filter((f) => f.endsWith('.sh'))
      .map((f) => join(d, f)),
  );

  it('parse with bash -n, and the drivers are executable', () => {
    expect(scripts.length).toBeGreaterThanOrEqual(6);
    for (const s of scripts) {
      execFileSync('bash', ['-n', s]);
      if (!s.endsWith('common.sh')) expect(statSync(s).mode & 0o111, s).not.toBe(0);
    }
  });

  it('are shellcheck-clean (CI requires shellcheck; elsewhere skipped without it)', ({ skip }) => {
    const found = spawnSync('shellcheck', ['--version']);
    if (found.error) {
      if (process.env.METASTATIC_REQUIRE_SHELLCHECK)
        throw new Error('shellcheck is required here and missing');
      return skip('no shellcheck here (Debian: apt-get install shellcheck)');
    }
    const r = spawnSync('shellcheck', ['-x', ...scripts], { encoding: 'utf8' });
    expect(r.stdout + r.stderr).toBe('');
    expect(r.status).toBe(0);
  });
});
