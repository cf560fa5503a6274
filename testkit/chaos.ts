/**
 * The chaos run: the whole flow (request, fulfil and reaper handlers, as in Lambda) on the embedded
 * DynamoDB (dynalite) with EC2 played by the stateful fake, under faults, on virtual time.
 *
 * - Requests: single nodes and node sets of 2-4 (and a few with an unknown label, which must fail with
 *   a reason) arrive over time on an in-memory at-least-once queue (chaosQueue.ts): every message is
 *   delivered twice, in random order; failed or crashed batches come back after the visibility timeout.
 * - Each tick (100 ms of virtual time): the fake EC2 applies due state changes (boots, deaths) and its
 *   events go to the fulfil queue; up to 16 request-handler invocations (batches of 1-10) and 4
 *   fulfil-handler invocations run concurrently, with a reaper run every reaperEveryTicks; each runs in
 *   a "container" (handler, EC2 provider and store, so its own module state: caches, buffers, remembered
 *   candidates, forecasts, all kept per store), reused tick after tick as Lambda reuses them, the reaper
 *   and the dead-letter consumer in containers of their own (issue 40; `oneProcess`: one store for all,
 *   as the embedded pool runs them).
 * - Jobs: when a request is fulfilled its user releases its nodes 1-15 s later, so backing nodes fill,
 *   empty and are reaped.
 * - Faults: 5% of RunInstances calls fail, 5% of launched instances die before they boot (together 10%
 *   of launches fail); one instance type has no capacity in phases; EC2 throttles in bursts; 10% of
 *   instances die some time after boot; a handler crash is injected at each store/provider boundary in
 *   turn (chaosCrash.ts).
 * - Invariants (chaosInvariants.ts) are checked every few ticks on a Scan of the table, continuously on
 *   every write the handlers make (a mirror kept from the store's results) and on every EC2 call, and
 *   at the end, after everything is released and the reaper ran until quiescent.
 * A violation stops the run with the seed, the virtual time and the ids involved.
 */
import { performance } from 'node:perf_hooks';
import type { DynamoDBClient } from '@aws-sdk/client-dynamodb';
import {
  type EC2Client,
  RunInstancesCommand,
  type RunInstancesCommandInput,
  type RunInstancesCommandOutput,
  TerminateInstancesCommand,
  type TerminateInstancesCommandInput,
} from '@aws-sdk/client-ec2';
import { parseConfigOrThrow } from '../shared/config/load.ts';
import { ManualClock } from '../shared/core/clock.ts';
import type { Log } from '../shared/core/log.ts';
import { isSpareRequestId } from '../shared/core/minReady.ts';
import type { ResolvedConfig } from '../shared/core/model.ts';
import type { BackingProvider, ProviderRegistry } from '../shared/core/provider.ts';
import type { BackingRecord, RequestRecord } from '../shared/core/records.ts';
import type { StateChangeEvent } from '../shared/core/stateChanges.ts';
import { SLOT_LEASE_MS } from '../shared/core/timing.ts';
import { makeFulfilHandler } from '../shared/handlers/fulfilHandler.ts';
import { makeReaperHandler } from '../shared/handlers/reaperHandler.ts';
import {
  makeDeadLetterHandler,
  makeRequestHandler,
  type SqsBatchHandler,
} from '../shared/handlers/requestHandler.ts';
import { isEc2InstanceId } from '../shared/providers/aws/driver.ts';
import { Ec2Provider } from '../shared/providers/aws/ec2Provider.ts';
import { ensureTable, localDynamoClient } from '../shared/runtime/engines.ts';
import type { LocalTransactions } from '../shared/runtime/localTransactions.ts';
import { DynamoStore } from '../shared/store/dynamoStore.ts';
import { keys } from '../shared/store/table.ts';
import type { Context } from '../shared/usecases/context.ts';
import type { ReapReport } from '../shared/usecases/reap/reapReport.ts';
import {
  CrashInjector,
  type HandlerKind,
  label,
  PROVIDER_METHODS,
  STORE_METHODS,
  TRANSACTION_STEP,
} from './chaosCrash.ts';
import {
  checkFinal,
  checkInvariants,
  holdsCapacity,
  type Limits,
  type Snapshot,
  TAG_BACKING_NODE_ID,
  Tracker,
} from './chaosInvariants.ts';
import { ChaosQueue, type QueuedMessage, toSqsEvent } from './chaosQueue.ts';
import { Random } from './chaosRandom.ts';
import { poolConfig } from './configs.ts';
import { ec2Error, FakeEc2 } from './fakeEc2.ts';
import { type InProcessDynalite, startInProcessDynalite } from './inProcessDynalite.ts';

// ---- the pool under test ----------------------------------------------------------------------------

export const CHAOS_POOL = {
  backingMax: 12,
  nodesMax: 40,
  slots: 4,
  graceSeconds: 2,
  launchRetries: 3,
  launchTimeoutSeconds: 120,
  /** request-timeout of the metastatic provider: waits past it end `failed` (checked by an invariant). */
  requestTimeoutSeconds: 240,
  /** Requests with an explicit priority (the rest have the default, 100), and the priorities drawn. */
  priorityShare: 0.3,
  priorities: [10, 100, 200],
  /** Requests that the user cancels 0-20 s after sending them. */
  cancelShare: 0.04,
  /** Requests that carry an expected-duration (1-15 s, drawn apart from their job's real duration). */
  hintShare: 0.4,
  /**
   * Requests sent by shape instead of labels (`small`'s slot is derived from its instance types: 8 vCPUs,
   * 32 GiB / 4 slots = 2 cores, 8 GiB); the unknown-label requests go by a shape no label fits as often.
   */
  shapeShare: 0.25,
  /** Requests naming a requestor (one of `requestors`, issue 40); the others name none. */
  requestorShare: 0.8,
  requestors: 5,
  /**
   * Requests that take a client lease (issue 23), its length (seconds), and the share of those whose
   * client dies some time after sending (it stops renewing and never releases: only the lease frees its
   * nodes). Living clients renew every third of the lease until they release.
   */
  leaseShare: 0.2,
  leaseSeconds: 30,
  leaseCrashShare: 0.5,
  /** min-ready of the label (lowered to 0 before the final drain, as an operator would to empty the pool). */
  minReady: 3,
  /**
   * With `readyAuto`: the label's `min-ready: auto` instead, at this ready-target and max-ready (the
   * most untaken ready nodes it may have at any time: the no-overshoot invariant's bound).
   */
  readyTarget: 0.9,
  maxReady: 4,
  /**
   * How late a waiting request may end after its request-timeout, beyond the reaper's period: reaper runs
   * crash, and the waiting requests' messages come back on their own schedule.
   */
  timeoutSlackMs: 5_000,
  /** The instance type that has no capacity in phases (the other one always has). */
  scarceType: 'm7g.2xlarge',
  otherType: 'm6g.2xlarge',
} as const;

/**
 * The pool under test; without `nodeCap` the metastatic pool has no max-servers (the default in a user's
 * config); with `auto`, the label's ready nodes follow its arrival forecast (`min-ready: auto`) rather
 * than a number. `minReady` 0 (the drain) is the static 0 either way.
 */
const chaosYaml = (nodeCap: boolean, minReady: number, auto = false) =>
  poolConfig({
    // Durations are learned, and nodes without a hint placed by them, under the same faults.
    top: { 'learned-durations': true },
    labels: [
      { name: 'large' },
      auto && minReady > 0
        ? {
            name: 'small',
            'min-ready': 'auto',
            'ready-target': CHAOS_POOL.readyTarget,
            'max-ready': CHAOS_POOL.maxReady,
          }
        : { name: 'small', 'min-ready': minReady },
    ],
    backing: {
      driver: 'aws',
      provider: { region: 'eu-west-1' },
      pool: {
        'max-servers': CHAOS_POOL.backingMax,
        'subnet-ids': ['subnet-a', 'subnet-b'],
        'security-group-id': 'sg-1',
      },
      labels: [
        {
          name: 'large',
          'instance-types': [CHAOS_POOL.scarceType, CHAOS_POOL.otherType],
          'image-id': 'ami-123',
        },
      ],
    },
    meta: {
      provider: {
        'launch-retries': CHAOS_POOL.launchRetries,
        'launch-timeout': CHAOS_POOL.launchTimeoutSeconds,
        'request-timeout': CHAOS_POOL.requestTimeoutSeconds,
      },
      pool: { 'max-servers': nodeCap ? CHAOS_POOL.nodesMax : undefined },
      labels: [
        {
          name: 'small',
          'backing-label': 'large',
          'max-parallel-jobs': CHAOS_POOL.slots,
          'grace-time': CHAOS_POOL.graceSeconds,
        },
      ],
    },
  });

