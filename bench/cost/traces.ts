/**
 * Request traces: what the simulator replays. A trace is a list of jobs, each asking for one node of a
 * label at an arrival time and keeping it for a duration once it is ready.
 *
 * CSV format (`--trace FILE`): a header line `arrival_s,duration_s,label` (optionally `,requestor`), then
 * one job per line.
 *   arrival_s   seconds since the start of the trace (decimals allowed; millisecond resolution)
 *   duration_s  seconds the job runs once its node is ready (> 0)
 *   label       the metastatic label it asks for (may be left empty: `small`)
 *   requestor   who asks (a CI job's name): the pool learns durations per label and requestor
 * Blank lines and lines starting with `#` are ignored; rows need not be sorted.
 */
import { Rng } from './prng.ts';

export interface Job {
  /** 0-based position in arrival order; request id `job-<index>`. */
  readonly index: number;
  /** Milliseconds since the start of the trace. */
  readonly arrivalMs: number;
  readonly durationMs: number;
  readonly label: string;
  /** Who asks (the request's `requestor`): durations are learned per requestor too. */
  readonly requestor?: string;
}

export interface Trace {
  readonly name: string;
  /** How it was made: `synthetic <kind> seed <n>` or the CSV path. */
  readonly source: string;
  readonly jobs: readonly Job[];
}

export const DEFAULT_LABEL = 'small';
const HEADER = 'arrival_s,duration_s,label';
const HEADER_WITH_REQUESTOR = `${HEADER},requestor`;
type Row = { arrivalMs: number; durationMs: number; label: string; requestor?: string };

/** Sorts by arrival (stable) and numbers the jobs. */
export function makeTrace(name: string, source: string, rows: readonly Row[]): Trace {
  const sorted = rows.map((r, i) => ({ ...r, i })).sort((a, b) => a.arrivalMs - b.arrivalMs || a.i - b.i);
  return {
    name,
    source,
    jobs: sorted.map((r, index) => ({
      index,
      arrivalMs: r.arrivalMs,
      durationMs: r.durationMs,
      label: r.label,
      ...(r.requestor ? { requestor: r.requestor } : {}),
    })),
  };
}

export function parseTraceCsv(text: string, name: string, source = name): Trace {
  const lines = text.split(/\r?\n/);
  const rows: Row[] = [];
  let headerSeen = false;
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    const where = `${source}:${i + 1}`;
    if (!headerSeen) {
      const cols = line.split(',').map((c) => c.trim());
      if (
        cols[0] !== 'arrival_s' ||
        cols[1] !== 'duration_s' ||
        (cols[2] ?? 'label') !== 'label' ||
        (cols[3] ?? 'requestor') !== 'requestor' ||
        cols.length > 4
      ) {
        throw new Error(
          `${where}: expected the header "${HEADER}" or "${HEADER_WITH_REQUESTOR}", got "${line}"`,
        );
      }
      headerSeen = true;
      return;
    }
    const [a = '', d = '', l = '', who = ''] = line.split(',').map((c) => c.trim());
    const arrival = Number(a);
    const duration = Number(d);
    if (a === '' || !Number.isFinite(arrival) || arrival < 0) {
      throw new Error(`${where}: arrival_s must be a number >= 0, got "${a}"`);
    }
    if (d === '' || !Number.isFinite(duration) || duration <= 0) {
      throw new Error(`${where}: duration_s must be a number > 0, got "${d}"`);
    }
    const durationMs = Math.max(1, Math.round(duration * 1000));
    rows.push({
      arrivalMs: Math.round(arrival * 1000),
      durationMs,
      label: l === '' ? DEFAULT_LABEL : l,
      ...(who === '' ? {} : { requestor: who }),
    });
  });
  if (!headerSeen) throw new Error(`${source}: empty trace (expected the header "${HEADER}")`);
  if (rows.length === 0) throw new Error(`${source}: the trace has no jobs`);
  return makeTrace(name, source, rows);
}

