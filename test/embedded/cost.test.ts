import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DISPERSION_WINDOW_S, rateDispersion } from '../../bench/cost/dispersion.ts';
import { model } from '../../bench/cost/model.ts';
import { firstBootArrivals, readySummary, storedReadyRuns, storedToday } from '../../bench/cost/readiness.ts';
import {
  DEFAULT_OPTIONS,
  hintOf,
  lowerBound,
  perJob,
  type SimOptions,
  simulate,
} from '../../bench/cost/simulate.ts';
import { batchTrace, formatTraceCsv, parseTraceCsv, syntheticTrace } from '../../bench/cost/traces.ts';
import { type InProcessDynalite, startInProcessDynalite } from '../../testkit/inProcessDynalite.ts';
import { whileWatching } from '../../testkit/sdkWatch.ts';

/**
 * The cost simulator (bench/cost, `npm run cost`) on a 20-job trace: the real use cases on dynalite,
 * a virtual clock. Only figures are checked, never timing.
 */
let engine: InProcessDynalite;
beforeAll(async () => {
  engine = await startInProcessDynalite();
});
afterAll(async () => {
  await engine.close();
});

const trace = syntheticTrace('bursty', 7, 20);
const options = (o: Partial<SimOptions> = {}): SimOptions => ({ ...DEFAULT_OPTIONS, ...o });