const POOL_ID = 'chaos-pool';
const REGION = 'eu-west-1';
const START = Date.parse('2026-06-01T00:00:00Z');

// ---- knobs --------------------------------------------------------------------------------------------

export interface ChaosOptions {
  /** Node requests (single nodes and node sets). */
  readonly requests: number;
  readonly seed: number;
  /**
   * Whether the metastatic pool has max-servers (default true). Without it, duplicate deliveries of a
   * request never meet at a capacity place and meet only at claims and backing records.
   */
  readonly nodeCap?: boolean;
  /**
   * Whether the label has `min-ready: auto` (issue 27) instead of min-ready 3: its ready nodes follow
   * the forecast the handlers learn under the same faults, and never exceed max-ready (an invariant).
   */
  readonly readyAuto?: boolean;
  /**
   * Every handler on one store, so one module state (caches, buffers, remembered candidates, forecasts:
   * kept per store), as the embedded pool runs them. Default: Lambda's shape (issue 40), each container
   * (request, dead-letter, fulfil, reaper) with a store of its own on the shared client, reused by its
   * invocations.
   */
  readonly oneProcess?: boolean;
  /** Concurrent request-handler invocations per tick. Default 16. */
  readonly concurrency?: number;
  /** Concurrent fulfil-handler invocations per tick. Default 4. */
  readonly fulfilConcurrency?: number;
  /** Virtual time per tick. Default 100 ms. */
  readonly tickMs?: number;
  /**
   * The reaper runs every this many ticks while requests arrive (every tick while draining). Default 1:
   * the most interleavings of reaper runs with deliveries, for long runs (`npm run test:chaos`). On AWS
   * the reaper runs once a minute, against jobs of minutes to hours; `npm test` runs it every 10 ticks
   * (1 s virtual, against the chaos jobs of 1-15 s), which keeps that ratio and costs a tenth.
   */
  readonly reaperEveryTicks?: number;
  /** The queues are polled every this many ticks. Default 5 (500 ms). */
  readonly pollEveryTicks?: number;
  /** Invariants on a Scan every this many ticks. Default 20 (2 s). */
  readonly checkEveryTicks?: number;
  /** Mean virtual time between two requests of a wave. Default 300 ms. */
  readonly meanArrivalMs?: number;
  /** A fulfilled request's job runs this long (virtual ms, uniform), then its nodes are released. */
  readonly jobMs?: readonly [number, number];
  /**
   * Requests outstanding but no request, node or backing node changed state for this long (virtual):
   * fail. Default 90 s: jobs last at most 15 s and boots 8 s, but the longest recovery the design
   * allows is a launch cut short by a crash, which the reaper finishes 60 s later
   * (UNFINISHED_LAUNCH_MS in shared/usecases/reap/reap.ts); nodes placed on that backing node meanwhile wait.
   */
  readonly watchdogMs?: number;
  /** One tick's invocations taking longer than this (real time) is a hang: fail. Default 30 s. */
  readonly tickTimeoutMs?: number;
  /** A dynalite endpoint to use; default: a new one in this process. */
  readonly endpoint?: string;
  /** Progress lines (the long runner prints them). */
  readonly progress?: (line: string) => void;
  /**
   * Ids (request, node or backing ids, or parts of them) whose every write is traced; the trace is
   * printed with a failure. CHAOS_TRACE in the test and the runner.
   */
  readonly trace?: readonly string[];
}

/**
 * What counts as a quick release here (Context.quickReleaseMs): QUICK_RELEASE_MS scaled as the jobs are
 * (1-15 s for a CI job's minutes), so the forecast learns from the chaos jobs and `min-ready: auto` makes
 * ready nodes under faults; a job released within it is taken back (issue 40).
 */
const CHAOS_QUICK_RELEASE_MS = 500;

const FAULTS = {
  /** RunInstances calls failing with an API error. */
  launchApiFailure: 0.05,
  /** Launched instances dying before they boot (pending -> terminated). */
  launchDeath: 0.05,
  /** Instances dying some time after boot (within deathWindowMs). */
  deathAfterBoot: 0.1,
  deathWindowMs: 40_000,
  /** Per tick: a burst of throttled EC2 calls (2-10 calls in a row). */
  throttleBurst: 0.02,
  /** Per tick: the scarce instance type's capacity phase flips (mean phase 60 s). */
  capacityFlip: 1 / 600,
  bootDelayMs: 8_000,
  terminateDelayMs: 5_000,
} as const;

/** How core/leases.ts renewDecision refuses a renewal of a request that ended or whose lease lapsed. */
const RENEWAL_TOO_LATE = /there is nothing to renew|its lease expired at/;

const QUEUES = {
  request: { visibilityMs: 4_000, maxReceiveCount: 50, maxDelayMs: 1_500 },
  fulfil: { visibilityMs: 3_000, maxReceiveCount: 5, maxDelayMs: 2_000 },
} as const;

// ---- the report ------------------------------------------------------------------------------------------

export interface ChaosReport {
  seed: number;
  requests: number;
  nodes: number;
  fulfilled: number;
  failed: number;
  failedByClass: Record<string, number>;
  /** Nodes of fulfilled requests that failed later (their instance died). */
  nodesLostAfterReady: number;
  launches: number;
  launchApiFailures: number;
  launchDeaths: number;
  deathsAfterBoot: number;
  capacityErrors: number;
  throttleBursts: number;
  throttledCalls: number;
  duplicatesDelivered: number;
  redeliveries: number;
  /** Cancel messages the users sent. */
  cancelsSent: number;
  /** Requests sent by shape (cores, memory) instead of labels, and those no label fits (they must fail so). */
  byShape: number;
  byShapeNoFit: number;
  /** Clients with a lease, those that died (only their lease frees their nodes), renewals sent, requests the reaper ended for a lapsed lease. */
  leases: { clients: number; dead: number; renewals: number; lapsed: number };
  /** min-ready: the pool's own ready nodes made, and the users' nodes that took one. */
  minReady: { made: number; taken: number };
  /** Whether the label had `min-ready: auto` (ChaosOptions.readyAuto). */
  readyAuto: boolean;
  crashes: number;
  crashesByKind: Record<HandlerKind, number>;
  /** Crash boundaries: how many there are, how many crashed at least once, which never did. */
  boundaries: { total: number; hit: number; neverHit: string[]; insideTransactions: number };
  maxInstances: number;
  /** Backing records holding capacity at once (launching/ready, or retiring/failed with a live instance). */
  maxBackingRecords: number;
  maxLiveNodes: number;
  /** Whether the metastatic pool had max-servers. */
  nodeCap: boolean;
  staleEntries: number;
  doubleEntries: number;
  reclaimedSlots: number;
  reclaimedPlaces: number;
  orphansTerminated: number;
  deadLetters: { request: number; fulfil: number };
  /** Request dead letters the dead-letter consumer handled (its deliveries, crashes included). */
  deadLettersHandled: number;
  retryReasons: Record<string, number>;
  reaperErrors: Record<string, number>;
  /** Writes touching the traced ids (ChaosOptions.trace), in order. */
  trace: string[];
  ticks: number;
  checks: number;
  /** DynamoDB calls and EC2 provider calls the handlers made. */
  calls: { store: number; provider: number };
  /** Real time spent (ms): EC2 and queues between invocations, invocations, invariant checks. */
  timing: { ec2: number; invocations: number; checks: number; reaper: number };
  virtualSeconds: number;
  realSeconds: number;
  violations: string[];
}

export class ChaosFailure extends Error {
  constructor(readonly report: ChaosReport) {
    super(formatFailure(report));
    this.name = 'ChaosFailure';
  }
}

// ---- the run ---------------------------------------------------------------------------------------------

interface Container {
  readonly kind: HandlerKind;
  readonly handler: SqsBatchHandler;
}

interface ClientRequest {
  readonly id: string;
  readonly body: string;
  readonly at: number;
  readonly nodes: number;
  /** Sent by shape: fulfilled, its record must hold `small` for every node and the shapes as sent. */
  readonly byShape: boolean;
  sent: boolean;
  releaseAt?: number;
  releasesSent: boolean;
  /** The client lease it took (seconds), and when its client dies (stops renewing, never releases). */
  readonly lease?: number;
  readonly diesAt?: number;
  /** Its death was seen by the release step, which then had its request settled once more. */
  deathSeen?: boolean;
  renewedAt?: number;
  /** When the user cancels it (if it is not done by then). */
  cancelAt?: number;
  cancelSent?: boolean;
  done: boolean;
}

class Stop extends Error {}

/** Live nodes, each counted once: a node on a min-ready node's slot is that node's (same place). */
const liveCount = (r: RequestRecord | undefined) =>
  r
    ? r.nodes.filter((n) => (n.state === 'pending' || n.state === 'ready') && n.spare === undefined).length
    : 0;