export function formatTraceCsv(trace: Trace): string {
  const withRequestor = trace.jobs.some((j) => j.requestor !== undefined);
  const lines = [
    `# ${trace.name}: ${trace.source}; ${trace.jobs.length} jobs`,
    withRequestor ? HEADER_WITH_REQUESTOR : HEADER,
  ];
  for (const j of trace.jobs) {
    const base = `${(j.arrivalMs / 1000).toFixed(3)},${(j.durationMs / 1000).toFixed(3)},${j.label}`;
    lines.push(withRequestor ? `${base},${j.requestor ?? ''}` : base);
  }
  return `${lines.join('\n')}\n`;
}

// ---- synthetic traces ------------------------------------------------------------------------------

export type SyntheticKind = 'steady' | 'bursty' | 'diurnal' | 'batch';
export const SYNTHETIC_KINDS: readonly SyntheticKind[] = ['steady', 'bursty', 'diurnal', 'batch'];

/**
 * Job runtimes of the Lublin-Feitelson workload model, batch jobs (U. Lublin and D. G. Feitelson, "The
 * workload on parallel supercomputers: modeling the characteristics of rigid jobs", J. Parallel and
 * Distributed Computing 63(11):1105-1122, 2003; fitted to logs of production machines of the Parallel
 * Workloads Archive). The natural log of a runtime in seconds is hyper-Gamma: Gamma(a1, b1) with
 * probability p, else Gamma(a2, b2), where p = pa * nodes + pb (clamped to [0, 1]) falls with the job's
 * width; a draw above 12 (exp(12) s, ~45 h) is drawn again. Values as in the model's reference code
 * (Uri Lublin's m_lublin99.c, in the copy shipped with the Calana generator, BackupTheBerlios/cgwg-svn,
 * and its Java port in the GridSim toolkit, gridsim.parallel.util.WorkloadLublin99; both agree).
 */
export const LUBLIN_BATCH = { a1: 6.57, b1: 0.823, a2: 639.1, b2: 0.0156, pa: -0.003, pb: 0.6986 } as const;
/** The model's cap: a log-runtime above this is drawn again (TOO_MUCH_TIME). */
const LUBLIN_MAX_LOG_SECONDS = 12;

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

/** A CI-like job duration: log-normal, clipped to [30 s, 2 h]. */
function duration(rng: Rng, medianMin: number, sigma: number): number {
  const ms = rng.logNormal(medianMin * MINUTE, sigma);
  return Math.round(Math.min(2 * HOUR, Math.max(30_000, ms)));
}

/**
 * Deterministic for (kind, seed, jobs):
 * - steady: Poisson arrivals, 2 a minute; durations median 8 min (mean ~11 min): ~22 nodes in use.
 * - bursty: bursts (a push fanning out 8-40 jobs within 90 s) every ~20 min (exponential), plus a
 *   trickle of single jobs (one every ~4 min); durations median 6 min.
 * - diurnal: one day from midnight; the arrival rate follows a raised cosine, cubed, peaking at 14:00
 *   with the night at 1/24 of the peak (non-homogeneous Poisson by thinning), scaled so that `jobs`
 *   arrivals are expected (for 1200: peak 2.4/min, night 0.1/min); durations median 10 min.
 */
