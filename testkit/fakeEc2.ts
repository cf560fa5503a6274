/**
 * A stateful fake of the EC2 API for tests, on aws-sdk-client-mock: RunInstances, DescribeInstances,
 * TerminateInstances and DescribeImages keep instances in memory the way EC2 does.
 *
 * - RunInstances honours ClientToken idempotency (same token + same parameters -> the same instance;
 *   same token + other parameters -> IdempotentParameterMismatch), applies the TagSpecifications of
 *   `instance` and `volume`, and starts instances `pending`; they turn `running` after `bootDelayMs`.
 * - TerminateInstances moves them to `shutting-down`, then `terminated` after `terminateDelayMs`; a
 *   terminated instance stays describable for `forgetAfterMs` (EC2: about an hour). An unknown id fails
 *   the whole call with InvalidInstanceID.NotFound naming the missing ids, as EC2 does.
 * - DescribeInstances supports InstanceIds and the filters `tag:<key>`, `tag-key`, `instance-state-name`,
 *   `instance-id`, `instance-type`, `subnet-id`, and pages (MaxResults / NextToken, at most `pageSize`).
 * - Time is the injected ManualClock: state changes due by now are applied at every API call and by
 *   `tick()` / `advance(ms)`. Each change is reported to `onEvent` as an "EC2 Instance State-change
 *   Notification" (events.ts), one at a time, in order; `settled()` waits for the deliveries.
 * - Failures on demand: `failLaunches` (by instance type, subnet, market, or all; for the next N matching
 *   launches or until cleared), `throttle` (the next N calls), `failCalls` (any error for the next N
 *   calls of some commands), `kill` (an instance dies, now or later).
 * - GetConsoleOutput (base64, as EC2): once an instance runs, a kernel log; `consoleDelayMs` after it
 *   turned `running`, also the SSH host-key block cloud-init prints (testkit/consoleOutput.ts), with the
 *   instance's own keys (`hostKeysOf`). `consoleHostKeys = false`: an image that never prints them.
 * - Eventual consistency on demand: `notFoundAfterLaunchMs` (a new instance is unknown to DescribeInstances
 *   and TerminateInstances for that long after RunInstances, as EC2 documents) and `hide` (one instance is
 *   unknown for a while, or for good). An unknown instance answers InvalidInstanceID.NotFound by id and is
 *   left out of filtered lists; it still runs, changes state and emits its events.
 */
import {
  DescribeImagesCommand,
  type DescribeImagesCommandInput,
  type DescribeImagesCommandOutput,
  DescribeInstancesCommand,
  type DescribeInstancesCommandInput,
  type DescribeInstancesCommandOutput,
  EC2Client,
  EC2ServiceException,
  GetConsoleOutputCommand,
  type GetConsoleOutputCommandInput,
  type GetConsoleOutputCommandOutput,
  type Instance,
  type InstanceStateName,
  RunInstancesCommand,
  type RunInstancesCommandInput,
  type RunInstancesCommandOutput,
  type Tag,
  TerminateInstancesCommand,
  type TerminateInstancesCommandInput,
  type TerminateInstancesCommandOutput,
} from '@aws-sdk/client-ec2';
import { type AwsClientStub, mockClient } from 'aws-sdk-client-mock';
import { ManualClock } from '../shared/core/clock.ts';
import { type InstanceState, type StateChangeEvent, stateChangeEvent } from '../shared/core/stateChanges.ts';
import { cloudInitConsole, fakeEd25519Key } from './consoleOutput.ts';

export const EC2_EVENT_SOURCE = 'aws.ec2';

const STATE_CODES: Record<InstanceState, number> = {
  pending: 0,
  running: 16,
  'shutting-down': 32,
  terminated: 48,
  stopping: 64,
  stopped: 80,
};

export interface FakeVolume {
  readonly volumeId: string;
  readonly deviceName: string;
  readonly encrypted: boolean;
  readonly volumeType?: string;
  readonly sizeGiB?: number;
  readonly tags: Readonly<Record<string, string>>;
}

