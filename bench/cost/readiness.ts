/**
 * Ready room, side by side (issue 27): today's policy (grace-time 0), static min-ready, grace-time and
 * the predictive policy (min-ready: auto) on each trace, with the same seeds; the three summary rows of
 * results.json; a chart per trace of the frontier (instance-hours against the share of requests served
 * without waiting for a boot).
 */
import { DISPERSION_WINDOW_S } from './dispersion.ts';
import { hours, pct, ratio, secs, table } from './report.ts';
import type { PolicyResult, SimOptions } from './simulate.ts';

/**
 * The static min-ready values compared: every value up to 4 (where the predictive policy's shares fall,
 * so that "the cheapest static setting reaching the same share" is not a coarse grid's step), and 8.
 */
export const STATIC_MIN_READY = [1, 2, 3, 4, 8] as const;
export const READY_GRACE = [60, 300, 600] as const;
export const PREDICTIVE_SHARES = [0.8, 0.9, 0.95] as const;
/** max-ready of the predictive runs. */
export const BENCH_MAX_READY = 20;
/**
 * Request containers of the predictive run on Lambda's shape (issue 40): the request function in this
 * many containers, the fulfil function and the reaper in one each (simulate.ts `Containers`).
 */
export const LAMBDA_REQUEST_CONTAINERS = 4;
/** The share of the one-process run's served-without-a-wait that the containers' run must keep. */
export const CONTAINERS_AIM = 0.98;

export interface ReadyPolicy {
  /** Key of its run in TraceFigures.runs. */
  readonly key: string;
  readonly label: string;
  readonly kind: 'today' | 'min-ready' | 'grace-time' | 'predictive' | 'lambda';
  readonly options: (base: SimOptions) => SimOptions;
}

/** Every policy of the comparison; 'fullest' is today's run (the main table's (a)). */
export function readyPolicies(): ReadyPolicy[] {
  return [
    { key: 'fullest', label: "today's policy (grace-time 0)", kind: 'today', options: (b) => b },
    ...STATIC_MIN_READY.map(
      (n): ReadyPolicy => ({
        key: `min-ready ${n}`,
        label: `min-ready ${n}`,
        kind: 'min-ready',
        options: (b) => ({ ...b, readiness: { kind: 'static', minReady: n } }),
      }),
    ),
    ...READY_GRACE.map(
      (g): ReadyPolicy => ({
        key: `ready grace ${g}`,
        label: `grace-time ${g} s`,
        kind: 'grace-time',
        options: (b) => ({ ...b, graceS: g }),
      }),
    ),
    ...PREDICTIVE_SHARES.map(
      (share): ReadyPolicy => ({
        key: `predictive ${share}`,
        label: `predictive (${share})`,
        kind: 'predictive',
        options: (b) => ({ ...b, readiness: { kind: 'auto', share, maxReady: BENCH_MAX_READY } }),
      }),
    ),
    {
      key: 'predictive 0.9 containers',
      label: `predictive (0.9), ${LAMBDA_REQUEST_CONTAINERS} request containers`,
      kind: 'lambda',
      options: (b) => ({
        ...b,
        readiness: { kind: 'auto', share: 0.9, maxReady: BENCH_MAX_READY },
        requestContainers: LAMBDA_REQUEST_CONTAINERS,
      }),
    },
  ];
}

/**
 * Today's policy on a trace as an earlier full run stored it (results.json's `traces`), for
 * `--readiness-only`: only when that run had the same number of jobs; otherwise (another `--jobs`, or
 * none stored) undefined, and today's policy is run again, so every policy of a trace is compared on the
 * same jobs.
 */
export function storedToday<T>(
  stored: readonly {
    readonly name: string;
    readonly jobs?: number;
    readonly policies: { readonly fullest?: T };
  }[],
  trace: { readonly name: string; readonly jobs: readonly unknown[] },
): T | undefined {
  const earlier = stored.find((t) => t.name === trace.name);
  return earlier?.jobs === trace.jobs.length ? earlier.policies.fullest : undefined;
}

