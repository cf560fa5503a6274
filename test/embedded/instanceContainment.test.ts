import { execFile, execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseConfigOrThrow } from '../../shared/config/load.ts';
import { launchUserData } from '../../shared/providers/aws/runInstancesRequest.ts';
import { runnerScript } from '../../shared/providers/aws/runnerScript.ts';
import { awsPoolSettings } from '../../shared/providers/aws/settings.ts';
import { poolConfig } from '../../testkit/configs.ts';
import { onPath } from '../../testkit/onPath.ts';

/**
 * An aws label with `isolation: contain` (issue 42), as an instance would run it, on this machine: the
 * label's user data, made by the code a launch uses (config -> launchUserData), is applied by the real
 * cloud-init, the slot program's `boot` sets the slots up, and Debian's sshd with its stock PAM stack
 * serves them; OpenSSH logins then show each row of docs/how-it-works.md's AWS isolation table. All of it
 * in mount, network and PID namespaces of its own (test/instance/contained-instance.sh): /etc is an
 * overlay, so the users boot adds never reach the host's user database.
 *
 * Needs root, cloud-init, sshd (openssh-server), nft or iptables, python3 and curl; skipped, saying why,
 * where one is missing, and with METASTATIC_REQUIRE_INSTANCE=1 (set by .ci/run, which installs them) its
 * absence fails the run. What it cannot show here: systemd (sshd is started by hand, cgroup v1+v2 hybrid
 * rather than an instance's pure v2) and IMDS itself (a stand-in listens on its address).
 */
function unavailable(): string | undefined {
  if (process.platform !== 'linux' || process.getuid?.() !== 0) return 'needs root on Linux';
  const missing = ['cloud-init', 'unshare', 'python3', 'curl', 'ssh', 'ssh-keygen'].filter((c) => !onPath(c));
  if (!existsSync('/usr/sbin/sshd')) missing.push('sshd (openssh-server)');
  if (!onPath('nft') && !onPath('iptables')) missing.push('nft or iptables');
  return missing.length > 0 ? `not installed: ${missing.join(', ')}` : undefined;
}

const why = unavailable();
if (why !== undefined && process.env.METASTATIC_REQUIRE_INSTANCE === '1') {
  throw new Error(`METASTATIC_REQUIRE_INSTANCE=1 but ${why}`);
}
if (why !== undefined) console.warn(`skipping the contained-instance test: ${why}`);

const CONFIG = (key: string) =>
  poolConfig({
    backing: {
      driver: 'aws',
      provider: { region: 'eu-west-1' },
      pool: { 'subnet-id': 'subnet-1', 'authorized-keys': [key] },
      labels: [
        {
          name: 'box',
          'instance-type': 'm7i.large',
          'image-id': 'ami-0abc',
          username: `mt${process.pid % 100000}`,
          'per-slot-users': true,
          isolation: 'contain',
        },
      ],
    },
    meta: {
      labels: [
        { name: 'half', 'backing-label': 'box', 'max-parallel-jobs': 2, cores: 0.5, memory: '256MiB' },
      ],
    },
  });