export interface FakeInstance {
  readonly instanceId: string;
  readonly reservationId: string;
  state: InstanceState;
  readonly instanceType: string;
  readonly imageId: string;
  readonly subnetId: string;
  readonly availabilityZone: string;
  privateIp?: string;
  publicIp?: string;
  readonly spot: boolean;
  readonly tags: Record<string, string>;
  readonly volumes: readonly FakeVolume[];
  readonly launchTime: number;
  readonly clientToken?: string;
  /** The RunInstances input that created it. */
  readonly request: RunInstancesCommandInput;
  stateReason?: string;
  /** When it reached `terminated` (forgotten forgetAfterMs later). */
  terminatedAt?: number;
  /** When it first turned `running` (its console's host-key block appears consoleDelayMs later). */
  runningAt?: number;
}

export interface LaunchFailure {
  /** The EC2 error code, e.g. InsufficientInstanceCapacity. */
  readonly code: string;
  readonly message?: string;
  /** Only launches of this instance type / in this subnet / of this market fail; unset = any. */
  readonly instanceType?: string;
  readonly subnetId?: string;
  readonly market?: 'spot' | 'on-demand';
  /** Fail this many matching launches, then stop; unset = until clearFailures(). */
  readonly times?: number;
}

export type Ec2CommandName =
  | 'RunInstances'
  | 'DescribeInstances'
  | 'TerminateInstances'
  | 'DescribeImages'
  | 'GetConsoleOutput';

const ALL_COMMANDS: readonly Ec2CommandName[] = [
  'RunInstances',
  'DescribeInstances',
  'TerminateInstances',
  'DescribeImages',
  'GetConsoleOutput',
];

export interface FakeEc2Options {
  readonly region?: string;
  /** The clock instances age by; share it with the code under test. Default: a new ManualClock. */
  readonly clock?: ManualClock;
  /** pending -> running. Default 30 s. */
  readonly bootDelayMs?: number;
  /** shutting-down -> terminated. Default 10 s. */
  readonly terminateDelayMs?: number;
  /** running -> the host-key block in the console output. Default 0. */
  readonly consoleDelayMs?: number;
  /** A terminated instance stays describable this long. Default 1 h. */
  readonly forgetAfterMs?: number;
  /** At most this many instances per DescribeInstances page. Default 1000. */
  readonly pageSize?: number;
  /** Subnet -> availability zone. Unlisted subnets are in `<region>a`. */
  readonly subnets?: Readonly<Record<string, string>>;
  /** The AMIs that exist and their root device names; unset = every `ami-...` exists with /dev/xvda. */
  readonly images?: Readonly<Record<string, { readonly rootDeviceName?: string }>>;
  readonly onEvent?: (event: StateChangeEvent) => void | Promise<void>;
  /** The client to mock; default a new EC2Client for the region (only this instance is mocked). */
  readonly client?: EC2Client;
}

interface Transition {
  readonly instanceId: string;
  readonly at: number;
  readonly state: InstanceState;
  readonly reason?: string;
}

interface FailureRule {
  readonly failure: LaunchFailure;
  remaining: number;
}

/** An EC2 API error as the SDK raises it (`name` is the EC2 error code). */
export function ec2Error(
  code: string,
  message = code,
  fault: 'client' | 'server' = 'client',
): EC2ServiceException {
  return new EC2ServiceException({
    name: code,
    $fault: fault,
    message,
    $metadata: { httpStatusCode: fault === 'server' ? 500 : 400, requestId: 'fake-request' },
  });
}

