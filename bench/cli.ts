/**
 * The CLI's start-up cost, from the installed package (issue 13): the tarball is packed and installed
 * into an empty project (testkit/installedPackage.ts), an embedded pool is started from it and serves one
 * node, then `node -e 0`, `metastatic --help` and `metastatic list nodes --json` (against that pool) run
 * RUNS times each, interleaved, each a fresh process. Wall time is taken around the spawn; peak memory
 * (max RSS) comes from GNU time (`/usr/bin/time -f %M`) where it is installed. Reported as ratios to
 * `node -e 0` measured in the same run; nothing is asserted.
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { packAndInstall } from '../testkit/installedPackage.ts';
import { until } from '../testkit/processes.ts';
import { median, round, table, yesNo } from './common.ts';

export const CLI = {
  runs: 15,
  aims: { help: 3, list: 5 },
} as const;

const GNU_TIME = '/usr/bin/time';

export interface CommandFigures {
  readonly command: string;
  /** Median wall time, ms. */
  readonly wallMs: number;
  readonly wallMsMin: number;
  readonly wallMsMax: number;
  /** Median peak resident memory, KiB (null without GNU time). */
  readonly maxRssKiB: number | null;
  /** Versus `node -e 0` (1 for it). */
  readonly wallRatio: number;
  readonly rssRatio: number | null;
}

export interface CliFigures {
  readonly node: string;
  readonly runs: number;
  readonly commands: CommandFigures[];
  readonly aimsMet: { help: boolean; list: boolean };
}

/** One run of `args` under node: wall ms, and max RSS in KiB when GNU time is there. */
function timeOnce(args: readonly string[], cwd: string): { ms: number; rss: number | null } {
  const gnu = existsSync(GNU_TIME);
  const [cmd, argv] = gnu
    ? [GNU_TIME, ['-f', '%M', process.execPath, ...args]]
    : [process.execPath, [...args]];
  const t0 = process.hrtime.bigint();
  const out = spawnSync(cmd, argv, { cwd, encoding: 'utf8', env: { ...process.env } });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (out.status !== 0) throw new Error(`${args.join(' ')} failed (${out.status}): ${out.stderr}`);
  const rss = gnu ? Number(out.stderr.trim().split('\n').at(-1)) : null;
  return { ms, rss: Number.isFinite(rss) ? rss : null };
}

export async function measureCli(progress: (line: string) => void): Promise<CliFigures> {
  const work = mkdtempSync(join(tmpdir(), 'metastatic-bench-cli-'));
  let dev: ChildProcess | undefined;
  try {
    progress('cli: packing and installing the package into an empty project...');
    const pkg = await packAndInstall(work);
    const stateDir = join(work, 'state');
    dev = spawn(process.execPath, [pkg.bin, '--state-dir', stateDir, 'dev'], {
      cwd: pkg.app,
      stdio: 'ignore',
    });
    await until('the pool', () => (existsSync(join(stateDir, 'dev.json')) ? true : undefined), 60_000);
    const served = spawnSync(
      process.execPath,
      [pkg.bin, '--state-dir', stateDir, 'request', 'small-node', '--wait', '--timeout', '60'],
      { cwd: pkg.app, encoding: 'utf8' },
    );
    if (served.status !== 0) throw new Error(`request failed: ${served.stderr}`);
    const commands: Array<[string, string[]]> = [
      ['node -e 0', ['-e', '0']],
      ['metastatic --help', [pkg.bin, '--help']],
      ['metastatic list nodes --json', [pkg.bin, '--state-dir', stateDir, 'list', 'nodes', '--json']],
    ];
    for (const [, args] of commands) timeOnce(args, pkg.app); // warm the file cache
    const samples = commands.map(() => ({ ms: [] as number[], rss: [] as number[] }));
    progress(`cli: ${CLI.runs} runs of each of ${commands.length} commands, interleaved...`);
    for (let i = 0; i < CLI.runs; i++) {
      for (let j = 0; j < commands.length; j++) {
        const k = (i + j) % commands.length; // rotate the order
        const one = timeOnce((commands[k] as [string, string[]])[1], pkg.app);
        samples[k]?.ms.push(one.ms);
        if (one.rss !== null) samples[k]?.rss.push(one.rss);
      }
    }
    const base = samples[0] as { ms: number[]; rss: number[] };
    const baseMs = median(base.ms);
    const baseRss = base.rss.length > 0 ? median(base.rss) : null;
    const figures = commands.map(([command], k): CommandFigures => {
      const s = samples[k] as { ms: number[]; rss: number[] };
      const rss = s.rss.length > 0 ? median(s.rss) : null;
      return {
        command,
        wallMs: round(median(s.ms), 1),
        wallMsMin: round(Math.min(...s.ms), 1),
        wallMsMax: round(Math.max(...s.ms), 1),
        maxRssKiB: rss,
        wallRatio: round(median(s.ms) / baseMs, 2),
        rssRatio: rss !== null && baseRss ? round(rss / baseRss, 2) : null,
      };
    });
    const [, help, list] = figures as [CommandFigures, CommandFigures, CommandFigures];
    return {
      node: process.version,
      runs: CLI.runs,
      commands: figures,
      aimsMet: { help: help.wallRatio <= CLI.aims.help, list: list.wallRatio <= CLI.aims.list },
    };
  } finally {
    dev?.kill('SIGINT');
    if (dev)
      await until('the pool to stop', () => (dev?.exitCode !== null ? true : undefined), 30_000).catch(() =>
        dev?.kill('SIGKILL'),
      );
    rmSync(work, { recursive: true, force: true });
  }
}

const mib = (kib: number | null) => (kib === null ? '-' : `${(kib / 1024).toFixed(0)} MiB`);

export function cliReport(c: CliFigures): string {
  return [
    `CLI start-up from the installed package (node ${c.node}, ${c.runs} runs each, interleaved; median, min-max)`,
    table(
      c.commands.map((x) => [
        x.command,
        `${x.wallMs.toFixed(0)} ms (${x.wallMsMin.toFixed(0)}-${x.wallMsMax.toFixed(0)})`,
        x.wallRatio.toFixed(2),
        mib(x.maxRssKiB),
        x.rssRatio === null ? '-' : x.rssRatio.toFixed(2),
      ]),
      ['command', 'wall', 'wall / node -e 0', 'peak RSS', 'RSS / node -e 0'],
    ),
  ].join('\n');
}

export function cliSummary(c: CliFigures) {
  const [base, help, list] = c.commands as [CommandFigures, CommandFigures, CommandFigures];
  const detail = (x: CommandFigures) =>
    `${x.wallRatio.toFixed(2)} (${x.wallMs.toFixed(0)} / ${base.wallMs.toFixed(0)} ms; peak ${mib(x.maxRssKiB)})`;
  return [
    {
      figure: 'CLI --help wall time / node -e 0',
      measured: detail(help),
      aim: `<= ${CLI.aims.help}`,
      met: yesNo(c.aimsMet.help),
    },
    {
      figure: 'CLI list nodes --json wall time / node -e 0',
      measured: detail(list),
      aim: `<= ${CLI.aims.list}`,
      met: yesNo(c.aimsMet.list),
    },
  ];
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const figures = await measureCli((line) => process.stdout.write(`${line}\n`));
  console.log(cliReport(figures));
}