export interface ReadyTrace {
  readonly name: string;
  readonly jobs: number;
  readonly bound: number;
  readonly runs: ReadonlyMap<string, PolicyResult>;
  /** Arrivals within the first boot time of a burst (firstBootArrivals). */
  readonly firstBoot: { readonly arrivals: number; readonly bursts: number };
  /** How much the arrival rate moves (rateDispersion). */
  readonly dispersion: number;
}

/** A burst: at least this many arrivals within one boot time, after a boot time with none. */
export const BURST_MIN_ARRIVALS = 5;

/**
 * How many arrivals fall within the first boot time (`bootS`) of a burst: an arrival with none in the
 * boot time before it, followed within a boot time by at least BURST_MIN_ARRIVALS (itself included).
 * Nothing announced them (the minute before was quiet), so a launch they cause is ready only after they
 * came: no forecast learned from the requests themselves serves them, beyond the room already held.
 * (An earlier rule, a burst after 5 quiet minutes, found almost none of bursty's bursts: its background
 * jobs every ~4 minutes break such a gap.)
 */
export function firstBootArrivals(arrivalsMs: readonly number[], bootS: number) {
  const boot = bootS * 1000;
  let arrivals = 0;
  let bursts = 0;
  let until = Number.NEGATIVE_INFINITY; // end of the current burst's first boot time
  for (let i = 0; i < arrivalsMs.length; i++) {
    const t = arrivalsMs[i] as number;
    if (t < until) {
      arrivals++;
      continue;
    }
    const quietBefore = i === 0 || t - (arrivalsMs[i - 1] as number) >= boot;
    let within = 0;
    for (let j = i; j < arrivalsMs.length && (arrivalsMs[j] as number) < t + boot; j++) within++;
    if (quietBefore && within >= BURST_MIN_ARRIVALS) {
      bursts++;
      arrivals++;
      until = t + boot;
    }
  }
  return { arrivals, bursts };
}

const share = (r: PolicyResult, jobs: number) => r.warmHits / jobs;

export function readyTable(t: ReadyTrace): string {
  const today = t.runs.get('fullest') as PolicyResult;
  const rows = readyPolicies().flatMap((p) => {
    const r = t.runs.get(p.key);
    if (!r) return [];
    return [
      [
        p.label,
        pct(r.warmHits, t.jobs),
        secs(r.waitS.mean),
        secs(r.waitS.p95),
        hours(r.instanceSeconds),
        ratio(r.instanceSeconds / t.bound),
        ratio(r.instanceSeconds / today.instanceSeconds),
        String(r.backingLaunched),
      ],
    ];
  });
  return [
    `${t.name}: ready room, side by side (${t.jobs} jobs; ${t.firstBoot.arrivals} arrivals, ${pct(t.firstBoot.arrivals, t.jobs)}, fall within the first boot time of ${t.firstBoot.bursts} bursts: >= ${BURST_MIN_ARRIVALS} arrivals within a boot time, after one with none)`,
    table(
      ['policy', 'no wait', 'wait mean', 'wait p95', 'instance-h', 'x bound', 'x today', 'launched'],
      rows,
    ),
  ].join('\n');
}

export function readyJson(t: ReadyTrace) {
  return {
    name: t.name,
    jobs: t.jobs,
    firstBootArrivals: t.firstBoot.arrivals,
    bursts: t.firstBoot.bursts,
    rateDispersion: Math.round(t.dispersion * 100) / 100,
    policies: readyPolicies().flatMap((p) => {
      const r = t.runs.get(p.key);
      if (!r) return [];
      return [
        {
          policy: p.label,
          kind: p.kind,
          servedWithoutWaitPercent: round(100 * share(r, t.jobs), 1),
          noWait: r.warmHits,
          waitMeanS: round(r.waitS.mean, 2),
          waitP95S: round(r.waitS.p95, 2),
          instanceHours: round(r.instanceSeconds / 3600, 4),
          ratioToLowerBound: round(r.instanceSeconds / t.bound, 4),
          backingLaunched: r.backingLaunched,
          ...(r.spareHits === undefined ? {} : { servedByReadyNode: r.spareHits }),
          dynamodbCalls: r.dynamodbCalls,
        },
      ];
    }),
  };
}

type ReadyRow = ReturnType<typeof readyJson>['policies'][number];