describe('the cost simulator', () => {
  it('never beats the lower bound, and agrees with the reference model', async () => {
    const bound = lowerBound(trace, DEFAULT_OPTIONS.slots).instanceSeconds;
    expect(bound).toBeGreaterThan(0);
    for (const [policy, graceS] of [
      ['fullest', 0],
      ['oldest', 0],
      ['fullest', 300],
    ] as const) {
      const o = options({ policy, graceS });
      const r = await simulate(engine, trace, o, { series: false });
      expect(r.instanceSeconds).toBeGreaterThanOrEqual(bound);
      expect(r.waitS.max).toBeLessThanOrEqual(DEFAULT_OPTIONS.bootS);
      const m = model(trace, o);
      expect([r.instanceSeconds, r.backingLaunched, r.warmHits]).toEqual([
        m.instanceSeconds,
        m.backingLaunched,
        m.warmHits,
      ]);
    }
    expect(perJob(trace, DEFAULT_OPTIONS.bootS).instanceSeconds).toBeGreaterThanOrEqual(bound);
  });

  it('runs duration-aware placement with exact and noisy hints: never below the bound, hints stable per job', async () => {
    const bound = lowerBound(trace, DEFAULT_OPTIONS.slots).instanceSeconds;
    for (const hints of ['exact', 'noisy'] as const) {
      const r = await simulate(engine, trace, options({ hints }), { series: false });
      expect(r.instanceSeconds).toBeGreaterThanOrEqual(bound);
      expect(r.waitS.max).toBeLessThanOrEqual(DEFAULT_OPTIONS.bootS);
    }
    for (const job of trace.jobs) {
      const seconds = job.durationMs / 1000;
      expect(hintOf(job, 'exact')).toBe(seconds);
      const noisy = hintOf(job, 'noisy') as number;
      expect(noisy).toBe(hintOf(job, 'noisy')); // every try of a job sends the same body
      expect(noisy / seconds).toBeGreaterThanOrEqual(0.5);
      expect(noisy / seconds).toBeLessThan(2);
    }
    expect(hintOf(trace.jobs[0] as (typeof trace.jobs)[0], undefined)).toBeUndefined();
  });

  it('runs the learned policy on a trace with requestors: never below the bound, and it learns', async () => {
    const batch = batchTrace(3, 40);
    const bound = lowerBound(batch, DEFAULT_OPTIONS.slots).instanceSeconds;
    const r = await simulate(engine, batch, options({ learned: true }), { series: false });
    expect(r.instanceSeconds).toBeGreaterThanOrEqual(bound);
    // Learning costs DynamoDB calls (estimate reads and writes); without it none are made.
    const plain = await simulate(engine, batch, options(), { series: false });
    expect(r.dynamodbCalls).toBeGreaterThan(plain.dynamodbCalls);
  });

  it('one instance per job costs the sum of boot + duration, computed or run through the real code', async () => {
    const expected = trace.jobs.reduce((s, j) => s + DEFAULT_OPTIONS.bootS + j.durationMs / 1000, 0);
    expect(perJob(trace, DEFAULT_OPTIONS.bootS).instanceSeconds).toBeCloseTo(expected, 6);
    // max-parallel-jobs 1, grace-time 0, a reaper that runs the instant a backing node is empty.
    const real = await simulate(engine, trace, options({ slots: 1, graceS: 0, reaperTickS: 0 }));
    expect(real.instanceSeconds).toBeCloseTo(expected, 6);
    expect(real.backingLaunched).toBe(trace.jobs.length);
  });

  it('simulates the reaper on every tick or only when something can be due, with the same bill', async () => {
    const o = options({ graceS: 60, minRetentionS: 600 });
    const due = await simulate(engine, trace, o, { series: false });
    const periodic = await simulate(engine, trace, { ...o, reaperMode: 'periodic' }, { series: false });
    expect(periodic.instanceSeconds).toBe(due.instanceSeconds);
    expect(periodic.backingLaunched).toBe(due.backingLaunched);
    expect(periodic.dynamodbCalls).toBeGreaterThan(due.dynamodbCalls);
  });

  it("reads a label's seats once per request and once per reaper run, with min-ready or auto: a refill after a take and the upkeep after a decision reuse them", async () => {
    const busy = syntheticTrace('steady', 7, 20);
    for (const readiness of [
      { kind: 'static', minReady: 2 },
      { kind: 'auto', share: 0.9, maxReady: 8 },
    ] as const) {
      let seatQueries = 0;
      let reaperRuns = 0;
      let spareHits: number | undefined;
      await whileWatching(
        engine.client,
        async (command, input, send) => {
          const pk = String((input.ExpressionAttributeValues as Record<string, unknown>)?.[':pk'] ?? '');
          if (command === 'QueryCommand' && pk.startsWith('SEATS#')) seatQueries++;
          if (command === 'GetItemCommand' && String((input.Key as { pk?: unknown })?.pk) === 'REAPER')
            reaperRuns++;
          return send();
        },
        async () => {
          spareHits = (await simulate(engine, busy, options({ readiness }), { series: false })).spareHits;
        },
      );
      expect(spareHits).toBeGreaterThan(0); // refills after takes happened
      expect(seatQueries).toBe(busy.jobs.length + reaperRuns);
    }
  }, 120_000);

  it("runs the handlers on Lambda's shape (issue 40): request containers with module state of their own, the reaper in another, as many served without a wait as one process", async () => {
    const bursty = syntheticTrace('bursty', 7, 60);
    const auto = { kind: 'auto', share: 0.9, maxReady: 20 } as const;
    const one = await simulate(engine, bursty, options({ readiness: auto }), { series: false });
    const lambda = await simulate(engine, bursty, options({ readiness: auto, requestContainers: 4 }), {
      series: false,
    });
    expect(one.spareHits).toBeGreaterThan(0);
    expect(lambda.warmHits).toBeGreaterThanOrEqual(0.98 * one.warmHits);
    expect(lambda.instanceSeconds).toBeGreaterThanOrEqual(
      lowerBound(bursty, DEFAULT_OPTIONS.slots).instanceSeconds,
    );
    await expect(simulate(engine, bursty, options({ requestContainers: 0 }))).rejects.toThrow(/>= 1/);
  }, 120_000);

  it("compares a trace's policies on the same jobs: --readiness-only takes today's policy from a run of as many jobs only", () => {
    const stored = [
      { name: 'batch', jobs: 1200, policies: { fullest: { instanceHours: 875.68 } } },
      { name: 'steady', jobs: 1000, policies: { fullest: { instanceHours: 58.18 } } },
    ];
    // `--jobs batch=400` against a file of a 1,200-job run: run again (it was taken, and batch's
    // "today's policy" served 286% of the 400 jobs without a wait for 2.7x the hours).
    expect(storedToday(stored, { name: 'batch', jobs: new Array(400) })).toBeUndefined();
    expect(storedToday(stored, { name: 'steady', jobs: new Array(1000) })).toEqual({ instanceHours: 58.18 });
    expect(storedToday(stored, { name: 'diurnal', jobs: new Array(1174) })).toBeUndefined();
  });

  it('keeps the ready-room rows --ready-policies does not run, from a run of as many jobs only', () => {
    const row = (policy: string, kind: string, extra: Record<string, number> = {}) => ({
      policy,
      kind,
      servedWithoutWaitPercent: 97.9,
      waitMeanS: 1,
      waitP95S: 0,
      instanceHours: 60.5,
      ratioToLowerBound: 1.2,
      backingLaunched: 50,
      dynamodbCalls: 9000,
      ...extra,
    });
    const stored = [
      {
        name: 'steady',
        jobs: 1000,
        firstBootArrivals: 100,
        bursts: 18,
        policies: [
          row("today's policy (grace-time 0)", 'today'),
          row('min-ready 2', 'min-ready', { noWait: 969 }),
          row('min-ready 3', 'min-ready'), // stored before noWait: from the percentage
          row('predictive (0.9)', 'predictive', { noWait: 980 }),
        ],
      },
    ] as unknown as Parameters<typeof storedReadyRuns>[0];
    const steady = { name: 'steady', jobs: new Array(1000) };
    const kept = storedReadyRuns(stored, steady, (key) => key !== 'predictive 0.9');
    // Today's policy comes from the main table (storedToday); the policy run again is not kept.
    expect([...kept.keys()]).toEqual(['min-ready 2', 'min-ready 3']);
    expect(kept.get('min-ready 2')).toMatchObject({ warmHits: 969, instanceSeconds: 60.5 * 3600 });
    expect(kept.get('min-ready 3')?.warmHits).toBe(979);
    expect(storedReadyRuns(stored, { name: 'steady', jobs: new Array(500) }, () => true).size).toBe(0);
  });

  it('counts the arrivals within the first boot time of a burst, also of one background jobs lead up to', () => {
    const s = (x: number) => x * 1000;
    // Background every 4 minutes; a burst of 8 within 90 s at 10:00 (5 of them within its first minute,
    // the quiet minute before it broken by nothing); 4 within a minute is no burst.
    const background = [0, 240, 480].map(s);
    const burst = [600, 610, 620, 630, 650, 665, 680, 690].map(s);
    const small = [1200, 1210, 1220, 1230].map(s);
    expect(firstBootArrivals([...background, ...burst, ...small], 60)).toEqual({ arrivals: 5, bursts: 1 });
    // bursty's bursts are found (about 40% of its arrivals come in their first minute), few of steady's.
    const share = (kind: 'steady' | 'bursty') => {
      const t = syntheticTrace(kind, 42, 800);
      return (
        firstBootArrivals(
          t.jobs.map((j) => j.arrivalMs),
          60,
        ).arrivals / t.jobs.length
      );
    };
    expect(share('bursty')).toBeGreaterThan(0.3);
    expect(share('steady')).toBeLessThan(0.15);
  });

  it('measures how much the arrival rate moves: about 1 at one Poisson rate, more for a day or bursts', () => {
    const dispersion = (kind: 'steady' | 'bursty' | 'diurnal') =>
      rateDispersion(syntheticTrace(kind, 42, 1000).jobs.map((j) => j.arrivalMs));
    expect(dispersion('steady')).toBeGreaterThan(0.3);
    expect(dispersion('steady')).toBeLessThan(2);
    expect(dispersion('bursty')).toBeGreaterThan(3);
    expect(dispersion('diurnal')).toBeGreaterThan(3);
    // Two rates, 10 and 40 per window: the index sees the move a mean alone would not.
    const windowMs = DISPERSION_WINDOW_S * 1000;
    const twoRates = [0, 1, 2, 3, 4, 5, 6, 7].flatMap((w) =>
      Array.from({ length: w % 2 ? 40 : 10 }, (_, i) => w * windowMs + (i * windowMs) / 41),
    );
    expect(rateDispersion(twoRates)).toBeGreaterThan(10);
    expect(Number.isNaN(rateDispersion([]))).toBe(true);
    // A long trace (a year of a busy pool's arrivals, say) is measured, not a stack overflow.
    const many = Array.from({ length: 300_000 }, (_, i) => i * 1000);
    expect(rateDispersion(many)).toBeCloseTo(0, 5);
  });

  it('says from the figures why a static setting ties the forecast, naming a rate that does not move', () => {
    const row = (policy: string, kind: string, served: number, hours: number) => ({
      policy,
      kind,
      servedWithoutWaitPercent: served,
      waitMeanS: 1,
      waitP95S: 0,
      instanceHours: hours,
      ratioToLowerBound: 1.2,
      backingLaunched: 50,
      dynamodbCalls: 9000,
    });
    const trace = (name: string, rateDispersion: number) => ({
      name,
      jobs: 1000,
      firstBootArrivals: 0,
      bursts: 0,
      rateDispersion,
      policies: [
        row("today's policy (grace-time 0)", 'today', 90, 58),
        row('min-ready 3', 'min-ready', 98.5, 62.9),
        row('predictive (0.9)', 'predictive', 98, 63),
      ],
    });
    const versus = (dispersion: number) =>
      readySummary([trace('steady', dispersion)] as unknown as Parameters<typeof readySummary>[0]).find((r) =>
        r.figure.startsWith('predictive vs the cheapest static setting'),
      );
    expect(versus(1.12)).toMatchObject({ measured: '1.002 (min-ready 3)', met: 'NO' });
    expect(versus(1.12)?.why).toMatch(
      /^steady: its arrivals keep one rate \(.*steady 1\.12; .*min-ready 3 serves 98\.5%/,
    );
    // A rate that moves (a day's swing): the tie is said, not explained away.
    expect(versus(12.6)?.why).toMatch(/^steady: min-ready 3 serves 98\.5% for 62\.90 instance-hours/);
  });

  it('generates the same trace for the same seed, and reads back what it writes', () => {
    for (const kind of ['steady', 'bursty', 'diurnal', 'batch'] as const) {
      const a = syntheticTrace(kind, 42, 50);
      expect(syntheticTrace(kind, 42, 50)).toEqual(a);
      expect(syntheticTrace(kind, 43, 50).jobs).not.toEqual(a.jobs);
      expect(parseTraceCsv(formatTraceCsv(a), kind).jobs).toEqual(a.jobs);
    }
    // Pinned: mulberry32 and the distributions give these numbers everywhere.
    expect(trace.jobs.slice(0, 3).map((j) => [j.arrivalMs, j.durationMs])).toEqual([
      [11462, 159595],
      [17450, 206793],
      [30202, 370949],
    ]);
  });

  it('draws batch runtimes from the Lublin-Feitelson model, each job naming its population', () => {
    const batch = batchTrace(42, 2000);
    const minutes = (js: typeof batch.jobs) => js.map((j) => j.durationMs / 60_000).sort((a, b) => a - b);
    const median = (xs: number[]) => xs[Math.floor(xs.length / 2)] as number;
    // 1 - p = 1 - (-0.003 + 0.6986) = 0.3044 of one-node jobs come from Gamma(639.1, 0.0156): e^9.97 s ~ 6 h.
    const long = batch.jobs.filter((j) => j.requestor?.startsWith('long-'));
    expect(long.length / batch.jobs.length).toBeGreaterThan(0.27);
    expect(long.length / batch.jobs.length).toBeLessThan(0.34);
    expect(median(minutes(long))).toBeGreaterThan(300);
    expect(median(minutes(long))).toBeLessThan(420);
    // The rest from Gamma(6.57, 0.823): median about e^5.14 s ~ 3 min, spread over orders of magnitude.
    const short = minutes(batch.jobs.filter((j) => j.requestor?.startsWith('short-')));
    expect(median(short)).toBeGreaterThan(1.5);
    expect(median(short)).toBeLessThan(5);
    // Never above the model's cap, e^12 s.
    expect(Math.max(...batch.jobs.map((j) => j.durationMs))).toBeLessThanOrEqual(Math.exp(12) * 1000);
    expect(new Set(batch.jobs.map((j) => j.requestor)).size).toBe(10);
  });

  it('reads a CSV trace and reports what is wrong in one', () => {
    const t = parseTraceCsv('# comment\narrival_s,duration_s,label\n5,60,big\n1.5,30,\n', 'mine');
    expect(t.jobs).toEqual([
      { index: 0, arrivalMs: 1500, durationMs: 30_000, label: 'small' },
      { index: 1, arrivalMs: 5000, durationMs: 60_000, label: 'big' },
    ]);
    expect(() => parseTraceCsv('arrival,duration\n1,2\n', 'x.csv')).toThrow(/x.csv:1: expected the header/);
    expect(() => parseTraceCsv('arrival_s,duration_s,label\n1,0,a\n', 'x.csv')).toThrow(
      /x.csv:2: duration_s/,
    );
    const named = parseTraceCsv('arrival_s,duration_s,label,requestor\n0,60,,lint\n1,90,big,\n', 'n.csv');
    expect(named.jobs.map((j) => j.requestor)).toEqual(['lint', undefined]);
    expect(parseTraceCsv(formatTraceCsv(named), 'n').jobs).toEqual(named.jobs);
  });
});