const nodeStates = (r: RequestRecord | undefined) => (r ? r.nodes.map((n) => n.state).join(',') : '');

/** Replaces ids in a message so that messages of one kind count together. */
export function normalize(text: string): string {
  return text
    .replace(/bn-[0-9a-f]{16}/g, 'bn-*')
    .replace(/i-[0-9a-f]{17}/g, 'i-*')
    .replace(/req-\d+(\/\d+)?/g, 'req-*')
    .replace(/#\d+/g, '#*')
    .replace(/version \d+/g, 'version *')
    .replace(/\d{4}-\d\d-\d\dT[\d:.]+Z/g, '<time>')
    .replace(/\d+(\.\d+)?s\b/g, '*s')
    .replace(/after \d+ /g, 'after * ')
    .slice(0, 160);
}

/** The use-case functions on the stack (innermost first), for the trace. */
function callers(): string {
  const frames = (new Error().stack ?? '').split('\n').slice(1);
  const names: string[] = [];
  for (const f of frames) {
    const m = /at (?:async )?(?:[\w$]+\.)?([\w$]+) \(.*\/shared\/(?:usecases|handlers)\//.exec(f);
    if (m?.[1] && names.at(-1) !== m[1]) names.push(m[1]);
  }
  return names.join(' < ') || '?';
}

/** Errors whose message says a core invariant broke (never expected, whatever the faults). */
const BUG_PATTERN =
  /illegal .* transition|cannot retire|is not a function|Cannot read|undefined is not|ZodError/i;

export function failureClass(reason: string | undefined): string {
  const r = reason ?? '';
  if (/unknown label|no label's slot fits/.test(r)) return 'unknown-label';
  if (/no capacity after/.test(r)) return 'no-capacity';
  if (/gave up after/.test(r)) return 'gave-up';
  if (/^cancelled:/.test(r)) return 'cancelled';
  if (/dead-letter queue/.test(r)) return 'dead-lettered';
  if (/failed to launch|failed after \d+ attempt|used all \d+ attempt/.test(r)) return 'launch-retries';
  if (/timeout/.test(r)) return 'timeout';
  if (/terminated|shutting-down|vanished|spot/.test(r)) return 'backing-lost';
  return 'other';
}

export class ChaosRun {
  private readonly clock = new ManualClock(START);
  private readonly random: Random;
  private readonly sched: Random;
  private readonly faults: Random;
  private readonly jitter: Random;
  /** Draws the requests' expected durations (a fork of its own: the rest of the schedule is unchanged). */
  private readonly hints: Random;
  private readonly shapes: Random;
  private readonly leases: Random;
  /** Draws who names itself as the request's requestor (a fork of its own: seeds keep their schedule). */
  private readonly requestors: Random;
  /** Replaced once, before the drain: min-ready lowered to 0 (what every context reads from then on). */
  private config: ResolvedConfig;
  private readonly poolKey: string;
  private readonly backingPoolKey: string;
  private readonly tickMs: number;
  private readonly limits: Limits;
  private readonly tracker = new Tracker();
  private readonly crash: CrashInjector;
  private readonly requestQueue: ChaosQueue;
  private readonly fulfilQueue: ChaosQueue;
  private readonly eventBuffer: StateChangeEvent[] = [];

  private engine: InProcessDynalite | undefined;
  private dynamodb!: DynamoDBClient;
  private raw!: DynamoStore;
  private tableName!: string;
  /** The store of the one process (ChaosOptions.oneProcess), else undefined: each container its own. */
  private store: DynamoStore | undefined;
  private ec2!: FakeEc2;
  private chaosClient!: EC2Client;
  private requestContainers: Container[] = [];
  /** The request function on the request dead-letter queue (its own event source mapping). */
  private deadLetterContainer!: Container;
  private fulfilContainers: Container[] = [];
  private reaper!: () => Promise<ReapReport>;

  // the client side: arrivals and jobs
  private readonly client: ClientRequest[] = [];
  private readonly clientById = new Map<string, ClientRequest>();
  private nextArrival = 0;
  private notDone = 0;

  // mirror of every write the handlers made (from the store's results)
  private readonly requests = new Map<string, RequestRecord>();
  private readonly backing = new Map<string, BackingRecord>();
  private readonly touched = new Set<string>();
  private liveNodes = 0;
  private notStopped = 0;
  private lastProgressAt = START;

  // EC2 bookkeeping
  private readonly knownTokens = new Set<string>();
  private readonly knownInstances = new Set<string>();
  private readonly deathDecided = new Set<string>();
  private capacityPhase = true;

  private readonly report: ChaosReport;
  private readonly started = performance.now();
  private readonly violations: string[] = [];

  constructor(private readonly options: ChaosOptions) {
    this.random = new Random(options.seed);
    this.sched = this.random.fork('schedule');
    this.faults = this.random.fork('faults');
    this.jitter = this.random.fork('jitter');
    this.hints = this.random.fork('hints');
    this.shapes = this.random.fork('shapes');
    this.leases = this.random.fork('leases');
    this.requestors = this.random.fork('requestors');
    this.tickMs = options.tickMs ?? 100;
    this.config = parseConfigOrThrow(
      chaosYaml(options.nodeCap ?? true, CHAOS_POOL.minReady, options.readyAuto),
      'chaos.yaml',
    );
    const pool = this.config.metastaticPools[0];
    const backingPool = this.config.backingPools[0];
    if (!pool || !backingPool) throw new Error('chaos config has no pools');
    this.poolKey = pool.key;
    this.backingPoolKey = backingPool.key;
    this.limits = {
      nodesMax: (options.nodeCap ?? true) ? CHAOS_POOL.nodesMax : undefined,
      // The most untaken ready nodes: min-ready, or with auto its max-ready.
      minReady: new Map([
        ...this.config.minReady,
        ...[...(this.config.readyAuto ?? new Map())].map(([label, a]) => [label, a.maxReady] as const),
      ]),
      backingMax: CHAOS_POOL.backingMax,
      // A claim's lease, then a reaper run or two; a crashed release comes back much sooner.
      staleEntryMs: SLOT_LEASE_MS + 60_000,
      unsettledMs: 5 * 60_000,
      // ORPHAN_GRACE_MS (2 min) after launch, then a reaper run.
      orphanMs: 3 * 60_000,
      // One reaper period to notice, another for a run that crashed, 5 s for the run itself.
      leaseOverrunMs: 2 * (options.reaperEveryTicks ?? 1) * this.tickMs + 5_000,
    };
    this.crash = new CrashInjector(this.random.fork('crash'), this.clock, { maxK: 3, patienceMs: 20_000 });
    this.requestQueue = new ChaosQueue(
      { name: 'request', copies: 2, ...QUEUES.request },
      this.clock,
      this.random.fork('request-queue'),
    );
    this.fulfilQueue = new ChaosQueue(
      { name: 'fulfil', copies: 2, ...QUEUES.fulfil },
      this.clock,
      this.random.fork('fulfil-queue'),
    );
    this.report = {
      seed: options.seed,
      requests: options.requests,
      nodes: 0,
      fulfilled: 0,
      failed: 0,
      failedByClass: {},
      nodesLostAfterReady: 0,
      launches: 0,
      launchApiFailures: 0,
      launchDeaths: 0,
      deathsAfterBoot: 0,
      capacityErrors: 0,
      throttleBursts: 0,
      throttledCalls: 0,
      duplicatesDelivered: 0,
      redeliveries: 0,
      cancelsSent: 0,
      byShape: 0,
      byShapeNoFit: 0,
      leases: { clients: 0, dead: 0, renewals: 0, lapsed: 0 },
      minReady: { made: 0, taken: 0 },
      readyAuto: options.readyAuto ?? false,
      crashes: 0,
      crashesByKind: { request: 0, fulfil: 0, reaper: 0 },
      boundaries: { total: this.crash.boundaries.length, hit: 0, neverHit: [], insideTransactions: 0 },
      maxInstances: 0,
      maxBackingRecords: 0,
      maxLiveNodes: 0,
      nodeCap: options.nodeCap ?? true,
      staleEntries: 0,
      doubleEntries: 0,
      reclaimedSlots: 0,
      reclaimedPlaces: 0,
      orphansTerminated: 0,
      deadLetters: { request: 0, fulfil: 0 },
      deadLettersHandled: 0,
      retryReasons: {},
      reaperErrors: {},
      trace: [],
      ticks: 0,
      checks: 0,
      calls: { store: 0, provider: 0 },
      timing: { ec2: 0, invocations: 0, checks: 0, reaper: 0 },
      virtualSeconds: 0,
      realSeconds: 0,
      violations: this.violations,
    };
    this.planArrivals();
  }

  // ---- setup -------------------------------------------------------------------------------------------

  private planArrivals(): void {
    // Waves of 5-30 requests with quiet gaps of 3-12 s between them, so backing nodes also empty,
    // get reaped and are launched again while requests keep coming.
    const mean = this.options.meanArrivalMs ?? 300;
    let at = START + 1_000;
    let wave = 0;
    for (let i = 0; i < this.options.requests; i++) {
      if (wave === 0) {
        wave = this.sched.int(5, 30);
        if (i > 0) at += this.sched.int(3_000, 12_000);
      }
      wave--;
      at += this.sched.int(0, 2 * mean);
      let labels: string[];
      if (this.sched.chance(0.02)) labels = ['gpu-huge'];
      else if (this.sched.chance(0.5)) labels = ['small'];
      else labels = Array.from({ length: this.sched.int(2, 4) }, () => 'small');
      const id = `req-${i}`;
      const priority = this.sched.chance(CHAOS_POOL.priorityShare)
        ? CHAOS_POOL.priorities[this.sched.int(0, CHAOS_POOL.priorities.length - 1)]
        : undefined;
      const cancelAt = this.sched.chance(CHAOS_POOL.cancelShare) ? at + this.sched.int(0, 20_000) : undefined;
      // Some say how long their job runs (jobs run 1-15 s): duration-aware placement under faults.
      const hint = this.hints.chance(CHAOS_POOL.hintShare) ? this.hints.int(1, 15) : undefined;
      // Some ask by shape (a forked stream, so seeds keep their schedule): the pool chooses `small`.
      const byShape = this.shapes.chance(CHAOS_POOL.shapeShare);
      // Some take a lease, and some of their clients die (a forked stream: seeds keep their schedule).
      // Most name one of a few requestors (learned durations and the arrival forecast count per requestor,
      // the forecast at most 30 a minute each, issue 40), the others none.
      const requestor = this.requestors.chance(CHAOS_POOL.requestorShare)
        ? `team-${this.requestors.int(0, CHAOS_POOL.requestors - 1)}`
        : undefined;
      const lease = this.leases.chance(CHAOS_POOL.leaseShare) ? CHAOS_POOL.leaseSeconds : undefined;
      const diesAt =
        lease !== undefined && this.leases.chance(CHAOS_POOL.leaseCrashShare)
          ? at + this.leases.int(0, 30_000)
          : undefined;
      if (lease !== undefined) this.report.leases.clients++;
      if (diesAt !== undefined) this.report.leases.dead++;
      const noFit = labels[0] === 'gpu-huge';
      if (byShape) {
        this.report.byShape++;
        if (noFit) this.report.byShapeNoFit++;
      }
      const asked = byShape
        ? {
            shapes: labels.map(() =>
              noFit ? { cores: 64, memory: '512GiB' } : { cores: 1, memory: '2GiB' },
            ),
          }
        : { labels };
      const c: ClientRequest = {
        id,
        byShape,
        body: JSON.stringify({
          kind: 'request',
          id,
          ...asked,
          ...(priority === undefined ? {} : { priority }),
          ...(hint === undefined ? {} : { 'expected-duration': hint }),
          ...(lease === undefined ? {} : { lease }),
          ...(requestor === undefined ? {} : { requestor }),
        }),
        at,
        nodes: labels.length,
        sent: false,
        releasesSent: false,
        ...(cancelAt === undefined ? {} : { cancelAt }),
        ...(lease === undefined ? {} : { lease }),
        ...(diesAt === undefined ? {} : { diesAt }),
        done: false,
      };
      this.client.push(c);
      this.clientById.set(id, c);
      this.report.nodes += labels.length;
    }
    this.notDone = this.client.length;
  }

  private async setup(): Promise<void> {
    let transactions: LocalTransactions;
    if (this.options.endpoint) {
      ({ client: this.dynamodb, transactions } = localDynamoClient(
        {
          endpoint: this.options.endpoint,
          region: REGION,
          credentials: { accessKeyId: 'x', secretAccessKey: 'x' },
        },
        this.options.endpoint,
      ));
    } else {
      // dynalite in this process, without a socket: the engine's semantics are what the invariants
      // test, not loopback HTTP, which was about half of each call's time.
      this.engine = await startInProcessDynalite();
      this.dynamodb = this.engine.client;
      transactions = this.engine.transactions;
    }
    const tableName = `chaos-${this.options.seed}-${Date.now()}`;
    // dynalite has no transactions: the client runs them, as the embedded pool's does. A crash can come
    // between two actions of one (chaosCrash.ts TRANSACTION_STEP): rolled back from its intent item.
    transactions.afterAction = () => this.crash.step();
    await ensureTable(this.dynamodb, tableName);
    this.tableName = tableName;
    this.raw = new DynamoStore(this.dynamodb, tableName, this.clock);
    if (this.options.oneProcess) this.store = this.containerStore();
    this.ec2 = new FakeEc2({
      region: REGION,
      clock: this.clock,
      bootDelayMs: FAULTS.bootDelayMs,
      terminateDelayMs: FAULTS.terminateDelayMs,
      onEvent: (e) => void this.eventBuffer.push(e),
    });
    this.ec2.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: CHAOS_POOL.scarceType });
    this.chaosClient = this.wrapEc2Client(this.ec2.client);
    const concurrency = this.options.concurrency ?? 16;
    for (let i = 0; i < concurrency; i++) {
      this.requestContainers.push({
        kind: 'request',
        handler: makeRequestHandler(this.context('request'), {
          maxReceiveCount: QUEUES.request.maxReceiveCount,
        }),
      });
    }
    this.deadLetterContainer = {
      kind: 'request',
      handler: makeDeadLetterHandler(this.context('request')),
    };
    for (let i = 0; i < (this.options.fulfilConcurrency ?? 4); i++) {
      this.fulfilContainers.push({ kind: 'fulfil', handler: makeFulfilHandler(this.context('fulfil')) });
    }
    this.reaper = makeReaperHandler(this.context('reaper'));
  }

  /**
   * A store for one container (its module state is keyed by it), on the shared client and table: every
   * call a boundary of the crash injector, every write mirrored.
   */
  private containerStore(): DynamoStore {
    return this.crash.wrap(
      'store',
      new DynamoStore(this.dynamodb, this.tableName, this.clock),
      STORE_METHODS,
      (m, args, result) => this.observe(m, args, result),
    );
  }

  /**
   * One Lambda container's context: its own EC2 provider (its own memory of failed offerings) and its own
   * store, so its own module state (unless oneProcess).
   */
  private context(kind: HandlerKind): Context {
    const provider = new Ec2Provider({
      client: this.chaosClient,
      pools: this.config.backingPools.filter((p) => p.driver === 'aws'),
      poolId: POOL_ID,
      clock: this.clock,
      // Backoff on virtual time: a throttled call is retried at once (the burst is what it consumes).
      sleep: async () => {},
      random: () => this.jitter.next(),
    });
    const wrapped = this.crash.wrap<BackingProvider>('provider', provider, PROVIDER_METHODS);
    const providers: ProviderRegistry = {
      forPool: (key) => {
        if (provider.servesPool(key)) return wrapped;
        throw new Error(`unknown backing pool ${key}`);
      },
      forResource: (id) => (isEc2InstanceId(id) ? wrapped : undefined),
    };
    const run = this;
    return {
      store: this.store ?? this.containerStore(),
      // Read at each use: the drain lowers min-ready under running containers, as a redeploy would.
      get config() {
        return run.config;
      },
      providers,
      clock: this.clock,
      log: this.log(kind),
      // The instances' addresses are not reachable from here: their port answers by fiat.
      probePort: async () => true,
      // Jobs last 1-15 s here where a CI job's last minutes: a quick release in proportion (30 s / 60).
      quickReleaseMs: CHAOS_QUICK_RELEASE_MS,
    };
  }

  private log(kind: HandlerKind): Log {
    const count = (table: Record<string, number>, text: string) => {
      const key = normalize(text);
      table[key] = (table[key] ?? 0) + 1;
    };
    return {
      debug() {},
      info: (message, ...extra) => {
        if (message !== 'message will be retried') return;
        const reason = String(extra[0]?.reason ?? '');
        count(this.report.retryReasons, `${kind}: ${reason}`);
        if (this.options.trace?.some((id) => reason.includes(id))) {
          const inv = this.crash.current();
          this.report.trace.push(
            `[t+${((this.clock.now() - START) / 1000).toFixed(1)}s tick ${this.report.ticks}] ` +
              `${inv ? `${inv.kind} #${inv.id}` : kind}: message will be retried: ${reason}`,
          );
        }
        if (BUG_PATTERN.test(reason)) this.violation(`${kind} handler error: ${reason}`);
      },
      warn: (message, ...extra) => {
        // A renewal that arrives after its request ended (the client's own release, a cancel, its lease
        // lapsed while a renewal was delayed) is refused by design: clients race the pool.
        if (message === 'rejected message' && RENEWAL_TOO_LATE.test(String(extra[0]?.reason ?? ''))) return;
        if (message === 'rejected message' || message === 'rejected event') {
          this.violation(`${kind} handler rejected a well-formed ${message.slice(9)}: ${extra[0]?.reason}`);
        }
      },
      error: (message, ...extra) => {
        const e = extra[0]?.error;
        const text = e instanceof Error ? e.message : String(extra[0]?.reason ?? '');
        if (BUG_PATTERN.test(text)) this.violation(`${kind}: ${message}: ${text}`);
      },
    };
  }

  /** The EC2 client the providers use: injects launch failures, watches launches and terminations. */
  private wrapEc2Client(client: EC2Client): EC2Client {
    const send = async (command: unknown, ...rest: unknown[]): Promise<unknown> => {
      if (command instanceof RunInstancesCommand) this.beforeRun(command.input);
      if (command instanceof TerminateInstancesCommand) this.beforeTerminate(command.input);
      let out: unknown;
      try {
        out = await (client.send as (c: unknown, ...r: unknown[]) => Promise<unknown>)(command, ...rest);
      } catch (err) {
        const name = (err as Error).name;
        if (name === 'InsufficientInstanceCapacity') this.report.capacityErrors++;
        if (name === 'RequestLimitExceeded') this.report.throttledCalls++;
        throw err;
      }
      if (command instanceof RunInstancesCommand)
        this.afterRun(command.input, out as RunInstancesCommandOutput);
      return out;
    };
    return new Proxy(client, {
      get: (t, prop) => {
        if (prop === 'send') return send;
        const value = Reflect.get(t, prop, t) as unknown;
        return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(t) : value;
      },
    });
  }

  private beforeRun(input: RunInstancesCommandInput): void {
    const token = input.ClientToken;
    if (token !== undefined && this.knownTokens.has(token)) return; // a replay: EC2 returns the same instance
    if (this.faults.chance(FAULTS.launchApiFailure)) {
      this.report.launchApiFailures++;
      throw ec2Error('ChaosLaunchFailure', 'fake EC2 (chaos): the launch failed');
    }
  }

  private afterRun(input: RunInstancesCommandInput, out: RunInstancesCommandOutput): void {
    if (input.ClientToken !== undefined) this.knownTokens.add(input.ClientToken);
    for (const i of out.Instances ?? []) {
      const id = i.InstanceId;
      if (!id || this.knownInstances.has(id)) continue;
      this.knownInstances.add(id);
      this.report.launches++;
      if (this.faults.chance(FAULTS.launchDeath)) {
        this.deathDecided.add(id);
        this.report.launchDeaths++;
        this.ec2.kill(id, {
          afterMs: this.faults.int(0, FAULTS.bootDelayMs - 1),
          reason: 'Server.InternalError: Internal error on launch',
        });
      }
    }
    const running = this.ec2.instances.filter((i) => i.state === 'pending' || i.state === 'running');
    this.report.maxInstances = Math.max(this.report.maxInstances, running.length);
    if (running.length > CHAOS_POOL.backingMax) {
      this.violation(
        `${running.length} pending/running instances > backing max-servers ${CHAOS_POOL.backingMax} after a launch: ` +
          running.map((i) => `${i.instanceId}=${i.tags[TAG_BACKING_NODE_ID]}`).join(', '),
      );
    }
  }

  /** No instance is terminated while its backing node holds a slot. */
  private beforeTerminate(input: TerminateInstancesCommandInput): void {
    for (const id of input.InstanceIds ?? []) {
      const i = this.ec2.instance(id);
      if (!i || (i.state !== 'pending' && i.state !== 'running')) continue;
      const backingId = i.tags[TAG_BACKING_NODE_ID] ?? '';
      const b = this.backing.get(backingId);
      if (b && b.used > 0 && (b.resourceId === id || b.resourceId === undefined)) {
        this.violation(
          `instance ${id} is being terminated while backing ${b.id} (${b.state}) holds ${JSON.stringify(b.slotMap)}`,
        );
      }
    }
  }

  // ---- the mirror --------------------------------------------------------------------------------------

  private async observe(method: string, args: unknown[], result: unknown): Promise<void> {
    if (this.options.trace?.length) this.traceWrite(method, args, result);
    switch (method) {
      case 'renewLease':
      case 'lapseLease':
      case 'dropLease': {
        // The lease writes answer only whether they took effect: the mirror reads what they wrote.
        const written = result ? await this.raw.getRequest(args[0] as string) : undefined;
        if (written) this.mirrorRequest(written);
        break;
      }
      case 'createRequest':
        if (result === undefined) this.mirrorRequest(args[0] as RequestRecord);
        break;
      case 'putRequest':
        this.mirrorRequest(args[0] as RequestRecord);
        break;
      case 'releaseNodeEntry':
      case 'takeSpareNode':
        if (result) this.mirrorRequest(result as RequestRecord);
        break;
      case 'createBacking':
        if (result === undefined) this.mirrorBacking(args[0] as BackingRecord);
        break;
      case 'putBacking':
        this.mirrorBacking(args[0] as BackingRecord);
        break;
      case 'claimSlot': {
        const out = result as { claimed: boolean; record?: BackingRecord; current?: BackingRecord };
        const seen = out.claimed ? out.record : out.current;
        if (seen) this.mirrorBacking(seen);
        break;
      }
    }
  }

  private traceWrite(method: string, args: unknown[], result: unknown): void {
    if (!/^(create|put|claim|release|reserve|takeOver|takeSpare|free|renew|lapse|drop)/.test(method)) return;
    const text = JSON.stringify(args.map((a) => (a instanceof Set ? [...a] : a)));
    const ids = this.options.trace ?? [];
    if (!ids.some((id) => text.includes(id))) return;
    const inv = this.crash.current();
    const outcome = method.startsWith('create') ? (result === undefined ? 'created' : 'exists') : 'ok';
    this.report.trace.push(
      `[t+${((this.clock.now() - START) / 1000).toFixed(1)}s tick ${this.report.ticks}] ` +
        `${inv ? `${inv.kind} #${inv.id}` : 'harness'} ${method} ${outcome} (via ${callers()}): ${text.slice(0, 600)}`,
    );
  }

  private mirrorRequest(next: RequestRecord): void {
    const old = this.requests.get(next.id);
    if (old && old.version >= next.version) return;
    const r = structuredClone(next);
    this.requests.set(r.id, r);
    this.liveNodes += liveCount(r) - liveCount(old);
    this.report.maxLiveNodes = Math.max(this.report.maxLiveNodes, this.liveNodes);
    if (this.limits.nodesMax !== undefined && this.liveNodes > this.limits.nodesMax) {
      this.violation(
        `${this.liveNodes} live nodes > metastatic max-servers ${CHAOS_POOL.nodesMax} (after a write of ${r.id})`,
      );
    }
    if (old?.state !== r.state || nodeStates(old) !== nodeStates(r)) {
      this.lastProgressAt = this.clock.now();
      this.touched.add(r.id);
    }
  }

  private mirrorBacking(next: BackingRecord): void {
    const old = this.backing.get(next.id);
    if (old && old.version >= next.version) return;
    const b = structuredClone(next);
    this.backing.set(b.id, b);
    this.notStopped += (b.state !== 'stopped' ? 1 : 0) - (old && old.state !== 'stopped' ? 1 : 0);
    if (holdsCapacity(b, (id) => this.ec2.instance(id))) {
      const holding = [...this.backing.values()].filter((x) =>
        holdsCapacity(x, (id) => this.ec2.instance(id)),
      );
      this.report.maxBackingRecords = Math.max(this.report.maxBackingRecords, holding.length);
      if (holding.length > CHAOS_POOL.backingMax) {
        this.violation(
          `${holding.length} backing records holding capacity > backing max-servers ${CHAOS_POOL.backingMax} ` +
            `(after a write of ${b.id}): ${holding.map((x) => `${x.id} (${x.state})`).join(', ')}`,
        );
      }
    }
    if ((b.state === 'retiring' || b.state === 'stopped') && b.used > 0) {
      this.violation(`backing ${b.id} was written ${b.state} while holding ${JSON.stringify(b.slotMap)}`);
    }
    if (old?.state !== b.state) this.lastProgressAt = this.clock.now();
  }

  // ---- the loop -------------------------------------------------------------------------------------------

  async run(): Promise<ChaosReport> {
    await this.setup();
    try {
      await this.load();
      await this.drain();
      this.finishFigures();
      if (this.violations.length > 0) throw new ChaosFailure(this.report);
      return this.report;
    } catch (err) {
      if (!(err instanceof Stop)) throw err;
      this.finishFigures();
      throw new ChaosFailure(this.report);
    } finally {
      this.ec2.restore();
      this.dynamodb.destroy();
      await this.engine?.close();
    }
  }

  /** Requests arrive, are served and released, until every one of them is done. */
  private async load(): Promise<void> {
    const checkEvery = this.options.checkEveryTicks ?? 20;
    const watchdogMs = this.options.watchdogMs ?? 90_000;
    let lastLine = START;
    while (this.notDone > 0) {
      await this.tick(this.tickMs, true);
      if (this.report.ticks % checkEvery === 0) await this.check();
      const now = this.clock.now();
      // Outstanding requests must see progress (a request or node changing state, a backing node
      // changing state) at least every watchdogMs; an idle pool owes none.
      const outstanding = this.notDone - (this.client.length - this.nextArrival);
      if (outstanding === 0) this.lastProgressAt = now;
      if (now - this.lastProgressAt > watchdogMs) {
        this.violation(
          `watchdog: no progress for ${((now - this.lastProgressAt) / 1000).toFixed(1)}s (virtual); ` +
            `not done: ${this.describeOutstanding()}`,
        );
      }
      // Every waiting request ends within its request-timeout (and the reaper runs it takes).
      const reaperPeriodMs = (this.options.reaperEveryTicks ?? 1) * this.tickMs;
      const due = now - CHAOS_POOL.requestTimeoutSeconds * 1000 - reaperPeriodMs - CHAOS_POOL.timeoutSlackMs;
      for (const r of this.requests.values()) {
        if (r.state === 'requested' && r.createdAt < due) {
          this.violation(
            `request ${r.id} still waiting ${((now - r.createdAt) / 1000).toFixed(1)}s after it was recorded, ` +
              `past its request-timeout of ${CHAOS_POOL.requestTimeoutSeconds}s`,
          );
          break;
        }
      }
      for (const c of this.client) {
        if (c.sent && !c.done && now - c.at > 15 * 60_000) {
          this.violation(
            `request ${c.id} not done ${(now - c.at) / 1000}s after it was sent: ${this.describe(c)}`,
          );
          break;
        }
      }
      if (this.violations.length > 0) throw new Stop();
      if (this.options.progress && now - lastLine >= 60_000) {
        lastLine = now;
        this.options.progress(this.progressLine());
      }
    }
  }

  /** Everything is released: the reaper runs until nothing is left. */
  private async drain(): Promise<void> {
    // The operator lowers min-ready to 0: the reaper ends the free ready nodes, takers end theirs.
    this.config = parseConfigOrThrow(chaosYaml(this.options.nodeCap ?? true, 0), 'chaos.yaml');
    for (const r of this.requests.values()) {
      if (isSpareRequestId(r.id)) continue; // the pool's own: ended by the reaper, or with their taker
      for (const n of r.nodes) {
        if (n.state === 'pending' || n.state === 'ready') {
          this.requestQueue.send(JSON.stringify({ kind: 'release', nodeId: n.id }));
        }
      }
    }
    // The reaper every 5 s (virtual) from here, for up to 20 minutes: past the slot lease and the orphan grace.
    for (let i = 1; i <= 240; i++) {
      await this.tick(5_000, false);
      if (i % 4 === 0) await this.check();
      if (this.violations.length > 0) throw new Stop();
      if (await this.quiescent()) break;
    }
    const snapshot = await this.snapshot();
    this.violations.push(...checkInvariants(snapshot, this.limits, this.tracker));
    this.violations.push(
      ...checkFinal(
        snapshot,
        this.client.map((c) => c.id),
      ),
    );
    for (const m of this.requestQueue.deadLetters) {
      this.violations.push(
        `request message left in the dead-letter queue (its consumer never handled it): ${m.body}`,
      );
    }
  }

  /**
   * Nothing left to do: no message, no instance, every backing record stopped, the capacity sets
   * empty (a place a dead delivery left is given back by the reaper once the slot lease has passed;
   * one still there when the drain ends is leaked for good: the final check reports it).
   */
  private async quiescent(): Promise<boolean> {
    if (this.requestQueue.size > 0 || this.fulfilQueue.size > 0) return false;
    if (this.requestQueue.deadLetters.length > 0) return false;
    if (this.ec2.instances.some((i) => i.state === 'pending' || i.state === 'running')) return false;
    if (this.notStopped !== 0) return false;
    const sets = [keys.poolNodes(this.poolKey), keys.backingPool(this.backingPoolKey)];
    for (const key of sets) {
      if ((await this.raw.capacity.members(key)).size > 0 || (await this.raw.capacity.used(key)) > 0)
        return false;
    }
    return true;
  }

  private async tick(dt: number, faults: boolean): Promise<void> {
    const t0 = performance.now();
    this.clock.advance(dt);
    this.report.ticks++;
    if (faults) this.injectEc2Faults();
    this.ec2.tick();
    await this.ec2.settled();
    this.decideDeaths();
    this.flushEvents();
    this.sendArrivals();
    this.sendReleases();
    this.sendCancels();
    this.sendRenewals();
    const work: Promise<void>[] = [];
    // The queues are polled every pollEveryTicks (Lambda's pollers gather a batching window), so
    // what arrived meanwhile, duplicates included, is handled by concurrent invocations at once.
    if (this.report.ticks % (this.options.pollEveryTicks ?? 5) === 0 || !faults) {
      for (const [queue, containers] of [
        [this.requestQueue, this.requestContainers],
        [this.fulfilQueue, this.fulfilContainers],
      ] as const) {
        for (const [i, batch] of this.batches(queue, containers.length).entries()) {
          work.push(this.invoke(containers[i] as Container, batch, queue));
        }
      }
      if (this.requestQueue.deadLetters.length > 0) work.push(this.drainDeadLetters());
    }
    if (!faults || this.report.ticks % (this.options.reaperEveryTicks ?? 1) === 0) {
      work.push(this.timed('reaper', () => this.runReaper()));
    }
    const t1 = performance.now();
    await this.withTimeout(Promise.all(work));
    const t2 = performance.now();
    await this.ec2.settled();
    this.flushEvents();
    this.settleClient();
    this.report.timing.ec2 += t1 - t0 + (performance.now() - t2);
    this.report.timing.invocations += t2 - t1;
  }

  /**
   * Receives the visible messages into at most `invocations` batches of 1-10: either spread over as
   * many invocations as possible (most contention), or in batches of random size (records of a batch
   * are handled in order).
   */
  private batches(queue: ChaosQueue, invocations: number): QueuedMessage[][] {
    const out: QueuedMessage[][] = [];
    const spread = this.sched.chance(0.5);
    while (out.length < invocations) {
      const size = spread ? 1 : this.sched.int(1, 10);
      const batch = queue.receive(size);
      if (batch.length === 0) break;
      out.push(batch);
    }
    if (spread) {
      // More messages than invocations: the rest join the batches, up to 10 each.
      for (const batch of out) {
        const more = queue.receive(9);
        batch.push(...more);
        if (more.length < 9) break;
      }
    }
    return out;
  }

  private injectEc2Faults(): void {
    if (this.faults.chance(FAULTS.throttleBurst)) {
      this.report.throttleBursts++;
      this.ec2.throttle(this.faults.int(2, 10));
    }
    if (this.faults.chance(FAULTS.capacityFlip)) {
      this.capacityPhase = !this.capacityPhase;
      this.ec2.clearFailures();
      if (this.capacityPhase) {
        this.ec2.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: CHAOS_POOL.scarceType });
      }
    }
  }

  /** 10% of the instances that reach running die some time later. */
  private decideDeaths(): void {
    for (const i of this.ec2.instances) {
      if (i.state !== 'running' || this.deathDecided.has(i.instanceId)) continue;
      this.deathDecided.add(i.instanceId);
      if (this.faults.chance(FAULTS.deathAfterBoot)) {
        this.report.deathsAfterBoot++;
        this.ec2.kill(i.instanceId, { afterMs: this.faults.int(0, FAULTS.deathWindowMs) });
      }
    }
  }

  /** EventBridge -> SQS: each state-change event goes to the fulfil queue (delivered twice). */
  private flushEvents(): void {
    for (const e of this.eventBuffer.splice(0)) this.fulfilQueue.send(JSON.stringify(e));
  }

  private sendArrivals(): void {
    const now = this.clock.now();
    while (this.nextArrival < this.client.length) {
      const c = this.client[this.nextArrival] as ClientRequest;
      if (c.at > now) break;
      this.requestQueue.send(c.body);
      c.sent = true;
      this.nextArrival++;
    }
  }

  private sendReleases(): void {
    const now = this.clock.now();
    for (const c of this.client) {
      if (c.releaseAt === undefined || c.releasesSent || c.releaseAt > now) continue;
      if (c.diesAt !== undefined && c.diesAt <= now) {
        // Dead: only its lease frees its nodes. Its request is settled once more when its death is seen:
        // if every node had already ended (failed with its backing node) while it lived, no record change
        // would ever bring it back to settleClient, and the run would wait for it for ever.
        if (!c.deathSeen) {
          c.deathSeen = true;
          this.touched.add(c.id);
        }
        continue;
      }
      c.releasesSent = true;
      for (let i = 0; i < c.nodes; i++) {
        this.requestQueue.send(JSON.stringify({ kind: 'release', nodeId: `${c.id}/${i}` }));
      }
      this.touched.add(c.id);
    }
  }

  /** Users who give up on a request: a cancel message, whatever state it is in by then. */
  private sendCancels(): void {
    const now = this.clock.now();
    for (const c of this.client) {
      if (c.cancelAt === undefined || c.cancelSent || !c.sent || c.done || c.cancelAt > now) continue;
      c.cancelSent = true;
      this.report.cancelsSent++;
      this.requestQueue.send(JSON.stringify({ kind: 'cancel', id: c.id, reason: 'chaos user' }));
      this.touched.add(c.id);
    }
  }

  /** Living clients with a lease renew it every third of its length until they have released. */
  private sendRenewals(): void {
    const now = this.clock.now();
    for (const c of this.client) {
      if (c.lease === undefined || !c.sent || c.done || c.releasesSent) continue;
      if (c.diesAt !== undefined && c.diesAt <= now) continue;
      const last = c.renewedAt ?? c.at;
      if (now - last < (c.lease * 1000) / 3) continue;
      c.renewedAt = now;
      this.report.leases.renewals++;
      this.requestQueue.send(JSON.stringify({ kind: 'renew', id: c.id }));
    }
  }

  /** The users: a fulfilled request's job runs 1-15 s (jobMs), then its nodes are released. */
  private settleClient(): void {
    const now = this.clock.now();
    for (const id of [...this.touched].sort()) {
      const c = this.clientById.get(id);
      const r = this.requests.get(id);
      if (!c || !r || c.done) continue;
      if (r.state === 'fulfilled' && c.releaseAt === undefined) {
        const [min, max] = this.options.jobMs ?? [1_000, 15_000];
        c.releaseAt = now + this.sched.int(min, max);
      }
      const released = r.nodes.every((n) => n.state === 'released' || n.state === 'failed');
      // A dead client's request is done when its lease has freed its nodes.
      const dead = c.diesAt !== undefined && c.diesAt <= now;
      if (r.state === 'failed' || (r.state === 'fulfilled' && (c.releasesSent || dead) && released)) {
        c.done = true;
        this.notDone--;
      }
    }
    this.touched.clear();
  }

  private async invoke(c: Container, batch: QueuedMessage[], queue: ChaosQueue): Promise<void> {
    const arn = `arn:aws:sqs:${REGION}:000000000000:chaos-${c.kind}`;
    const out = await this.crash.run(c.kind, () => c.handler(toSqsEvent(batch, arn)));
    const ids = this.options.trace ?? [];
    const traced = batch.filter((m) => ids.some((id) => m.body.includes(id)));
    if (traced.length > 0 || (ids.length > 0 && out.crashedAt)) {
      const failures = out.ok ? out.value.batchItemFailures.map((f) => f.itemIdentifier) : [];
      this.report.trace.push(
        `[t+${((this.clock.now() - START) / 1000).toFixed(1)}s tick ${this.report.ticks}] ${c.kind} #${out.invocation} ` +
          `handled ${(traced.length > 0 ? traced : batch).map((m) => `${m.messageId} (receive ${m.receives}) ${m.body.slice(0, 200)}`).join('; ')}` +
          ` -> ${out.crashedAt ? `crashed ${out.crashedAt}` : out.ok ? `ok, failed items: ${failures.join(',') || 'none'}` : `threw ${String(out.error)}`}`,
      );
    }
    if (!out.ok || out.crashedAt) {
      // Lambda crashed (or the handler threw): the whole batch comes back.
      if (!out.ok && !out.crashedAt) {
        this.violation(`${c.kind} handler threw: ${(out.error as Error)?.stack ?? String(out.error)}`);
      }
      for (const m of batch) queue.fail(m);
      return;
    }
    const failed = new Set(out.value.batchItemFailures.map((f) => f.itemIdentifier));
    for (const m of batch) {
      if (failed.has(m.messageId)) queue.fail(m);
      else queue.ack(m);
    }
  }

  /**
   * The dead-letter queue's consumer: it ends what the request handler's last delivery could not. It
   * crashes like any invocation; what it does not handle stays for the next poll.
   */
  private async drainDeadLetters(): Promise<void> {
    const batch = this.requestQueue.deadLetters.splice(0, 10);
    const arn = `arn:aws:sqs:${REGION}:000000000000:chaos-request-dlq`;
    const out = await this.crash.run('request', () =>
      this.deadLetterContainer.handler(toSqsEvent(batch, arn)),
    );
    this.report.deadLettersHandled += batch.length;
    if (!out.ok || out.crashedAt) {
      if (!out.ok && !out.crashedAt) {
        this.violation(`dead-letter handler threw: ${(out.error as Error)?.stack ?? String(out.error)}`);
      }
      this.requestQueue.deadLetters.push(...batch);
      return;
    }
    const failed = new Set(out.value.batchItemFailures.map((f) => f.itemIdentifier));
    this.requestQueue.deadLetters.push(...batch.filter((m) => failed.has(m.messageId)));
  }

  private async runReaper(): Promise<void> {
    const out = await this.crash.run('reaper', () => this.reaper());
    if (out.crashedAt && this.options.trace?.length) {
      this.report.trace.push(
        `[t+${((this.clock.now() - START) / 1000).toFixed(1)}s tick ${this.report.ticks}] reaper #${out.invocation} crashed ${out.crashedAt}`,
      );
    }
    if (!out.ok) {
      if (!out.crashedAt) this.violation(`reaper threw: ${(out.error as Error)?.stack ?? String(out.error)}`);
      return;
    }
    const report = out.value;
    this.report.reclaimedSlots += report.reclaimedSlots;
    this.report.reclaimedPlaces += report.reclaimedPlaces;
    this.report.orphansTerminated += report.orphans.length;
    this.report.leases.lapsed += report.leasesExpired?.length ?? 0;
    for (const e of report.errors) {
      if (/injected crash|is dead \(crashed/.test(e)) continue;
      const key = normalize(e);
      this.report.reaperErrors[key] = (this.report.reaperErrors[key] ?? 0) + 1;
      if (BUG_PATTERN.test(e)) this.violation(`reaper: ${e}`);
    }
  }

  private async timed(part: 'reaper', work: () => Promise<void>): Promise<void> {
    const t0 = performance.now();
    try {
      await work();
    } finally {
      this.report.timing[part] += performance.now() - t0;
    }
  }

  private async withTimeout<T>(work: Promise<T>): Promise<T> {
    const ms = this.options.tickTimeoutMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`tick ${this.report.ticks}: handlers still running after ${ms} ms (real)`)),
        ms,
      );
    });
    try {
      return await Promise.race([work, timeout]);
    } catch (err) {
      this.violation((err as Error).message);
      throw new Stop();
    } finally {
      clearTimeout(timer);
    }
  }

  // ---- checks ---------------------------------------------------------------------------------------------

  private async snapshot(): Promise<Snapshot> {
    // Each capacity set read once: its places and its counter's `used`.
    const pool = await this.raw.capacity.audit(keys.poolNodes(this.poolKey));
    const backing = await this.raw.capacity.audit(keys.backingPool(this.backingPoolKey));
    return {
      now: this.clock.now(),
      requests: await this.raw.listRequests(),
      backing: await this.raw.listBacking(),
      poolNodes: pool.members,
      backingPool: backing.members,
      poolUsed: pool.used,
      backingUsed: backing.used,
      instances: this.ec2.instances,
    };
  }

  private async check(): Promise<void> {
    const t0 = performance.now();
    this.report.checks++;
    const s = await this.snapshot();
    // The harness's own consistency: the mirror saw every write (else a write bypassed the proxy).
    for (const r of s.requests) {
      const m = this.requests.get(r.id);
      if (m?.version !== r.version) {
        this.violation(
          `harness: mirror of request ${r.id} is at version ${m?.version}, table at ${r.version}`,
        );
      }
    }
    for (const b of s.backing) {
      const m = this.backing.get(b.id);
      if (m?.version !== b.version) {
        this.violation(
          `harness: mirror of backing ${b.id} is at version ${m?.version}, table at ${b.version}`,
        );
      }
    }
    for (const v of checkInvariants(s, this.limits, this.tracker)) this.violation(v);
    this.report.timing.checks += performance.now() - t0;
  }

  private violation(text: string): void {
    const at = `[t+${((this.clock.now() - START) / 1000).toFixed(1)}s tick ${this.report.ticks}]`;
    if (this.violations.length < 200) this.violations.push(`${at} ${text}`);
  }

  // ---- figures -----------------------------------------------------------------------------------------------

  private finishFigures(): void {
    const r = this.report;
    r.fulfilled = 0;
    r.failed = 0;
    r.failedByClass = {};
    r.nodesLostAfterReady = 0;
    r.minReady = {
      made: [...this.requests.keys()].filter(isSpareRequestId).length,
      taken: [...this.requests.values()].reduce((k, x) => k + x.nodes.filter((n) => n.spare).length, 0),
    };
    for (const c of this.client) {
      const rec = this.requests.get(c.id);
      if (
        c.byShape &&
        rec &&
        rec.state !== 'failed' &&
        (rec.shapes?.length !== c.nodes || rec.labels.some((l) => l !== 'small'))
      ) {
        this.violation(
          `request ${c.id} by shape was recorded with labels ${rec.labels.join(',')} and ${rec.shapes?.length ?? 0} shapes`,
        );
      }
      if (rec?.state === 'fulfilled') {
        r.fulfilled++;
        r.nodesLostAfterReady += rec.nodes.filter((n) => n.state === 'failed').length;
      } else if (rec?.state === 'failed') {
        r.failed++;
        const k = failureClass(rec.reason);
        r.failedByClass[k] = (r.failedByClass[k] ?? 0) + 1;
      }
    }
    r.duplicatesDelivered = this.requestQueue.duplicateDeliveries + this.fulfilQueue.duplicateDeliveries;
    r.redeliveries = this.requestQueue.redeliveries + this.fulfilQueue.redeliveries;
    r.crashes = this.crash.total;
    r.crashesByKind = { ...this.crash.byKind };
    const labels = this.crash.boundaries.map(label);
    r.boundaries = {
      total: labels.length,
      hit: labels.filter((l) => this.crash.injected.has(l)).length,
      neverHit: labels.filter((l) => !this.crash.injected.has(l)),
      insideTransactions: this.crash.injected.get(`after store.${TRANSACTION_STEP}`) ?? 0,
    };
    r.calls = { store: 0, provider: 0 };
    for (const [name, n] of this.crash.calls) {
      if (name.includes(' store.')) r.calls.store += n;
      else r.calls.provider += n;
    }
    r.staleEntries = this.tracker.staleEntries.size;
    r.doubleEntries = this.tracker.doubleEntries.size;
    r.deadLetters = {
      request: this.requestQueue.deadLettered,
      fulfil: this.fulfilQueue.deadLettered,
    };
    r.virtualSeconds = Math.round((this.clock.now() - START) / 1000);
    r.realSeconds = Math.round((performance.now() - this.started) / 100) / 10;
  }

  private describe(c: ClientRequest): string {
    const r = this.requests.get(c.id);
    if (!r) return 'never recorded';
    return `${r.state}${r.reason ? ` (${r.reason})` : ''}; nodes ${r.nodes
      .map((n) => `${n.id}=${n.state}${n.backingNodeId ? `@${n.backingNodeId}#${n.slot}` : ''}`)
      .join(', ')}; releases ${c.releasesSent ? 'sent' : c.releaseAt ? 'scheduled' : 'not due'}`;
  }

  private describeOutstanding(): string {
    const out = this.client.filter((c) => c.sent && !c.done);
    return `${out.length} request(s): ${out
      .slice(0, 5)
      .map((c) => `${c.id}: ${this.describe(c)}`)
      .join(' | ')}`;
  }

  private progressLine(): string {
    const done = this.client.length - this.notDone;
    return (
      `t+${Math.round((this.clock.now() - START) / 1000)}s: ${this.nextArrival}/${this.client.length} sent, ` +
      `${done} done, ${this.liveNodes} live nodes, ${this.notStopped} backing, ${this.crash.total} crashes, ` +
      `${Math.round((performance.now() - this.started) / 1000)}s real`
    );
  }
}

