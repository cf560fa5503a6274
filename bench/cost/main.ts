/**
 * Cost report (`npm run cost`, or `npx tsx bench/cost/main.ts [options]`): replays request traces
 * through the real allocation and reaper code on a virtual clock and reports backing-instance hours
 * for this pool (fullest first), Nodepool's policy (oldest first), one instance per job and the lower
 * bound, plus the effect of grace-time and min-retention-time. See bench/cost/README.md.
 */
import { fork } from 'node:child_process';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { cpus } from 'node:os';
import { basename, dirname, extname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { renderChart } from './chart.ts';
import { rateDispersion } from './dispersion.ts';
import { model } from './model.ts';
import {
  BENCH_MAX_READY,
  firstBootArrivals,
  frontierSvg,
  type ReadyTrace,
  type ReadyTraceJson,
  readyJson,
  readyPolicies,
  readySummary,
  readyTable,
  storedReadyRuns,
  storedToday,
} from './readiness.ts';
import { formatJson, hours, pct, ratio, secs, table } from './report.ts';
import {
  type BoundResult,
  DEFAULT_OPTIONS,
  lowerBound,
  type PolicyResult,
  perJob,
  type SimOptions,
  simulate,
} from './simulate.ts';
import {
  formatTraceCsv,
  parseTraceCsv,
  SYNTHETIC_KINDS,
  type SyntheticKind,
  steadyTrace,
  syntheticTrace,
  type Trace,
} from './traces.ts';
import type { Task, TaskReply } from './worker.ts';

const HERE = dirname(fileURLToPath(import.meta.url));
const DEFAULT_JOBS: Record<SyntheticKind, number> = { steady: 1000, bursty: 800, diurnal: 1200, batch: 1200 };
const GRACE_VALUES = [0, 60, 300, 600];
const MIN_RETENTION_VALUES = [0, 3600];
/** Arrival rates (jobs a minute) of the scale table, computed with the reference model. */
const SCALE_RATES = [1, 2, 4, 8, 16, 32];
const SCALE_HOURS = 12;
const AIM = 0.1;

const HELP = `Usage: npx tsx bench/cost/main.ts [options]

Without --trace: the synthetic traces steady, bursty and diurnal (written to bench/traces/<name>.csv).
  --trace FILE          a CSV trace (arrival_s,duration_s,label); repeatable; replaces the synthetic ones
  --seed N              seed of the synthetic traces (default 42)
  --jobs N              jobs per synthetic trace (default: steady 1000, bursty 800, diurnal 1200, batch 1200);
                        or per trace: --jobs batch=400 (the others keep their default)
  --slots N             max-parallel-jobs, slots per backing node (default 4)
  --boot S              seconds from launch to running (default 60)
  --tick S              reaper interval in seconds (default 10)
  --grace-trace NAME    the trace of the grace-time / min-retention table (default: bursty, else the first)
  --no-grace-table      skip that table
  --no-readiness        skip the ready-room comparison (static min-ready, grace-time, predictive)
  --readiness-only      only the ready-room comparison, today's policy taken from the existing results.json
                        (its run is deterministic); the traces' figures replace theirs in its 'readiness',
                        and 'summary' is made again from every trace there; the rest of the file is kept
  --only NAMES          only these synthetic traces (comma-separated)
  --ready-policies KEYS only these policies of the ready-room comparison (comma-separated keys, e.g.
                        "predictive 0.9,min-ready 2,ready grace 300"); with --readiness-only, the
                        others are kept as results.json has them
  --workers N           simulations in parallel, one process each (default: min(2, cores))
  --http                reach dynalite over loopback HTTP instead of in-process
  --out DIR             where the SVGs and results.json go (default bench/cost/out)
`;

/** One simulation to run: its task (sent to a worker) and where its result goes. */
interface SimRun {
  readonly task: Task;
  readonly trace: string;
  readonly what: string;
}

interface TraceFigures {
  readonly trace: Trace;
  readonly spanS: number;
  readonly bound: BoundResult;
  readonly perJob: PolicyResult;
  readonly runs: Map<string, PolicyResult>;
}

async function main(): Promise<void> {
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  const { values: args } = parseArgs({
    options: {
      trace: { type: 'string', multiple: true },
      seed: { type: 'string', default: '42' },
      jobs: { type: 'string' },
      slots: { type: 'string', default: String(DEFAULT_OPTIONS.slots) },
      boot: { type: 'string', default: String(DEFAULT_OPTIONS.bootS) },
      tick: { type: 'string', default: String(DEFAULT_OPTIONS.reaperTickS) },
      'grace-trace': { type: 'string' },
      'no-grace-table': { type: 'boolean', default: false },
      'no-readiness': { type: 'boolean', default: false },
      'readiness-only': { type: 'boolean', default: false },
      only: { type: 'string' },
      'ready-policies': { type: 'string' },
      workers: { type: 'string', default: String(Math.min(2, cpus().length)) },
      http: { type: 'boolean', default: false },
      out: { type: 'string', default: join(HERE, 'out') },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (args.help) {
    process.stdout.write(HELP);
    return;
  }
  const started = performance.now();
  const seed = intArg('--seed', args.seed);
  const base: SimOptions = {
    ...DEFAULT_OPTIONS,
    slots: intArg('--slots', args.slots, 1),
    bootS: numArg('--boot', args.boot),
    reaperTickS: numArg('--tick', args.tick),
  };
  const workers = intArg('--workers', args.workers, 1);
  const outDir = args.out;
  await mkdir(outDir, { recursive: true });

  // ---- traces ----
  const traces: Trace[] = [];
  if (args.trace?.length) {
    for (const file of args.trace) {
      traces.push(parseTraceCsv(await readFile(file, 'utf8'), basename(file, extname(file)), file));
    }
  } else {
    const dir = join(HERE, '..', 'traces');
    await mkdir(dir, { recursive: true });
    const only = args.only?.split(',');
    for (const kind of SYNTHETIC_KINDS.filter((k) => !only || only.includes(k))) {
      const jobs = jobsOf(kind, args.jobs);
      const trace = syntheticTrace(kind, seed, jobs);
      await writeFile(join(dir, `${kind}.csv`), formatTraceCsv(trace));
      traces.push(trace);
    }
  }
  const names = new Set<string>();
  for (const t of traces) {
    if (names.has(t.name)) throw new Error(`two traces are named ${t.name}`);
    names.add(t.name);
  }
  const readinessOnly = args['readiness-only'];
  const withReadiness = !args['no-readiness'] || readinessOnly;
  const graceTrace =
    args['no-grace-table'] || readinessOnly
      ? undefined
      : (args['grace-trace'] ?? (names.has('bursty') ? 'bursty' : traces[0]?.name));
  if (graceTrace !== undefined && !names.has(graceTrace)) throw new Error(`no trace named ${graceTrace}`);

  console.log(
    `Cost report: ${traces.length} trace(s); ${base.slots} slots per backing node, boot ${base.bootS} s, ` +
      `reaper every ${base.reaperTickS} s; ${workers} worker(s); dynalite ${args.http ? 'over HTTP' : 'in-process'}; ` +
      `${cpus().length} cores, Node ${process.version}\n`,
  );

  // ---- what to run ----
  const figures = new Map<string, TraceFigures>();
  const runs: SimRun[] = [];
  let nextId = 0;
  const resultsFile = join(outDir, 'results.json');
  // Today's policy from the last full run (deterministic: the same trace and settings give the same
  // run), when it ran the same jobs; else run again here (storedToday).
  const earlier = readinessOnly
    ? (JSON.parse(
        await readFile(resultsFile, 'utf8').catch(() => {
          throw new Error(`--readiness-only merges into the results.json of a full run: none in ${outDir}`);
        }),
      ) as {
        parameters?: Record<string, unknown>;
        traces: { name: string; jobs?: number; policies: { fullest?: Record<string, number> } }[];
        readiness?: { traces: ReadyTraceJson[] };
      })
    : undefined;
  // What it stored is for this run only if measured with the same seed and settings (another seed's
  // steady trace has as many jobs, and would pass for this one's).
  const settings = { seed, slots: base.slots, bootS: base.bootS, reaperTickS: base.reaperTickS };
  for (const [k, v] of Object.entries(settings)) {
    const was = earlier?.parameters?.[k];
    if (earlier && !(k === 'seed' && args.trace?.length) && was !== v) {
      throw new Error(
        `${resultsFile} was measured with ${k} ${String(was)}, this run has ${v}: use another --out`,
      );
    }
  }
  const add = (trace: Trace, what: string, options: SimOptions, series: boolean) =>
    runs.push({ task: { id: nextId++, trace, options, series }, trace: trace.name, what });
  for (const trace of traces) {
    const last = trace.jobs[trace.jobs.length - 1];
    figures.set(trace.name, {
      trace,
      spanS: last ? last.arrivalMs / 1000 : 0,
      bound: lowerBound(trace, base.slots),
      perJob: perJob(trace, base.bootS),
      runs: new Map(),
    });
    if (earlier && storedToday(earlier.traces, trace)) continue;
    add(trace, 'fullest', { ...base, policy: 'fullest' }, true);
    if (readinessOnly) continue;
    add(trace, 'oldest', { ...base, policy: 'oldest' }, true);
    add(trace, 'duration-exact', { ...base, policy: 'fullest', hints: 'exact' }, true);
    add(trace, 'duration-noisy', { ...base, policy: 'fullest', hints: 'noisy' }, true);
    add(trace, 'duration-learned', { ...base, policy: 'fullest', learned: true }, true);
  }
  if (withReadiness) {
    // The ready-room runs are the longest (the reaper every minute): first, the longest trace first.
    const readyRuns: SimRun[] = [];
    const longestFirst = [...traces].sort(
      (a, b) => (b.jobs.at(-1)?.arrivalMs ?? 0) - (a.jobs.at(-1)?.arrivalMs ?? 0),
    );
    for (const trace of longestFirst) {
      const wanted = args['ready-policies']?.split(',');
      for (const p of readyPolicies()) {
        if (p.kind === 'today' || (wanted && !wanted.includes(p.key))) continue;
        readyRuns.push({
          task: { id: nextId++, trace, options: p.options({ ...base, policy: 'fullest' }), series: false },
          trace: trace.name,
          what: p.key,
        });
      }
    }
    runs.unshift(...readyRuns);
  }
  const graceKey = (g: number, m: number) => `fullest grace ${g} min-ret ${m}`;
  if (graceTrace !== undefined) {
    const trace = figures.get(graceTrace)?.trace as Trace;
    for (const m of MIN_RETENTION_VALUES) {
      for (const g of GRACE_VALUES) {
        if (g === base.graceS && m === base.minRetentionS) continue; // the main run
        add(trace, graceKey(g, m), { ...base, policy: 'fullest', graceS: g, minRetentionS: m }, false);
      }
    }
  }

  for (const f of figures.values()) {
    const stored = earlier && storedToday(earlier.traces, f.trace);
    if (stored) f.runs.set('fullest', storedResult(stored));
    // With --ready-policies, the policies not run again are kept as the earlier run measured them.
    const wanted = args['ready-policies']?.split(',');
    if (earlier?.readiness && wanted) {
      for (const [key, r] of storedReadyRuns(earlier.readiness.traces, f.trace, (k) => !wanted.includes(k)))
        f.runs.set(key, r);
    }
  }

  // ---- run, reporting each trace as soon as its policies are in ----
  const modelChecks: { trace: string; what: string; agrees: boolean; detail: string }[] = [];
  let done = 0;
  const reported = new Set<string>();
  const charts: Promise<void>[] = [];
  await runAll(runs, workers, args.http, (run, result) => {
    done++;
    const f = figures.get(run.trace) as TraceFigures;
    f.runs.set(run.what, result);
    // The reference model knows fullest first and oldest first only: duration-aware and ready-room runs
    // (min-ready) are not checked.
    const checked =
      run.task.options.hints === undefined &&
      run.task.options.learned !== true &&
      run.task.options.readiness === undefined;
    const m = model(run.task.trace, run.task.options);
    const agrees =
      !checked ||
      (Math.abs(m.instanceSeconds - result.instanceSeconds) < 1e-6 &&
        m.backingLaunched === result.backingLaunched &&
        m.warmHits === result.warmHits);
    if (checked)
      modelChecks.push({
        trace: run.trace,
        what: run.what,
        agrees,
        detail: `model ${hours(m.instanceSeconds)} h / ${m.backingLaunched} launched, simulation ${hours(result.instanceSeconds)} h / ${result.backingLaunched}`,
      });
    const perCall = result.dynamodbCalls > 0 ? result.wallMs / result.dynamodbCalls : 0;
    console.log(
      `[${String(done).padStart(2)}/${runs.length}] ${run.trace} ${run.what}: ${(result.wallMs / 1000).toFixed(1)} s, ` +
        `${result.dynamodbCalls} DynamoDB calls (${(result.dynamodbCalls / run.task.trace.jobs.length).toFixed(1)}/job, ` +
        `${perCall.toFixed(2)} ms each); reference model ${checked ? (agrees ? 'agrees' : `DISAGREES (${modelChecks.at(-1)?.detail})`) : 'not applicable'}`,
    );
    const complete = ['fullest', 'oldest', 'duration-exact', 'duration-noisy', 'duration-learned'].every(
      (k) => f.runs.has(k),
    );
    if (!reported.has(run.trace) && complete && !readinessOnly) {
      reported.add(run.trace);
      console.log(`\n${traceTable(f, base)}\n`);
      const file = join(outDir, `${run.trace}.svg`);
      charts.push(
        writeFile(file, svgOf(f, base)).then(() => console.log(`chart: ${relative(process.cwd(), file)}\n`)),
      );
    }
  });
  await Promise.all(charts);

  // ---- ready room, side by side (issue 27) ----
  const readyTraces: ReadyTrace[] = withReadiness
    ? [...figures.values()].map((f) => ({
        name: f.trace.name,
        jobs: f.trace.jobs.length,
        bound: f.bound.instanceSeconds,
        runs: f.runs,
        firstBoot: firstBootArrivals(
          f.trace.jobs.map((j) => j.arrivalMs),
          base.bootS,
        ),
        dispersion: rateDispersion(f.trace.jobs.map((j) => j.arrivalMs)),
      }))
    : [];
  for (const t of readyTraces) {
    console.log(`${readyTable(t)}\n`);
    const file = join(outDir, `${t.name}-frontier.svg`);
    await writeFile(
      file,
      frontierSvg(
        t,
        `${base.slots} slots per backing node, boot ${base.bootS} s; min-ready and predictive: reaper every 60 s, max-ready ${BENCH_MAX_READY}`,
      ),
    );
    console.log(`chart: ${relative(process.cwd(), file)}\n`);
  }
  // Merged with the traces an earlier --readiness-only run measured, in the synthetic traces' order.
  const readyJsons = [
    ...(earlier?.readiness?.traces ?? []).filter((t) => !readyTraces.some((n) => n.name === t.name)),
    ...readyTraces.map(readyJson),
  ].sort((a, b) => order(a.name) - order(b.name));
  const complete =
    readyJsons.length > 0 && readyJsons.every((t) => t.policies.some((p) => p.policy === 'predictive (0.9)'));
  const summary = complete ? readySummary(readyJsons, SYNTHETIC_KINDS) : undefined;
  for (const row of summary ?? []) console.log(`${row.figure}: ${row.measured} (aim ${row.aim}: ${row.met})`);
  const readinessJson =
    readyJsons.length === 0
      ? undefined
      : {
          date: new Date().toISOString(),
          maxReady: BENCH_MAX_READY,
          reaperEveryS: 60,
          note: 'min-ready and predictive runs end billing when the last job ends (ready room held then is not billed beyond the trace)',
          traces: readyJsons,
        };
  if (readinessOnly) {
    // This run's traces on their own too, and merged with what the file holds now (another run may have
    // written it meanwhile).
    await writeFile(
      join(outDir, `readiness-${readyTraces.map((t) => t.name).join('-')}.json`),
      formatJson(readyTraces.map(readyJson)),
    );
    const kept = JSON.parse(await readFile(resultsFile, 'utf8')) as Record<string, unknown> & {
      readiness?: { traces: ReadyTraceJson[] };
    };
    const merged = [
      ...(kept.readiness?.traces ?? []).filter((t) => !readyTraces.some((n) => n.name === t.name)),
      ...readyTraces.map(readyJson),
    ].sort((a, b) => order(a.name) - order(b.name));
    const all = merged.every((t) => t.policies.some((p) => p.policy === 'predictive (0.9)'));
    const mergedSummary = merged.length > 0 && all ? readySummary(merged, SYNTHETIC_KINDS) : undefined;
    for (const row of mergedSummary ?? [])
      console.log(`${row.figure}: ${row.measured} (aim ${row.aim}: ${row.met})`);
    await writeFile(
      resultsFile,
      formatJson({ ...kept, readiness: { ...readinessJson, traces: merged }, summary: mergedSummary }),
    );
    console.log(`results: ${relative(process.cwd(), resultsFile)} (readiness and summary replaced)`);
    return;
  }

  // ---- grace-time / min-retention ----
  let graceRows: GraceRow[] = [];
  if (graceTrace !== undefined) {
    const f = figures.get(graceTrace) as TraceFigures;
    graceRows = MIN_RETENTION_VALUES.flatMap((m) =>
      GRACE_VALUES.map((g) => {
        const r = (
          g === base.graceS && m === base.minRetentionS ? f.runs.get('fullest') : f.runs.get(graceKey(g, m))
        ) as PolicyResult;
        return {
          graceS: g,
          minRetentionS: m,
          result: r,
          bound: f.bound.instanceSeconds,
          jobs: f.trace.jobs.length,
        };
      }),
    );
    console.log(
      `grace-time x min-retention-time on ${graceTrace} (fullest first; otherwise as above)\n${graceTable(graceRows)}\n`,
    );
  }

  // ---- how the gap shrinks with the pool's size (reference model; with the synthetic traces) ----
  const scale = args.trace?.length
    ? []
    : SCALE_RATES.map((rate) => {
        const trace = steadyTrace(seed, rate * 60 * SCALE_HOURS, rate);
        const bound = lowerBound(trace, base.slots).instanceSeconds;
        const m = model(trace, { ...base, policy: 'fullest' });
        const busyMs = trace.jobs.reduce((s, j) => s + j.durationMs, 0);
        return {
          perMinute: rate,
          jobs: trace.jobs.length,
          meanNodesInUse: busyMs / (trace.jobs.at(-1)?.arrivalMs ?? 1),
          ratio: m.instanceSeconds / bound,
        };
      });
  if (scale.length > 0) {
    console.log(
      `Steady traces, ${SCALE_HOURS} h of arrivals at other rates (fullest first, grace-time 0; reference model, not the real code):\n${table(
        ['arrivals/min', 'jobs', 'mean nodes in use', 'x bound'],
        scale.map((s) => [String(s.perMinute), String(s.jobs), s.meanNodesInUse.toFixed(1), ratio(s.ratio)]),
      )}\n`,
    );
  }

  // ---- aims and the results file ----
  const wallS = (performance.now() - started) / 1000;
  const aimRows = [...figures.values()].map((f) => {
    const r = (f.runs.get('fullest') as PolicyResult).instanceSeconds / f.bound.instanceSeconds;
    return { trace: f.trace.name, ratio: r, met: r <= 1 + AIM };
  });
  console.log(
    `Aim: fullest first within ${AIM * 100}% of the lower bound at grace-time 0: ${aimRows
      .map((a) => `${a.trace} ${ratio(a.ratio)} ${a.met ? 'met' : 'NOT met'}`)
      .join('; ')}`,
  );
  const disagreements = modelChecks.filter((c) => !c.agrees);
  console.log(
    disagreements.length === 0
      ? `Reference model: agrees with all ${modelChecks.length} simulations.`
      : `Reference model: DISAGREES with ${disagreements.length} of ${modelChecks.length} simulations.`,
  );
  await writeFile(
    resultsFile,
    formatJson({
      machine: {
        cpus: cpus().length,
        node: process.version,
        platform: `${process.platform}-${process.arch}`,
      },
      date: new Date().toISOString(),
      wallSeconds: round(wallS, 1),
      workers,
      transport: args.http ? 'http' : 'in-process',
      parameters: {
        seed: args.trace?.length ? undefined : seed,
        slots: base.slots,
        bootS: base.bootS,
        reaperTickS: base.reaperTickS,
        graceS: base.graceS,
        minRetentionS: base.minRetentionS,
      },
      traces: [...figures.values()].map((f) => traceJson(f, base)),
      graceTable:
        graceTrace === undefined
          ? undefined
          : {
              trace: graceTrace,
              policy: 'fullest',
              rows: graceRows.map((r) => ({
                graceS: r.graceS,
                minRetentionS: r.minRetentionS,
                ...policyJson(r.result, r.bound),
              })),
            },
      scaleByReferenceModel:
        scale.length === 0
          ? undefined
          : scale.map((s) => ({
              arrivalsPerMinute: s.perMinute,
              jobs: s.jobs,
              meanNodesInUse: round(s.meanNodesInUse, 1),
              ratioToLowerBound: round(s.ratio, 4),
            })),
      aim: { withinOfLowerBound: AIM, traces: aimRows.map((a) => ({ ...a, ratio: round(a.ratio, 4) })) },
      referenceModel: { simulations: modelChecks.length, disagreements },
      readiness: readinessJson,
      summary,
    }),
  );
  console.log(`results: ${relative(process.cwd(), resultsFile)}; total ${wallS.toFixed(1)} s`);
  if (disagreements.length > 0) process.exitCode = 1;
}

// ---- running the simulations ----------------------------------------------------------------------

/** Runs the simulations, in order, on `workers` child processes (or here when 1), reporting each result. */
async function runAll(
  runs: readonly SimRun[],
  workers: number,
  http: boolean,
  onDone: (run: SimRun, result: PolicyResult) => void,
): Promise<void> {
  if (workers <= 1) {
    const engine = await startInProcessDynalite({ http });
    try {
      for (const run of runs) {
        const { trace, options, series } = run.task;
        onDone(run, await simulate(engine, trace, options, { series }));
      }
    } finally {
      await engine.close();
    }
    return;
  }
  const queue = [...runs];
  const workerPath = fileURLToPath(new URL('./worker.ts', import.meta.url));
  const children = Array.from({ length: Math.min(workers, runs.length) }, () =>
    fork(workerPath, [], { env: { ...process.env, COST_SIM_HTTP: http ? '1' : '0' } }),
  );
  try {
    await Promise.all(
      children.map(
        (child) =>
          new Promise<void>((resolve, reject) => {
            let current: SimRun | undefined;
            const next = () => {
              current = queue.shift();
              if (current) child.send(current.task);
              else child.disconnect();
            };
            child.on('message', (reply: TaskReply) => {
              const run = current as SimRun;
              if ('error' in reply) {
                current = undefined;
                reject(new Error(`${run.trace} ${run.what}: ${reply.error}`));
                return;
              }
              onDone(run, reply.result);
              next();
            });
            child.on('exit', (code) => {
              if (current)
                reject(new Error(`a worker exited (${code}) during ${current.trace} ${current.what}`));
              else resolve();
            });
            next();
          }),
      ),
    );
  } finally {
    for (const child of children) if (child.exitCode === null) child.kill();
  }
}

// ---- tables ---------------------------------------------------------------------------------------

function traceTable(f: TraceFigures, o: SimOptions): string {
  const bound = f.bound.instanceSeconds;
  const fullest = f.runs.get('fullest') as PolicyResult;
  const oldest = f.runs.get('oldest') as PolicyResult;
  const exact = f.runs.get('duration-exact') as PolicyResult;
  const noisy = f.runs.get('duration-noisy') as PolicyResult;
  const learned = f.runs.get('duration-learned') as PolicyResult;
  const n = f.trace.jobs.length;
  const row = (name: string, r: PolicyResult) => [
    name,
    hours(r.instanceSeconds),
    ratio(r.instanceSeconds / bound),
    secs(r.waitS.mean),
    secs(r.waitS.p95),
    String(r.backingLaunched),
    pct(r.warmHits, n),
  ];
  const rightSized = f.perJob.instanceSeconds / o.slots;
  const lines = [
    `${f.trace.name}: ${f.trace.source}; ${(f.spanS / 3600).toFixed(1)} h of arrivals; ${o.slots} slots per backing node, boot ${o.bootS} s, grace-time ${o.graceS} s, min-retention ${o.minRetentionS} s, reaper every ${o.reaperTickS} s`,
    table(
      ['policy', 'instance-h', 'x bound', 'wait mean', 'wait p95', 'launched', 'no wait'],
      [
        row('(a) metastatic: fullest first', fullest),
        row('(b) Nodepool: oldest first', oldest),
        row('(c) one instance per job', f.perJob),
        ['(d) lower bound', hours(bound), ratio(1), '-', '-', '-', '-'],
        row('(e) duration-aware, exact hints', exact),
        row('(f) duration-aware, noisy hints (x0.5-2)', noisy),
        row('(g) duration-aware, learned (no hints)', learned),
      ],
    ),
    `(e) / (b): ${ratio(exact.instanceSeconds / oldest.instanceSeconds)} instance-hours, ${ratio(exact.waitS.mean / oldest.waitS.mean)} mean wait; (f) / (b): ${ratio(noisy.instanceSeconds / oldest.instanceSeconds)}, ${ratio(noisy.waitS.mean / oldest.waitS.mean)}; (g) / (b): ${ratio(learned.instanceSeconds / oldest.instanceSeconds)}, ${ratio(learned.waitS.mean / oldest.waitS.mean)}`,
    ...[
      ['(a)', fullest],
      ['(b)', oldest],
      ['(e)', exact],
      ['(f)', noisy],
      ['(g)', learned],
    ].map(([name, r]) => `${name} over (d): ${gapText(r as PolicyResult, bound)}`),
    `(b) placements that found >= 10 backing nodes with a free slot (oldest-first then holds only among the 10 fullest, see Context.placementPolicy): ${oldest.fullCandidatePages} of ${n}`,
    `(c) with instances 1/${o.slots} the size (price in proportion): ${hours(rightSized)} backing-node-hours, ${ratio(rightSized / bound)} x (d) (another machine: not bound by (d))`,
  ];
  return lines.join('\n');
}

function gapText(r: PolicyResult, bound: number): string {
  const g = gapParts(r, bound);
  return `+${hours(r.instanceSeconds - bound)} h = waiting for boots ${hours(g.waiting)} + idle (grace, min-retention, reaper grid) ${hours(g.idle)} + fragmentation ${hours(g.fragmentation)}`;
}

function gapParts(r: PolicyResult, bound: number) {
  return {
    waiting: r.gap.heldBoundSeconds - bound,
    idle: r.gap.idleSeconds,
    fragmentation: r.instanceSeconds - r.gap.heldBoundSeconds - r.gap.idleSeconds,
  };
}

interface GraceRow {
  readonly graceS: number;
  readonly minRetentionS: number;
  readonly result: PolicyResult;
  readonly bound: number;
  readonly jobs: number;
}

function graceTable(rows: readonly GraceRow[]): string {
  return table(
    ['grace-time', 'min-retention', 'instance-h', 'x bound', 'wait mean', 'wait p95', 'launched', 'no wait'],
    rows.map((r) => [
      `${r.graceS} s`,
      `${r.minRetentionS} s`,
      hours(r.result.instanceSeconds),
      ratio(r.result.instanceSeconds / r.bound),
      secs(r.result.waitS.mean),
      secs(r.result.waitS.p95),
      String(r.result.backingLaunched),
      pct(r.result.warmHits, r.jobs),
    ]),
  );
}

function svgOf(f: TraceFigures, o: SimOptions): string {
  const bound = f.bound.instanceSeconds;
  const panel = (title: string, r: PolicyResult) => ({
    title: `${title}: ${hours(r.instanceSeconds)} instance-h, ${ratio(r.instanceSeconds / bound)} x bound, mean wait ${secs(r.waitS.mean)}, ${r.backingLaunched} launched`,
    backing: r.backing ?? { t: [0], v: [0] },
    inUse: r.inUse ?? { t: [0], v: [0] },
  });
  return renderChart({
    title: `${f.trace.name}: nodes in use and backing nodes over time`,
    subtitle: `${f.trace.source}; ${o.slots} slots per backing node, boot ${o.bootS} s, grace-time ${o.graceS} s, reaper every ${o.reaperTickS} s; lower bound ${hours(bound)} instance-h`,
    bound: f.bound.series,
    slots: o.slots,
    panels: [
      panel('(a) metastatic: fullest first', f.runs.get('fullest') as PolicyResult),
      panel('(b) Nodepool: oldest first', f.runs.get('oldest') as PolicyResult),
      panel('(c) one instance per job', f.perJob),
      panel('(e) duration-aware, exact hints', f.runs.get('duration-exact') as PolicyResult),
      panel('(f) duration-aware, noisy hints', f.runs.get('duration-noisy') as PolicyResult),
      panel('(g) duration-aware, learned', f.runs.get('duration-learned') as PolicyResult),
    ],
  });
}

// ---- results.json ---------------------------------------------------------------------------------

function traceJson(f: TraceFigures, o: SimOptions) {
  const bound = f.bound.instanceSeconds;
  return {
    name: f.trace.name,
    source: f.trace.source,
    jobs: f.trace.jobs.length,
    arrivalSpanHours: round(f.spanS / 3600, 2),
    lowerBoundHours: round(bound / 3600, 4),
    policies: {
      fullest: policyJson(f.runs.get('fullest') as PolicyResult, bound),
      oldest: policyJson(f.runs.get('oldest') as PolicyResult, bound),
      durationAwareExact: policyJson(f.runs.get('duration-exact') as PolicyResult, bound),
      durationAwareNoisy: policyJson(f.runs.get('duration-noisy') as PolicyResult, bound),
      durationAwareLearned: policyJson(f.runs.get('duration-learned') as PolicyResult, bound),
      perJob: policyJson(f.perJob, bound),
      perJobRightSized: {
        backingNodeHours: round(f.perJob.instanceSeconds / o.slots / 3600, 4),
        ratioToLowerBound: round(f.perJob.instanceSeconds / o.slots / bound, 4),
      },
    },
  };
}

function policyJson(r: PolicyResult, bound: number) {
  const simulated = r.dynamodbCalls > 0;
  const g = gapParts(r, bound);
  return {
    instanceHours: round(r.instanceSeconds / 3600, 4),
    ratioToLowerBound: round(r.instanceSeconds / bound, 4),
    waitMeanS: round(r.waitS.mean, 2),
    waitP95S: round(r.waitS.p95, 2),
    waitMaxS: round(r.waitS.max, 2),
    backingLaunched: r.backingLaunched,
    noWait: r.warmHits,
    ...(simulated
      ? {
          gapHours: {
            waitingForBoots: round(g.waiting / 3600, 4),
            idle: round(g.idle / 3600, 4),
            fragmentation: round(g.fragmentation / 3600, 4),
          },
          capacityRetries: r.capacityRetries,
          fullCandidatePages: r.fullCandidatePages,
          dynamodbCalls: r.dynamodbCalls,
          wallSeconds: round(r.wallMs / 1000, 1),
        }
      : {}),
  };
}

// ---- helpers --------------------------------------------------------------------------------------

/** A synthetic trace's place in the report (others after them). */
function order(name: string): number {
  const i = (SYNTHETIC_KINDS as readonly string[]).indexOf(name);
  return i < 0 ? SYNTHETIC_KINDS.length : i;
}

/** Today's policy as the last full run stored it (what the ready-room comparison reads of it). */
function storedResult(p: Record<string, number>): PolicyResult {
  const n = (k: string) => Number(p[k] ?? 0);
  return {
    instanceSeconds: n('instanceHours') * 3600,
    backingLaunched: n('backingLaunched'),
    waitS: { mean: n('waitMeanS'), p95: n('waitP95S'), max: n('waitMaxS') },
    warmHits: n('noWait'),
    capacityRetries: n('capacityRetries'),
    dynamodbCalls: n('dynamodbCalls'),
    fullCandidatePages: n('fullCandidatePages'),
    wallMs: n('wallSeconds') * 1000,
    gap: { idleSeconds: 0, heldBoundSeconds: 0 },
  };
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

function numArg(name: string, text: string | undefined): number {
  const n = Number(text);
  if (text === undefined || text === '' || !Number.isFinite(n) || n < 0) {
    throw new Error(`${name} must be a number >= 0, got "${text}"`);
  }
  return n;
}

/**
 * Jobs of a synthetic trace: `--jobs N` for every trace, or `--jobs batch=400,steady=500` for the ones
 * named (the others keep their default: a run that must fit in a time cuts its longest trace only).
 */
function jobsOf(kind: SyntheticKind, text: string | undefined): number {
  if (text === undefined) return DEFAULT_JOBS[kind];
  if (!text.includes('=')) return intArg('--jobs', text, 1);
  for (const part of text.split(',')) {
    const [name, n] = part.split('=');
    if (!SYNTHETIC_KINDS.includes(name as SyntheticKind)) throw new Error(`--jobs: no trace named ${name}`);
    if (name === kind) return intArg(`--jobs ${name}`, n, 1);
  }
  return DEFAULT_JOBS[kind];
}

function intArg(name: string, text: string | undefined, min = 0): number {
  const n = numArg(name, text);
  if (!Number.isInteger(n) || n < min) throw new Error(`${name} must be an integer >= ${min}, got "${text}"`);
  return n;
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? (err.stack ?? err.message) : err);
  process.exitCode = 1;
});
