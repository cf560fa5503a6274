/**
 * Merges the per-run readiness files (`out/readiness-<traces>.json`, written by `--readiness-only`
 * runs made separately) into `out/results.json`'s `readiness`, and makes its `summary` again from them:
 * `npx tsx bench/cost/mergeReadiness.ts out/readiness-<traces>.json out/readiness-<others>.json`, each
 * trace in one of the files only.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BENCH_MAX_READY, type ReadyTraceJson, readySummary } from './readiness.ts';
import { formatJson } from './report.ts';
import { SYNTHETIC_KINDS } from './traces.ts';

async function main(): Promise<void> {
  const file = join(dirname(fileURLToPath(import.meta.url)), 'out', 'results.json');
  const kept = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
  const traces: ReadyTraceJson[] = [];
  for (const part of process.argv.slice(2))
    traces.push(...(JSON.parse(await readFile(part, 'utf8')) as ReadyTraceJson[]));
  const order = (n: string) => (SYNTHETIC_KINDS as readonly string[]).indexOf(n);
  traces.sort((a, b) => order(a.name) - order(b.name));
  const summary = readySummary(traces, SYNTHETIC_KINDS);
  for (const row of summary) console.log(`${row.figure}: ${row.measured} (aim ${row.aim}: ${row.met})`);
  const readiness = {
    date: new Date().toISOString(),
    maxReady: BENCH_MAX_READY,
    reaperEveryS: 60,
    note: 'min-ready and predictive runs end billing when the last job ends (ready room held then is not billed beyond the trace)',
    traces,
  };
  await writeFile(file, formatJson({ ...kept, readiness, summary }));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
