import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe } from 'vitest';
import { onPath } from './onPath.ts';

/**
 * ansible-core's `ansible-playbook`, for the test that runs real playbooks against nodes of the embedded
 * pool (Debian: `apt-get install ansible-core`; .ci/run installs it where it is missing).
 *
 * Where it is not installed that suite skips, with one line saying why; with METASTATIC_REQUIRE_ANSIBLE=1
 * (set by .ci/run) its absence fails the run instead.
 */

let availability: string | undefined | null = null;

/** Why ansible-playbook cannot run here, or undefined when it can. */
export function ansibleUnavailable(): string | undefined {
  if (availability !== null) return availability;
  availability = onPath('ansible-playbook')
    ? undefined
    : 'ansible-playbook is not installed (not on PATH); apt-get install ansible-core';
  if (availability !== undefined && process.env.METASTATIC_REQUIRE_ANSIBLE === '1') {
    throw new Error(`METASTATIC_REQUIRE_ANSIBLE=1 but ${availability}`);
  }
  return availability;
}

/** `describe` that skips (saying why, once) where ansible-playbook is absent. */
export function describeWithAnsible(name: string, options: { timeout: number }, body: () => void): void {
  const why = ansibleUnavailable();
  if (why !== undefined) {
    console.warn(`skipping "${name}": ${why}`);
    // biome-ignore lint/suspicious/noSkippedTests: skipped only where ansible-core is absent (never in CI)
    describe.skip(name, options, body);
    return;
  }
  describe(name, options, body);
}

/** The environment without any ANSIBLE_* variable of the caller's, plus `vars`. */
function ansibleEnvOf(base: NodeJS.ProcessEnv, vars: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(base)) if (!key.startsWith('ANSIBLE_')) env[key] = value;
  return { ...env, ...vars };
}

/**
 * An environment in which Ansible reads nothing of the user's and writes nothing outside `dir`: an empty
 * ansible.cfg of its own (no ./ansible.cfg, ~/.ansible.cfg or /etc/ansible), its home, local tmp and
 * ControlMaster sockets under `dir` (`controlDir`: a run that must not reuse another's open connection
 * gets one of its own), no retry files, no cows, no colour, and host-key checking on.
 */
export function ansibleEnv(dir: string, controlDir = join(dir, 'cp')): NodeJS.ProcessEnv {
  const config = join(dir, 'ansible.cfg');
  writeFileSync(config, '# empty: the test sets what it needs in the environment\n');
  return ansibleEnvOf(process.env, {
    ANSIBLE_CONFIG: config,
    ANSIBLE_HOME: join(dir, 'home'),
    ANSIBLE_LOCAL_TEMP: join(dir, 'tmp'),
    ANSIBLE_SSH_CONTROL_PATH_DIR: controlDir,
    ANSIBLE_RETRY_FILES_ENABLED: 'False',
    ANSIBLE_HOST_KEY_CHECKING: 'True',
    ANSIBLE_NOCOWS: '1',
    ANSIBLE_NOCOLOR: '1',
    ANSIBLE_FORCE_COLOR: '0',
    ANSIBLE_STDOUT_CALLBACK: 'default',
    ANSIBLE_GATHERING: 'implicit',
  });
}