export function runChaos(options: ChaosOptions): Promise<ChaosReport> {
  return new ChaosRun(options).run();
}

// ---- output -------------------------------------------------------------------------------------------------

const sec = (ms: number) => `${(ms / 1000).toFixed(1)}s`;

export function formatSummary(r: ChaosReport): string {
  const classes = Object.entries(r.failedByClass)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([k, n]) => `${k} ${n}`)
    .join(', ');
  const rows: [string, string][] = [
    ['seed', `${r.seed} (replay: npm run test:chaos -- --requests ${r.requests} --seed ${r.seed})`],
    ['requests / nodes', `${r.requests} / ${r.nodes}`],
    ['fulfilled', `${r.fulfilled} (nodes lost after ready: ${r.nodesLostAfterReady})`],
    ['failed', `${r.failed}${classes ? ` (${classes})` : ''}`],
    ['cancels sent', `${r.cancelsSent} (a cancel after fulfilment changes nothing; the user releases)`],
    ['requests by shape', `${r.byShape} (${r.byShapeNoFit} that no label fits, failed by design)`],
    [
      'leases',
      `${r.leases.clients} clients with a lease (${r.leases.dead} died without releasing), ${r.leases.renewals} renewals, ${r.leases.lapsed} requests ended by a lapsed lease`,
    ],
    [
      'min-ready',
      `${r.minReady.made} ready nodes made (${r.readyAuto ? `min-ready auto, max-ready ${CHAOS_POOL.maxReady}` : `min-ready ${CHAOS_POOL.minReady}`}), ${r.minReady.taken} nodes took one`,
    ],
    [
      'launches',
      `${r.launches} instances; failures: ${r.launchApiFailures} API + ${r.launchDeaths} died booting; ` +
        `${r.capacityErrors} capacity errors`,
    ],
    ['deaths after boot', String(r.deathsAfterBoot)],
    ['throttling', `${r.throttleBursts} bursts, ${r.throttledCalls} calls throttled`],
    ['deliveries', `${r.duplicatesDelivered} duplicates, ${r.redeliveries} redeliveries`],
    [
      'crashes',
      `${r.crashes} (request ${r.crashesByKind.request}, fulfil ${r.crashesByKind.fulfil}, reaper ` +
        `${r.crashesByKind.reaper}), ${r.boundaries.insideTransactions} inside a transaction; ` +
        `${r.boundaries.hit}/${r.boundaries.total} boundaries` +
        (r.boundaries.neverHit.length ? ` (never: ${r.boundaries.neverHit.join(', ')})` : ''),
    ],
    [
      'max concurrent',
      `${r.maxInstances} instances, ${r.maxBackingRecords} backing records holding capacity (cap ${CHAOS_POOL.backingMax}); ` +
        `${r.maxLiveNodes} live nodes (cap ${r.nodeCap ? CHAOS_POOL.nodesMax : 'none'})`,
    ],
    [
      'recovered',
      `${r.staleEntries} stale slot entries seen (${r.doubleEntries} node ids in two slot maps), ` +
        `${r.reclaimedSlots} claims reclaimed, ${r.reclaimedPlaces} capacity places reclaimed, ` +
        `${r.orphansTerminated} orphans terminated`,
    ],
    [
      'dead letters',
      `request ${r.deadLetters.request} (ended by their consumer; ${r.deadLettersHandled} deliveries), fulfil ${r.deadLetters.fulfil}`,
    ],
    ['calls', `${r.calls.store} DynamoDB (store), ${r.calls.provider} EC2 provider`],
    [
      'duration',
      `${r.realSeconds}s real (invocations ${sec(r.timing.invocations)}, of which reaper ${sec(r.timing.reaper)}, checks ${sec(r.timing.checks)}, ` +
        `EC2/queues ${sec(r.timing.ec2)}), ${r.virtualSeconds}s virtual, ${r.ticks} ticks, ${r.checks} invariant checks`,
    ],
  ];
  const width = Math.max(...rows.map(([k]) => k.length));
  return ['chaos run', ...rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`)].join('\n');
}

export function formatFailure(r: ChaosReport): string {
  const shown = r.violations.slice(0, 25);
  return [
    `chaos: ${r.violations.length} invariant violation(s) with seed ${r.seed} ` +
      `(replay: npm run test:chaos -- --requests ${r.requests} --seed ${r.seed} [--trace <id>,<id>])`,
    ...shown.map((v) => `  - ${v}`),
    ...(r.violations.length > shown.length ? [`  ... and ${r.violations.length - shown.length} more`] : []),
    ...(r.trace.length > 0 ? ['trace:', ...r.trace.map((t) => `  ${t}`)] : []),
    formatSummary(r),
  ].join('\n');
}