/**
 * The ready-room runs of a trace as an earlier run stored them (results.json's `readiness`), for
 * `--readiness-only --ready-policies`: the policies not run again are taken from there, so the summary
 * still compares every policy. Only when that run had the same number of jobs (as storedToday).
 */
export function storedReadyRuns(
  stored: readonly ReadyTraceJson[],
  trace: { readonly name: string; readonly jobs: readonly unknown[] },
  keep: (key: string) => boolean,
): Map<string, PolicyResult> {
  const out = new Map<string, PolicyResult>();
  const earlier = stored.find((t) => t.name === trace.name);
  if (earlier?.jobs !== trace.jobs.length) return out;
  for (const p of readyPolicies()) {
    const r = earlier.policies.find((x) => x.policy === p.label);
    if (!r || p.kind === 'today' || !keep(p.key)) continue;
    out.set(p.key, {
      instanceSeconds: r.instanceHours * 3600,
      backingLaunched: r.backingLaunched,
      waitS: { mean: r.waitMeanS, p95: r.waitP95S, max: Number.NaN },
      // Rows stored before noWait was: from the percentage (exact to a job up to 1,000 jobs).
      warmHits:
        (r as { noWait?: number }).noWait ?? Math.round((r.servedWithoutWaitPercent * earlier.jobs) / 100),
      capacityRetries: 0,
      dynamodbCalls: r.dynamodbCalls,
      fullCandidatePages: 0,
      ...(r.servedByReadyNode === undefined ? {} : { spareHits: r.servedByReadyNode }),
      wallMs: 0,
      gap: { idleSeconds: 0, heldBoundSeconds: 0 },
    });
  }
  return out;
}
export type ReadyTraceJson = ReturnType<typeof readyJson>;

/** The cheapest static setting (min-ready, grace-time, or today's grace 0) serving at least `atLeast` percent. */
function cheapestStatic(t: ReadyTraceJson, atLeast: number): ReadyRow | undefined {
  let best: ReadyRow | undefined;
  for (const r of t.policies) {
    if (r.kind === 'predictive' || r.kind === 'lambda' || r.servedWithoutWaitPercent < atLeast) continue;
    if (!best || r.instanceHours < best.instanceHours) best = r;
  }
  return best;
}

/** The three summary rows of issue 27, named as the issue names them, from the traces' figures. */
/** Below this rateDispersion a trace's rate is taken for one (Poisson's is 1; diurnal 12.59, bursty 27.64). */
const STEADY_DISPERSION = 2;