const DEFAULT_MESSAGES: Record<string, string> = {
  InsufficientInstanceCapacity:
    'We currently do not have sufficient capacity in the Availability Zone you requested.',
  VcpuLimitExceeded: 'You have requested more vCPU capacity than your current vCPU limit allows.',
  RequestLimitExceeded: 'Request limit exceeded.',
};

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([k, v]) => `${JSON.stringify(k)}:${canonical(v)}`)
      .join(',')}}`;
  }
  return JSON.stringify(value);
}

function tagRecord(tags: readonly Tag[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const tag of tags ?? []) if (tag.Key !== undefined) out[tag.Key] = tag.Value ?? '';
  return out;
}

function glob(pattern: string, value: string): boolean {
  if (!pattern.includes('*') && !pattern.includes('?')) return pattern === value;
  const re = pattern
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replace(/\*/g, '.*')
    .replace(/\?/g, '.');
  return new RegExp(`^${re}$`).test(value);
}

const INSTANCE_ID = /^i-(?:[0-9a-f]{8}|[0-9a-f]{17})$/;

export class FakeEc2 {
  readonly client: EC2Client;
  readonly mock: AwsClientStub<EC2Client>;
  readonly clock: ManualClock;
  readonly region: string;
  /** Every event emitted, in order. */
  readonly events: StateChangeEvent[] = [];
  /** Errors thrown by onEvent (deliveries go on). */
  readonly eventErrors: unknown[] = [];
  /** Who receives the state-change events; may be set after construction. */
  onEvent: ((event: StateChangeEvent) => void | Promise<void>) | undefined;
  bootDelayMs: number;
  terminateDelayMs: number;
  /** How long a new instance stays unknown to DescribeInstances and TerminateInstances. Default 0. */
  notFoundAfterLaunchMs = 0;
  /** How long after `running` cloud-init's host-key block shows in the console output. */
  consoleDelayMs: number;
  /** False: instances never print their host keys to the console (an image without cloud-init). */
  consoleHostKeys = true;

  private readonly forgetAfterMs: number;
  private readonly pageSize: number;
  private readonly subnets: Readonly<Record<string, string>>;
  private readonly images: Readonly<Record<string, { readonly rootDeviceName?: string }>> | undefined;
  private readonly byId = new Map<string, FakeInstance>();
  /** Instance id -> until when the API does not know it (eventual consistency). */
  private readonly unknownUntil = new Map<string, number>();
  private readonly tokens = new Map<string, { readonly hash: string; readonly instanceIds: string[] }>();
  private transitions: Transition[] = [];
  private failures: FailureRule[] = [];
  private injected: {
    remaining: number;
    skip: number;
    error: () => Error;
    commands?: ReadonlySet<Ec2CommandName>;
  }[] = [];
  /** Command -> how long each of its calls takes (on the clock). */
  private readonly latency = new Map<Ec2CommandName, number>();
  private counter = 0;
  private otherIds = 0;
  private delivery: Promise<void> = Promise.resolve();
  private callLog: { readonly command: Ec2CommandName; readonly input: unknown }[] = [];

  constructor(options: FakeEc2Options = {}) {
    this.region = options.region ?? 'eu-west-1';
    this.clock = options.clock ?? new ManualClock();
    this.bootDelayMs = options.bootDelayMs ?? 30_000;
    this.terminateDelayMs = options.terminateDelayMs ?? 10_000;
    this.consoleDelayMs = options.consoleDelayMs ?? 0;
    this.forgetAfterMs = options.forgetAfterMs ?? 60 * 60_000;
    this.pageSize = options.pageSize ?? 1000;
    this.subnets = options.subnets ?? {};
    this.images = options.images;
    this.onEvent = options.onEvent;
    this.client =
      options.client ??
      new EC2Client({
        region: this.region,
        maxAttempts: 1,
        credentials: { accessKeyId: 'fake', secretAccessKey: 'fake' },
      });
    this.mock = mockClient(this.client);
    this.install();
  }

  // ---- test controls --------------------------------------------------------------------------------

  /** Launches matching the rule fail with its error code (rules are checked in the order added). */
  failLaunches(failure: LaunchFailure): void {
    this.failures.push({ failure, remaining: failure.times ?? Number.POSITIVE_INFINITY });
  }

  /** The next `times` launches fail with `code`, whatever they launch. */
  failNextLaunches(times: number, code: string, message?: string): void {
    this.failLaunches({ code, times, ...(message !== undefined ? { message } : {}) });
  }

  clearFailures(): void {
    this.failures = [];
  }

  /**
   * The next `times` calls (of the given commands, default any; after letting `skip` of them pass) fail
   * with a throttling error.
   */
  throttle(
    times: number,
    options: { code?: string; commands?: readonly Ec2CommandName[]; skip?: number } = {},
  ): void {
    const code = options.code ?? 'RequestLimitExceeded';
    this.failCalls(() => ec2Error(code, DEFAULT_MESSAGES.RequestLimitExceeded), {
      times,
      ...(options.commands ? { commands: options.commands } : {}),
      ...(options.skip !== undefined ? { skip: options.skip } : {}),
    });
  }

  /**
   * The next `times` (default 1) calls of the given commands (default any), after letting `skip` of them
   * pass, fail with the error `error()` returns (see ec2Error). Checked before the call does anything.
   */
  failCalls(
    error: () => Error,
    options: { times?: number; commands?: readonly Ec2CommandName[]; skip?: number } = {},
  ): void {
    this.injected.push({
      remaining: options.times ?? 1,
      skip: options.skip ?? 0,
      error,
      ...(options.commands ? { commands: new Set(options.commands) } : {}),
    });
  }

  /**
   * Every later call of the given commands (default all) takes `ms`: the clock moves on by that much
   * before the call does anything, so code bounded by the clock (an invocation's deadline) sees the time
   * EC2 took. 0 makes them instant again.
   */
  slowCalls(ms: number, commands: readonly Ec2CommandName[] = ALL_COMMANDS): void {
    for (const command of commands) {
      if (ms > 0) this.latency.set(command, ms);
      else this.latency.delete(command);
    }
  }

  /**
   * The instance dies (`shutting-down`, then `terminated` after terminateDelayMs), now or `afterMs`
   * from now. The reason shows as its StateReason (default: a spot interruption).
   */
  kill(instanceId: string, options: { afterMs?: number; reason?: string } = {}): void {
    const instance = this.byId.get(instanceId);
    if (!instance) throw new Error(`fake EC2: no instance ${instanceId}`);
    const at = this.clock.now() + (options.afterMs ?? 0);
    const reason = options.reason ?? 'Server.SpotInstanceTermination: Spot instance termination';
    this.transitions = this.transitions.filter((t) => t.instanceId !== instanceId);
    this.schedule({ instanceId, at, state: 'shutting-down', reason });
    this.schedule({ instanceId, at: at + this.terminateDelayMs, state: 'terminated', reason });
    this.tick();
  }

  /** The instance is unknown to DescribeInstances and TerminateInstances for `ms` from now (default: for good). */
  hide(instanceId: string, ms = Number.POSITIVE_INFINITY): void {
    if (!this.byId.has(instanceId)) throw new Error(`fake EC2: no instance ${instanceId}`);
    this.unknownUntil.set(instanceId, this.clock.now() + ms);
  }

  /** Applies every state change due by the clock's now (in time order), emitting their events. */
  tick(): void {
    const now = this.clock.now();
    this.forget(now);
    const due = this.transitions.filter((t) => t.at <= now).sort((a, b) => a.at - b.at);
    if (due.length === 0) return;
    this.transitions = this.transitions.filter((t) => t.at > now);
    for (const t of due) {
      const instance = this.byId.get(t.instanceId);
      if (!instance || instance.state === t.state || instance.state === 'terminated') continue;
      this.setState(instance, t.state, t.at, t.reason);
    }
  }

  /** Moves the clock, applies what became due, and waits for the events to be delivered. */
  async advance(ms: number): Promise<void> {
    this.clock.advance(ms);
    this.tick();
    await this.settled();
  }

  /** Resolves when every event emitted so far has been delivered to onEvent. */
  async settled(): Promise<void> {
    let current: Promise<void>;
    do {
      current = this.delivery;
      await current;
    } while (current !== this.delivery);
  }

  instance(instanceId: string): FakeInstance | undefined {
    return this.byId.get(instanceId);
  }

  /** Every instance EC2 still knows, in launch order. */
  get instances(): FakeInstance[] {
    return [...this.byId.values()];
  }

  /** Instances neither shutting down nor terminated. */
  live(): FakeInstance[] {
    return this.instances.filter((i) => i.state !== 'terminated' && i.state !== 'shutting-down');
  }

  /**
   * The input of every call of a command so far (throttled and failed calls included), copied when the
   * call was made: the SDK's paginators reuse one input object, so the mock's own record of it shows
   * only its last state.
   */
  inputs(command: 'RunInstances'): RunInstancesCommandInput[];
  inputs(command: 'DescribeInstances'): DescribeInstancesCommandInput[];
  inputs(command: 'TerminateInstances'): TerminateInstancesCommandInput[];
  inputs(command: 'DescribeImages'): DescribeImagesCommandInput[];
  inputs(command: 'GetConsoleOutput'): GetConsoleOutputCommandInput[];
  inputs(command: Ec2CommandName): unknown[] {
    return this.callLog.filter((call) => call.command === command).map((call) => call.input);
  }

  /** Forgets the recorded calls (inputs() and the mock's history). */
  resetCalls(): void {
    this.callLog = [];
    this.mock.resetHistory();
  }

  restore(): void {
    this.mock.restore();
  }

  // ---- the API --------------------------------------------------------------------------------------

  private install(): void {
    this.mock.onAnyCommand().callsFake(() => {
      throw ec2Error('UnsupportedOperation', 'fake EC2: this command is not implemented');
    });
    this.mock.on(RunInstancesCommand).callsFake((input: RunInstancesCommandInput) => {
      this.record('RunInstances', input);
      return this.runInstances(input);
    });
    this.mock.on(DescribeInstancesCommand).callsFake((input: DescribeInstancesCommandInput) => {
      this.record('DescribeInstances', input);
      return this.describeInstances(input);
    });
    this.mock.on(TerminateInstancesCommand).callsFake((input: TerminateInstancesCommandInput) => {
      this.record('TerminateInstances', input);
      return this.terminateInstances(input);
    });
    this.mock.on(DescribeImagesCommand).callsFake((input: DescribeImagesCommandInput) => {
      this.record('DescribeImages', input);
      return this.describeImages(input);
    });
    this.mock.on(GetConsoleOutputCommand).callsFake((input: GetConsoleOutputCommandInput) => {
      this.record('GetConsoleOutput', input);
      return this.getConsoleOutput(input);
    });
  }

  /** The SSH host keys an instance prints to its console (one ed25519 key, derived from its id). */
  hostKeysOf(instanceId: string): string[] {
    return [fakeEd25519Key(instanceId)];
  }

  private async getConsoleOutput(
    input: GetConsoleOutputCommandInput,
  ): Promise<GetConsoleOutputCommandOutput> {
    this.enter('GetConsoleOutput');
    const id = input.InstanceId ?? '';
    this.checkIds([id]);
    const instance = this.byId.get(id) as FakeInstance;
    const meta = { $metadata: {}, InstanceId: id, Timestamp: new Date(this.clock.now()) };
    if (instance.runningAt === undefined) return meta; // nothing posted before it ran
    const printed =
      this.consoleHostKeys && this.clock.now() - instance.runningAt >= this.consoleDelayMs
        ? cloudInitConsole(this.hostKeysOf(id))
        : '[    0.000000] Linux version 6.8.0-1021-aws (buildd@lcy02-amd64-089) #23-Ubuntu SMP\r\n';
    return { ...meta, Output: Buffer.from(printed).toString('base64') };
  }

  private record(command: Ec2CommandName, input: unknown): void {
    this.callLog.push({ command, input: structuredClone(input) });
  }

  /** Takes the call's time (slowCalls), applies due changes, then fails the call if an injected failure applies to it. */
  private enter(command: Ec2CommandName): void {
    const took = this.latency.get(command);
    if (took !== undefined) this.clock.advance(took);
    this.tick();
    const rule = this.injected.find((r) => r.remaining > 0 && (!r.commands || r.commands.has(command)));
    if (!rule) return;
    if (rule.skip > 0) {
      rule.skip--;
      return;
    }
    rule.remaining--;
    this.injected = this.injected.filter((r) => r.remaining > 0);
    throw rule.error();
  }

  private async runInstances(input: RunInstancesCommandInput): Promise<RunInstancesCommandOutput> {
    this.enter('RunInstances');
    const { ClientToken: token, ...params } = input;
    const hash = canonical(params);
    if (token !== undefined) {
      if (token.length > 64)
        throw ec2Error('InvalidParameterValue', 'ClientToken is longer than 64 characters');
      const known = this.tokens.get(token);
      if (known) {
        if (known.hash !== hash) {
          throw ec2Error(
            'IdempotentParameterMismatch',
            'The client token you have provided is associated with a resource that is already deleted or has different parameters.',
          );
        }
        return this.reservationOutput(known.instanceIds);
      }
    }

    const count = input.MaxCount ?? 1;
    if ((input.MinCount ?? 1) < 1 || count < (input.MinCount ?? 1)) {
      throw ec2Error('InvalidParameterValue', 'MinCount and MaxCount must be >= 1 and MinCount <= MaxCount');
    }
    const instanceType = input.InstanceType;
    if (!instanceType)
      throw ec2Error('MissingParameter', 'The request must contain the parameter InstanceType');
    const nic = input.NetworkInterfaces?.[0];
    const subnetId = nic?.SubnetId ?? input.SubnetId;
    if (!subnetId)
      throw ec2Error('MissingParameter', 'The request must contain a subnet (fake EC2 has no default VPC)');
    if (!input.ImageId && !input.LaunchTemplate) {
      throw ec2Error('MissingParameter', 'The request must contain the parameter ImageId');
    }
    if (input.ImageId) this.image(input.ImageId);
    const spot = input.InstanceMarketOptions?.MarketType === 'spot';

    const rule = this.failures.find((r) => {
      const f = r.failure;
      return (
        r.remaining > 0 &&
        (f.instanceType === undefined || f.instanceType === instanceType) &&
        (f.subnetId === undefined || f.subnetId === subnetId) &&
        (f.market === undefined || f.market === (spot ? 'spot' : 'on-demand'))
      );
    });
    if (rule) {
      rule.remaining--;
      this.failures = this.failures.filter((r) => r.remaining > 0);
      throw ec2Error(
        rule.failure.code,
        rule.failure.message ??
          DEFAULT_MESSAGES[rule.failure.code] ??
          `${rule.failure.code} (fake EC2: ${instanceType} in ${subnetId}${spot ? ', spot' : ''})`,
      );
    }

    const now = this.clock.now();
    const reservationId = `r-${this.nextHex(17)}`;
    const instanceTags = tagRecord(input.TagSpecifications?.find((s) => s.ResourceType === 'instance')?.Tags);
    const volumeTags = tagRecord(input.TagSpecifications?.find((s) => s.ResourceType === 'volume')?.Tags);
    const ids: string[] = [];
    for (let i = 0; i < count; i++) {
      const n = ++this.counter;
      const instanceId = `i-${n.toString(16).padStart(17, '0')}`;
      const root = input.BlockDeviceMappings?.[0];
      const instance: FakeInstance = {
        instanceId,
        reservationId,
        state: 'pending',
        instanceType,
        imageId: input.ImageId ?? 'ami-0launchtemplate0',
        subnetId,
        availabilityZone: this.subnets[subnetId] ?? `${this.region}a`,
        privateIp: `10.0.${(n >> 8) & 255}.${n & 255}`,
        ...(nic?.AssociatePublicIpAddress ? { publicIp: `203.0.113.${n & 255}` } : {}),
        spot,
        tags: { ...instanceTags },
        volumes: [
          {
            volumeId: `vol-${this.nextHex(17)}`,
            deviceName:
              root?.DeviceName ??
              (input.ImageId ? (this.image(input.ImageId).RootDeviceName ?? '/dev/xvda') : '/dev/xvda'),
            encrypted: root?.Ebs?.Encrypted ?? false,
            ...(root?.Ebs?.VolumeType !== undefined ? { volumeType: root.Ebs.VolumeType } : {}),
            ...(root?.Ebs?.VolumeSize !== undefined ? { sizeGiB: root.Ebs.VolumeSize } : {}),
            tags: { ...volumeTags },
          },
        ],
        launchTime: now,
        ...(token !== undefined ? { clientToken: token } : {}),
        request: input,
      };
      this.byId.set(instanceId, instance);
      if (this.notFoundAfterLaunchMs > 0) this.unknownUntil.set(instanceId, now + this.notFoundAfterLaunchMs);
      ids.push(instanceId);
      this.emit(instance, 'pending', now);
      this.schedule({ instanceId, at: now + this.bootDelayMs, state: 'running' });
    }
    if (token !== undefined) this.tokens.set(token, { hash, instanceIds: ids });
    this.tick(); // a zero boot delay runs at once
    return this.reservationOutput(ids);
  }

  private async describeInstances(
    input: DescribeInstancesCommandInput,
  ): Promise<DescribeInstancesCommandOutput> {
    this.enter('DescribeInstances');
    const maxResults = input.MaxResults;
    if (maxResults !== undefined) {
      if (input.InstanceIds?.length) {
        throw ec2Error(
          'InvalidParameterCombination',
          'The parameter instancesSet cannot be used with maxResults',
        );
      }
      if (maxResults < 5 || maxResults > 1000) {
        throw ec2Error('InvalidParameterValue', 'MaxResults must be between 5 and 1000');
      }
    }
    let selected = this.instances.filter((i) => this.known(i.instanceId));
    if (input.InstanceIds?.length) {
      this.checkIds(input.InstanceIds);
      const wanted = new Set(input.InstanceIds);
      selected = selected.filter((i) => wanted.has(i.instanceId));
    }
    for (const filter of input.Filters ?? []) {
      const name = filter.Name ?? '';
      const values = filter.Values ?? [];
      selected = selected.filter((i) => {
        const actual = this.filterValues(name, i);
        return actual.some((a) => values.some((v) => glob(v, a)));
      });
    }
    const start = input.NextToken ? Number(input.NextToken) : 0;
    if (!Number.isInteger(start) || start < 0) throw ec2Error('InvalidParameterValue', 'Invalid NextToken');
    const size = Math.min(maxResults ?? Number.POSITIVE_INFINITY, this.pageSize);
    const page = selected.slice(start, start + size);
    const next = start + size < selected.length ? String(start + size) : undefined;
    return {
      Reservations: page.map((i) => ({
        ReservationId: i.reservationId,
        OwnerId: '000000000000',
        Instances: [this.toInstance(i)],
      })),
      ...(next !== undefined ? { NextToken: next } : {}),
      $metadata: { httpStatusCode: 200 },
    };
  }

  private async terminateInstances(
    input: TerminateInstancesCommandInput,
  ): Promise<TerminateInstancesCommandOutput> {
    this.enter('TerminateInstances');
    const ids = input.InstanceIds ?? [];
    if (ids.length === 0)
      throw ec2Error('MissingParameter', 'The request must contain the parameter InstanceId');
    if (ids.length > 1000) throw ec2Error('InvalidParameterValue', 'At most 1000 instance ids per call');
    this.checkIds(ids);
    const now = this.clock.now();
    const out: NonNullable<TerminateInstancesCommandOutput['TerminatingInstances']> = [];
    for (const id of ids) {
      const instance = this.byId.get(id) as FakeInstance;
      const previous = instance.state;
      if (previous !== 'terminated' && previous !== 'shutting-down') {
        this.transitions = this.transitions.filter((t) => t.instanceId !== id);
        const reason = 'Client.UserInitiatedShutdown: User initiated shutdown';
        this.setState(instance, 'shutting-down', now, reason);
        this.schedule({ instanceId: id, at: now + this.terminateDelayMs, state: 'terminated', reason });
      }
      out.push({
        InstanceId: id,
        PreviousState: { Code: STATE_CODES[previous], Name: previous },
        CurrentState: { Code: STATE_CODES[instance.state], Name: instance.state },
      });
    }
    this.tick();
    return { TerminatingInstances: out, $metadata: { httpStatusCode: 200 } };
  }

  private async describeImages(input: DescribeImagesCommandInput): Promise<DescribeImagesCommandOutput> {
    this.enter('DescribeImages');
    const images = (input.ImageIds ?? []).map((id) => this.image(id));
    return { Images: images, $metadata: { httpStatusCode: 200 } };
  }

  // ---- internals ------------------------------------------------------------------------------------

  private image(imageId: string): {
    ImageId: string;
    RootDeviceName: string;
    RootDeviceType: 'ebs';
    State: 'available';
  } {
    if (!/^ami-[0-9a-z]+$/.test(imageId))
      throw ec2Error('InvalidAMIID.Malformed', `Invalid id: "${imageId}"`);
    const known = this.images ? this.images[imageId] : {};
    if (!known) throw ec2Error('InvalidAMIID.NotFound', `The image id '[${imageId}]' does not exist`);
    return {
      ImageId: imageId,
      RootDeviceName: known.rootDeviceName ?? '/dev/xvda',
      RootDeviceType: 'ebs',
      State: 'available',
    };
  }

  /** EC2 fails the whole call when an id is malformed or unknown, naming the culprits. */
  private checkIds(ids: readonly string[]): void {
    const malformed = ids.filter((id) => !INSTANCE_ID.test(id));
    if (malformed.length > 0) throw ec2Error('InvalidInstanceID.Malformed', `Invalid id: "${malformed[0]}"`);
    const missing = ids.filter((id) => !this.byId.has(id) || !this.known(id));
    if (missing.length === 1) {
      throw ec2Error('InvalidInstanceID.NotFound', `The instance ID '${missing[0]}' does not exist`);
    }
    if (missing.length > 1) {
      throw ec2Error('InvalidInstanceID.NotFound', `The instance IDs '${missing.join(', ')}' do not exist`);
    }
  }

  /** Whether the API knows the instance yet (see notFoundAfterLaunchMs and hide). */
  private known(instanceId: string): boolean {
    return this.clock.now() >= (this.unknownUntil.get(instanceId) ?? Number.NEGATIVE_INFINITY);
  }

  private filterValues(name: string, i: FakeInstance): string[] {
    if (name.startsWith('tag:')) {
      const value = i.tags[name.slice(4)];
      return value === undefined ? [] : [value];
    }
    switch (name) {
      case 'tag-key':
        return Object.keys(i.tags);
      case 'instance-state-name':
        return [i.state];
      case 'instance-id':
        return [i.instanceId];
      case 'instance-type':
        return [i.instanceType];
      case 'subnet-id':
        return [i.subnetId];
      default:
        throw ec2Error('InvalidParameterValue', `The filter '${name}' is invalid (fake EC2)`);
    }
  }

  private reservationOutput(ids: readonly string[]): RunInstancesCommandOutput {
    const instances = ids.map((id) => this.byId.get(id)).filter((i): i is FakeInstance => i !== undefined);
    return {
      ReservationId: instances[0]?.reservationId,
      OwnerId: '000000000000',
      Instances: instances.map((i) => this.toInstance(i)),
      $metadata: { httpStatusCode: 200 },
    };
  }

  private toInstance(i: FakeInstance): Instance {
    return {
      InstanceId: i.instanceId,
      InstanceType: i.instanceType as Instance['InstanceType'],
      ImageId: i.imageId,
      State: { Code: STATE_CODES[i.state], Name: i.state as InstanceStateName },
      LaunchTime: new Date(i.launchTime),
      Placement: { AvailabilityZone: i.availabilityZone },
      SubnetId: i.subnetId,
      ...(i.privateIp !== undefined ? { PrivateIpAddress: i.privateIp } : {}),
      ...(i.publicIp !== undefined ? { PublicIpAddress: i.publicIp } : {}),
      ...(i.spot
        ? { InstanceLifecycle: 'spot' as const, SpotInstanceRequestId: `sir-${i.instanceId.slice(2, 10)}` }
        : {}),
      ...(i.clientToken !== undefined ? { ClientToken: i.clientToken } : {}),
      ...(i.request.KeyName !== undefined ? { KeyName: i.request.KeyName } : {}),
      ...(i.stateReason !== undefined
        ? {
            StateReason: { Code: i.stateReason.split(':')[0], Message: i.stateReason },
            StateTransitionReason: i.stateReason,
          }
        : {}),
      BlockDeviceMappings:
        i.state === 'terminated'
          ? []
          : i.volumes.map((v) => ({
              DeviceName: v.deviceName,
              Ebs: { VolumeId: v.volumeId, Status: 'attached', DeleteOnTermination: true },
            })),
      RootDeviceName: i.volumes[0]?.deviceName,
      Tags: Object.entries(i.tags).map(([Key, Value]) => ({ Key, Value })),
    };
  }

  private schedule(t: Transition): void {
    this.transitions.push(t);
  }

  private setState(instance: FakeInstance, state: InstanceState, at: number, reason?: string): void {
    instance.state = state;
    if (state === 'running') instance.runningAt ??= at;
    if (reason !== undefined) instance.stateReason = reason;
    if (state === 'terminated') {
      instance.terminatedAt = at;
      delete instance.privateIp;
      delete instance.publicIp;
    } else if (state === 'shutting-down') {
      delete instance.publicIp;
    }
    this.emit(instance, state, at);
  }

  private emit(instance: FakeInstance, state: InstanceState, at: number): void {
    const event = stateChangeEvent({
      resourceId: instance.instanceId,
      state,
      source: EC2_EVENT_SOURCE,
      region: this.region,
      at,
    });
    this.events.push(event);
    this.delivery = this.delivery.then(async () => {
      try {
        await this.onEvent?.(event);
      } catch (err) {
        this.eventErrors.push(err);
      }
    });
  }

  private forget(now: number): void {
    for (const [id, instance] of this.byId) {
      if (instance.terminatedAt !== undefined && now - instance.terminatedAt >= this.forgetAfterMs) {
        this.byId.delete(id);
      }
    }
  }

  private nextHex(length: number): string {
    return (++this.otherIds * 2654435761).toString(16).padStart(length, '0').slice(-length);
  }
}