export function syntheticTrace(kind: SyntheticKind, seed: number, jobs: number): Trace {
  if (kind === 'steady') return steadyTrace(seed, jobs, 2);
  if (kind === 'batch') return batchTrace(seed, jobs);
  const rng = new Rng(seed);
  const rows: { arrivalMs: number; durationMs: number; label: string }[] = [];
  const push = (arrivalMs: number, durationMs: number) =>
    rows.push({ arrivalMs: Math.round(arrivalMs), durationMs, label: DEFAULT_LABEL });
  if (kind === 'bursty') {
    let nextBurst = rng.exponential(5 * MINUTE);
    let nextSingle = rng.exponential(4 * MINUTE);
    while (rows.length < jobs) {
      if (nextBurst <= nextSingle) {
        const size = rng.int(8, 40);
        for (let i = 0; i < size && rows.length < jobs; i++) {
          push(nextBurst + rng.between(0, 90_000), duration(rng, 6, 0.7));
        }
        nextBurst += rng.exponential(20 * MINUTE);
      } else {
        push(nextSingle, duration(rng, 6, 0.7));
        nextSingle += rng.exponential(4 * MINUTE);
      }
    }
  } else {
    // One day: the expected number of arrivals is `jobs` (the actual count varies around it).
    const day = 24 * HOUR;
    const nightShare = 1 / 24; // the night's rate, as a share of the peak's
    const shape = (t: number) => {
      const phase = ((t - 14 * HOUR) / day) * 2 * Math.PI; // 0 at 14:00
      return nightShare + (1 - nightShare) * ((1 + Math.cos(phase)) / 2) ** 3;
    };
    const meanShape = nightShare + (1 - nightShare) * (5 / 16); // the mean of cos^6 over a period is 5/16
    const peakPerMs = jobs / (day * meanShape);
    for (let t = rng.exponential(1 / peakPerMs); t < day; t += rng.exponential(1 / peakPerMs)) {
      if (rng.uniform() <= shape(t)) push(t, duration(rng, 10, 0.8));
    }
  }
  const size = kind === 'diurnal' ? `${rows.length} jobs (${jobs} expected)` : `${jobs} jobs`;
  return makeTrace(kind, `synthetic ${kind}, seed ${seed}, ${size}`, rows);
}

/** The steady trace at another arrival rate (jobs a minute); durations as in `steady`. */
export function steadyTrace(seed: number, jobs: number, perMinute: number): Trace {
  const rng = new Rng(seed);
  const rows: { arrivalMs: number; durationMs: number; label: string }[] = [];
  let t = 0;
  while (rows.length < jobs) {
    t += rng.exponential(MINUTE / perMinute);
    rows.push({ arrivalMs: Math.round(t), durationMs: duration(rng, 8, 0.8), label: DEFAULT_LABEL });
  }
  const name = perMinute === 2 ? 'steady' : `steady-${perMinute}pm`;
  return makeTrace(name, `synthetic steady, ${perMinute}/min, seed ${seed}, ${jobs} jobs`, rows);
}

/** Requestors per population in the batch trace: the names of the jobs of one kind. */
const BATCH_NAMES = 5;
/** Arrivals a minute in the batch trace: ~22 nodes in use, as the other traces. */
const BATCH_PER_MINUTE = 0.16;

/**
 * `batch`: job runtimes drawn from the Lublin-Feitelson model (LUBLIN_BATCH, one-node jobs: p = 0.6956),
 * Poisson arrivals at BATCH_PER_MINUTE. Its two Gamma components are two populations of jobs (minutes,
 * spread over orders of magnitude, and ~6 h ones); each job's requestor names its population and one of
 * BATCH_NAMES jobs in it (`short-3`, `long-0`), as job names tell a quick job from a long one: what a
 * pool can learn per requestor. Runtimes are kept as the model draws them (at least 1 s).
 */
export function batchTrace(seed: number, jobs: number): Trace {
  const rng = new Rng(seed);
  const m = LUBLIN_BATCH;
  const p = Math.min(1, Math.max(0, m.pa * 1 + m.pb));
  const rows: Row[] = [];
  let t = 0;
  while (rows.length < jobs) {
    t += rng.exponential(MINUTE / BATCH_PER_MINUTE);
    const short = rng.uniform() <= p;
    let logSeconds: number;
    do logSeconds = short ? rng.gamma(m.a1, m.b1) : rng.gamma(m.a2, m.b2);
    while (logSeconds > LUBLIN_MAX_LOG_SECONDS);
    rows.push({
      arrivalMs: Math.round(t),
      durationMs: Math.max(1_000, Math.round(Math.exp(logSeconds) * 1000)),
      label: DEFAULT_LABEL,
      requestor: `${short ? 'short' : 'long'}-${rng.int(0, BATCH_NAMES - 1)}`,
    });
  }
  return makeTrace(
    'batch',
    `Lublin-Feitelson batch runtimes (2003), ${BATCH_PER_MINUTE}/min, seed ${seed}, ${jobs} jobs`,
    rows,
  );
}