export function readySummary(measured: readonly ReadyTraceJson[], expected: readonly string[] = []) {
  // Every expected trace is named (the issue's row names), a trace not measured is said to be so.
  const missing = expected.filter((n) => !measured.some((t) => t.name === n));
  const traces = [
    ...measured,
    ...missing.map((name) => ({ name, policies: [] }) as unknown as ReadyTraceJson),
  ];
  const gone = (t: ReadyTraceJson) => missing.includes(t.name);
  const names = traces.map((t) => t.name).join(' / ');
  const row = (t: ReadyTraceJson, policy: string) => t.policies.find((r) => r.policy === policy) as ReadyRow;
  const p9 = (t: ReadyTraceJson) => row(t, 'predictive (0.9)');
  const served = traces.map((t) => (gone(t) ? Number.NaN : p9(t).servedWithoutWaitPercent));
  const servedAim = traces.map((t) => (t.name === 'bursty' ? 75 : 90));
  const cost = traces.map((t) =>
    gone(t) ? Number.NaN : p9(t).instanceHours / row(t, "today's policy (grace-time 0)").instanceHours,
  );
  const versus = traces.map((t) => {
    if (gone(t)) return null;
    const best = cheapestStatic(t, p9(t).servedWithoutWaitPercent);
    return best ? { ratio: p9(t).instanceHours / best.instanceHours, label: best.policy, best } : undefined;
  });
  // Where a static setting does as well: both points, from the figures.
  const versusWhy = traces.flatMap((t, i) => {
    const v = versus[i];
    if (!v || v.ratio < 1) return [];
    const p = p9(t);
    // Whether the rate moved at all (rateDispersion), beside the traces' figures.
    const dispersions = traces.map((x) => `${x.name} ${x.rateDispersion}`).join(', ');
    const steadyRate = t.rateDispersion !== undefined && t.rateDispersion < STEADY_DISPERSION;
    return [
      `${t.name}: ${steadyRate ? `its arrivals keep one rate (variance / mean of arrivals per ${DISPERSION_WINDOW_S / 60} minutes: ${dispersions}; about 1 for a constant Poisson rate), so the cheapest hold for a share is one number, which a forecast can find but not beat: ` : ''}${v.label} serves ${v.best.servedWithoutWaitPercent}% for ${v.best.instanceHours.toFixed(2)} instance-hours, predictive (0.9) ${p.servedWithoutWaitPercent}% for ${p.instanceHours.toFixed(2)}`,
    ];
  });
  const yesNo = (ok: boolean) => (ok ? 'yes' : 'NO');
  // Why a share aim is missed: the arrivals nothing announced (firstBootArrivals), from the figures.
  const why = traces.flatMap((t, i) => {
    const x = served[i] as number;
    if (Number.isNaN(x) || x >= (servedAim[i] as number) || t.jobs === undefined) return [];
    const unannounced = (100 * t.firstBootArrivals) / t.jobs;
    return [
      `${t.name}: ${t.firstBootArrivals} of ${t.jobs} arrivals (${unannounced.toFixed(1)}%) come within the first boot time of ${t.bursts} bursts (>= ${BURST_MIN_ARRIVALS} arrivals within a boot time after a boot time with none): a launch they cause is ready only after them, so only room already held serves them, and the forecast holds little in the quiet before a burst (${Math.max(0, 100 - unannounced).toFixed(1)}% is the share left if none of them is served)`,
    ];
  });
  const notRun = 'not measured';
  // Lambda's shape (issue 40): the predictive run with the request function in containers of their own,
  // against the same run in one process (the engine floor). Absent from an earlier run: not measured.
  const lambdaLabel = `predictive (0.9), ${LAMBDA_REQUEST_CONTAINERS} request containers`;
  const lambda = traces.map((t) => {
    const c = gone(t) ? undefined : t.policies.find((r) => r.policy === lambdaLabel);
    const one = gone(t) ? undefined : p9(t);
    // Rows stored before noWait was: from the percentage.
    const served = (r: ReadyRow) => r.noWait ?? r.servedWithoutWaitPercent;
    return c && one && served(one) > 0 ? served(c) / served(one) : Number.NaN;
  });
  return [
    {
      figure: `predictive (0.9): requests served without waiting for a boot, ${names}`,
      measured: served.map((x) => (Number.isNaN(x) ? notRun : `${x.toFixed(1)}%`)).join(' / '),
      aim: servedAim.map((a) => `>= ${a}`).join(' / '),
      met: served
        .map((x, i) => (Number.isNaN(x) ? notRun : yesNo(x >= (servedAim[i] as number))))
        .join(' / '),
      ...(why.length > 0 ? { why: why.join('; ') } : {}),
    },
    {
      figure: `predictive (0.9): instance-hours / today's policy at grace 0, ${names}`,
      measured: cost.map((x) => (Number.isNaN(x) ? notRun : ratio(x))).join(' / '),
      aim: '<= 1.10',
      met: cost.map((x) => (Number.isNaN(x) ? notRun : yesNo(x <= 1.1))).join(' / '),
    },
    {
      figure: `predictive vs the cheapest static setting (min-ready or grace-time) reaching the same share: instance-hours, ${names}`,
      measured: versus
        .map((v) => (v === null ? notRun : v ? `${ratio(v.ratio)} (${v.label})` : 'none reaches it'))
        .join(' / '),
      aim: '< 1.00',
      met: versus
        .map((v) =>
          v === null ? notRun : v ? yesNo(v.ratio < 1) : 'yes (no static setting measured reaches its share)',
        )
        .join(' / '),
      ...(versusWhy.length > 0 ? { why: versusWhy.join('; ') } : {}),
    },
    {
      figure: `served without waiting for a boot, ${LAMBDA_REQUEST_CONTAINERS} request containers / one process (predictive 0.9), ${names}`,
      measured: lambda.map((x) => (Number.isNaN(x) ? notRun : ratio(x))).join(' / '),
      aim: `>= ${CONTAINERS_AIM}`,
      met: lambda.map((x) => (Number.isNaN(x) ? notRun : yesNo(x >= CONTAINERS_AIM))).join(' / '),
    },
  ];
}