describe.skipIf(why !== undefined)(
  'an instance of an aws label with isolation: contain',
  { timeout: 120_000 },
  () => {
    let dir: string;
    let userData: string;
    const seen = new Map<string, string>();
    const username = `mt${process.pid % 100000}`;

    beforeAll(async () => {
      dir = await mkdtemp(join(tmpdir(), 'metastatic-instance-'));
      execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'id_ed25519')]);
      const key = (await readFile(join(dir, 'id_ed25519.pub'), 'utf8')).trim();
      const config = parseConfigOrThrow(CONFIG(key), 'metastatic.yaml');
      const pool = config.backingPools.find((p) => p.key === 'ec2/main');
      const settings = pool && awsPoolSettings(pool).get('box');
      if (!settings) throw new Error('no settings for ec2/main box');
      // What a launch of a backing node for `half` puts in RunInstances (its slot: half a core, 256 MiB).
      const text = launchUserData(
        {
          backingNodeId: 'b-1',
          attempt: 1,
          poolKey: 'ec2/main',
          label: 'box',
          slots: 2,
          slot: { cores: 0.5, memoryMiB: 256 },
        },
        settings,
      );
      if (text === undefined) throw new Error('no user data');
      userData = text;
      await writeFile(join(dir, 'user-data.yaml'), userData);
      // The script the github function sends through SSM to start a job's runner in slot 0; the runner
      // command prints what a runner would see (its uid, cgroup, directory, /tmp, configuration).
      const runnerCommand = [
        'echo "uid=$(id -u)"',
        `echo "cgroup=$(grep -c 'metastatic/${username}-0$' /proc/self/cgroup)"`,
        'echo "pwd=$(pwd)"',
        'echo "jit=$METASTATIC_JITCONFIG"',
        'echo "tmp=$(ls -A /tmp | wc -l)"',
        'echo "caps=$(grep CapEff /proc/self/status | cut -f2)"',
        'echo "env=$(env | cut -d= -f1 | sort | tr "\\n" " ")"',
      ].join('; ');
      await writeFile(
        join(dir, 'runner.sh'),
        runnerScript({
          region: 'eu-west-1',
          parameterName: '/metastatic/p/github/jit/github-job-1',
          user: `${username}-0`,
          runnerCommand,
        }),
      );
      const script = join(import.meta.dirname, '..', 'instance', 'contained-instance.sh');
      const stdout = await new Promise<string>((resolve, reject) => {
        execFile(
          'unshare',
          [
            '--mount',
            '--net',
            '--pid',
            '--fork',
            '--mount-proc',
            '--propagation',
            'private',
            'sh',
            script,
            dir,
            `${username}-0`,
            `${username}-1`,
          ],
          { timeout: 90_000, env: { ...process.env, METASTATIC_LEAK_CHECK: 'from-the-pool' } },
          (err, out, stderr) => (err ? reject(new Error(`${err.message}\n${out}\n${stderr}`)) : resolve(out)),
        );
      });
      for (const line of stdout.split('\n')) {
        const at = line.indexOf('=');
        if (at > 0) seen.set(line.slice(0, at), line.slice(at + 1));
      }
    });

    afterAll(async () => {
      if (dir) await rm(dir, { recursive: true, force: true });
    });

    it('is cloud-config cloud-init accepts, and cloud-init writes the slot program and its files', () => {
      expect(
        execFileSync('cloud-init', ['schema', '--config-file', join(dir, 'user-data.yaml')]).toString(),
      ).toMatch(/^Valid cloud-config/);
      expect(seen.get('written')).toBe('3');
    });

    it("refuses a slot user's session until boot has finished, then lets it in as the slot's own user", () => {
      expect(seen.get('pam_before_boot')).toBe('125');
      expect(seen.get('boot_without_namespace')).toBe(
        'metastatic-slot: no pam_namespace.so: the slots cannot have a /tmp of their own (status 125)',
      );
      expect(seen.get('booted_without_namespace')).toBe('no');
      expect(seen.get('booted')).toBe('yes');
      expect(seen.get('boot_again')).toBe('0');
      expect(seen.get('uid0')).toBe(seen.get('uid_host'));
      expect(Number(seen.get('uid0'))).toBeGreaterThan(0);
    });

    it("holds every session in its slot's cgroup, with the label's cores and memory", () => {
      const controllers = seen.get('cgroup0')?.trim().split(/\s+/) ?? [];
      expect(controllers).toEqual(expect.arrayContaining(['cpu', 'memory', 'pids']));
      expect(seen.get('cpu_quota')).toMatch(/^50000( 100000)?$/);
      expect(seen.get('oom')).toBe('status 137');
      expect(seen.get('neighbour')).toBe('neighbour done');
    });

    it("keeps another slot's /tmp, home and processes out of reach", () => {
      expect(seen.get('tmp_own')).toBe('secret0');
      expect(seen.get('tmp_other')).toBe('refused');
      expect(seen.get('tmp_on_host')).toBe('secret0');
      expect(seen.get('home_other')).toBe('refused');
      expect(seen.get('leftover')).toBe('running');
      expect(seen.get('ps_own')).not.toBe('0');
      expect(seen.get('ps_other')).toBe('0');
      expect(seen.get('kill_other')).toBe('refused');
    });

    it('refuses the instance metadata service to slot users, not to root', () => {
      expect(seen.get('imds_root')).toBe('200');
      expect(seen.get('imds_slot')).toBe('refused');
    });

    it("lets slot users in with the pool's keys only, into an environment sshd built", () => {
      expect(seen.get('own_key')).toBe('refused');
      const names = (seen.get('env0') ?? '').trim().split(/\s+/);
      expect(names).toContain('HOME');
      expect(names.filter((n) => !SSHD_ENV.has(n))).toEqual([]);
    });

    it("starts a GitHub job's runner in the slot: its user, cgroup, home and an empty /tmp, the configuration on stdin, no capabilities", () => {
      expect(seen.get('runner_uid')).toBe(seen.get('uid_host'));
      expect(seen.get('runner_cgroup')).not.toBe('0');
      expect(seen.get('runner_pwd')).toBe(`/home/${username}-0`);
      expect(seen.get('runner_jit')).toBe(`jit-for-${username}-0`);
      expect(seen.get('runner_tmp')).toBe('0');
      expect(seen.get('runner_caps')).toBe('0000000000000000');
      expect(seen.get('runner_parameter_deleted')).toBe('yes');
      // The agent's environment (root's: here METASTATIC_TEST_USER, the harness's) does not reach it.
      expect(seen.get('runner_env')?.trim().split(' ')).toEqual([
        'HOME',
        'LANG',
        'LOGNAME',
        'METASTATIC_JITCONFIG',
        'OLDPWD',
        'PATH',
        'PWD',
        'SHELL',
        'USER',
      ]);
    });

    it("ends every process of a slot, setsid ones included, with the slot program's kill", () => {
      expect(seen.get('leftover')).toBe('running');
      expect(seen.get('after_kill')).toBe('none');
      expect(seen.get('sshd_log')).toBe('0');
    });
  },
);

/** What sshd (with Debian's PAM stack) puts in a session's environment: nothing of the pool's. */
const SSHD_ENV = new Set([
  'HOME',
  'LANG',
  'LOGNAME',
  'MAIL',
  'PATH',
  'PWD',
  'SHELL',
  'SHLVL',
  'SSH_CLIENT',
  'SSH_CONNECTION',
  'USER',
  '_',
  'LC_ALL',
  'LC_CTYPE',
  'MOTD_SHOWN',
  'XDG_SESSION_ID',
  'XDG_RUNTIME_DIR',
  'XDG_SESSION_TYPE',
  'XDG_SESSION_CLASS',
]);