/** The frontier of one trace: instance-hours against the share served without a wait, one point a policy. */
export function frontierSvg(t: ReadyTrace, subtitle: string): string {
  const W = 820;
  const H = 520;
  const L = 70;
  const R = 230;
  const T = 60;
  const B = 60;
  const points = readyPolicies().flatMap((p) => {
    const r = t.runs.get(p.key);
    return r ? [{ p, x: 100 * share(r, t.jobs), y: r.instanceSeconds / 3600 }] : [];
  });
  const maxY = Math.max(t.bound / 3600, ...points.map((q) => q.y)) * 1.08;
  const px = (x: number) => L + ((W - L - R) * x) / 100;
  const py = (y: number) => H - B - ((H - T - B) * y) / maxY;
  const colour = {
    today: '#000',
    'min-ready': '#1f77b4',
    'grace-time': '#2ca02c',
    predictive: '#d62728',
    lambda: '#9467bd',
  } as const;
  const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<title>${esc(`${t.name}: instance-hours against requests served without waiting for a boot. ${subtitle}`)}</title>`,
    `<rect width="${W}" height="${H}" fill="#fff"/>`,
    `<text x="${L}" y="24" font-size="15" font-weight="bold">${esc(t.name)}: instance-hours against requests served without waiting for a boot</text>`,
    `<text x="${L}" y="42" fill="#555">${esc(subtitle)}</text>`,
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="#000"/>`,
    `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#000"/>`,
  ];
  for (let x = 0; x <= 100; x += 10) {
    out.push(`<line x1="${px(x)}" y1="${H - B}" x2="${px(x)}" y2="${H - B + 4}" stroke="#000"/>`);
    out.push(`<text x="${px(x)}" y="${H - B + 18}" text-anchor="middle">${x}%</text>`);
  }
  const step = niceStep(maxY / 6);
  for (let y = 0; y <= maxY; y += step) {
    out.push(`<line x1="${L - 4}" y1="${py(y)}" x2="${W - R}" y2="${py(y)}" stroke="#eee"/>`);
    out.push(`<text x="${L - 8}" y="${py(y) + 4}" text-anchor="end">${y.toFixed(0)}</text>`);
  }
  out.push(
    `<line x1="${L}" y1="${py(t.bound / 3600)}" x2="${W - R}" y2="${py(t.bound / 3600)}" stroke="#888" stroke-dasharray="5,4"/>`,
    `<text x="${W - R + 6}" y="${py(t.bound / 3600) + 4}" fill="#555">lower bound</text>`,
    `<text x="${(L + W - R) / 2}" y="${H - 16}" text-anchor="middle">requests served without waiting for a boot</text>`,
    `<text x="18" y="${(T + H - B) / 2}" transform="rotate(-90 18 ${(T + H - B) / 2})" text-anchor="middle">instance-hours</text>`,
  );
  for (const kind of ['min-ready', 'grace-time', 'predictive'] as const) {
    const line = points.filter((q) => q.p.kind === kind).sort((a, b) => a.x - b.x);
    if (line.length > 1) {
      out.push(
        `<polyline fill="none" stroke="${colour[kind]}" stroke-opacity="0.5" points="${line.map((q) => `${px(q.x).toFixed(1)},${py(q.y).toFixed(1)}`).join(' ')}"/>`,
      );
    }
  }
  points.forEach((q, i) => {
    out.push(
      `<circle cx="${px(q.x).toFixed(1)}" cy="${py(q.y).toFixed(1)}" r="4" fill="${colour[q.p.kind]}"/>`,
    );
    out.push(
      `<text x="${W - R + 6}" y="${T + 16 * i}" fill="${colour[q.p.kind]}">${esc(`${q.p.label}: ${q.x.toFixed(0)}%, ${q.y.toFixed(1)} h`)}</text>`,
    );
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

function niceStep(raw: number): number {
  const p = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) ?? 10 * p;
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}
