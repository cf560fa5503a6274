/**
 * The EC2 provider contract: the real Ec2Provider, through the real SDK (@aws-sdk/client-ec2), against
 * moto_server, which speaks EC2's Query/XML protocol. What moto recorded (subnet, groups, tags on
 * instance and volumes, market, instance profile) is read back with plain SDK calls, not with the
 * provider. Error paths go through testkit/ec2FaultProxy.ts, which answers chosen requests with
 * EC2's own XML error documents and statuses, so the SDK's deserializer and our classifier are tested.
 *
 * moto 5.2.1 quirks this suite lives with: it ignores ClientToken, never shows `pending`, emits no EC2
 * events, needs a volume size in block device mappings, fails a second terminate of an instance launched
 * with NetworkInterfaces, and accepts network interfaces together with a launch template's
 * instance-level security groups (EC2 does not: the proxy enforces that rule, see ec2FaultProxy.ts).
 */
import {
  CreateLaunchTemplateCommand,
  CreateSecurityGroupCommand,
  CreateSubnetCommand,
  CreateVpcCommand,
  DescribeImagesCommand,
  DescribeInstanceAttributeCommand,
  DescribeInstancesCommand,
  DescribeVolumesCommand,
  EC2Client,
  type Image,
  type Instance,
  RunInstancesCommand,
  type Tag,
} from '@aws-sdk/client-ec2';
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { ManualClock } from '../../shared/core/clock.ts';
import { CapacityError, RetryableError } from '../../shared/core/errors.ts';
import type { BackingPool } from '../../shared/core/model.ts';
import type { LaunchSpec } from '../../shared/core/provider.ts';
import {
  createEc2Client,
  Ec2Provider,
  type Ec2ProviderOptions,
} from '../../shared/providers/aws/ec2Provider.ts';
import { QUOTA_PAUSE_MS } from '../../shared/providers/aws/offerings.ts';
import {
  TAG_BACKING_NODE_ID,
  TAG_BACKING_POOL,
  TAG_LABEL,
  TAG_POOL,
} from '../../shared/providers/aws/runInstancesRequest.ts';
import { composeUserData } from '../../shared/providers/aws/userData.ts';
import {
  type Ec2FaultProxy,
  type Ec2Request,
  listParam,
  marketOf,
  startEc2FaultProxy,
} from '../../testkit/ec2FaultProxy.ts';
import {
  describeWithMoto,
  MOTO_ACCOUNT,
  MOTO_CREDENTIALS,
  type Moto,
  startMoto,
} from '../../testkit/moto.ts';
import { ED25519_KEY, RSA_KEY } from '../../testkit/sshKeys.ts';

type Obj = Record<string, unknown>;

const REGION = 'eu-west-1';
const POOL_ID = 'metastatic-moto';
const POOL_KEY = 'ec2/main';
const LABEL = 'large';

interface Network {
  readonly vpcId: string;
  /** In eu-west-1a and eu-west-1b. */
  readonly subnets: readonly [string, string];
  readonly groups: readonly [string, string];
  readonly imageId: string;
  readonly rootDevice: string;
}

function awsPool(poolOptions: Obj, labels: Record<string, Obj>, key = POOL_KEY): BackingPool {
  const [providerName = 'ec2', poolName = 'main'] = key.split('/');
  return {
    key,
    providerName,
    poolName,
    driver: 'aws',
    maxServers: undefined,
    providerOptions: { driver: 'aws', region: REGION },
    poolOptions,
    labels: new Map(Object.entries(labels).map(([name, options]) => [name, { name, options }])),
  };
}

const spec = (backingNodeId = 'bn-1', label = LABEL, attempt = 1): LaunchSpec => ({
  backingNodeId,
  attempt,
  poolKey: POOL_KEY,
  label,
});

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected a rejection');
}

function tagsOf(tags: readonly Tag[] | undefined): Record<string, string> {
  return Object.fromEntries((tags ?? []).map((t) => [t.Key ?? '', t.Value ?? '']));
}

/** `<type> <subnet> <market>` of every RunInstances request the proxy saw, with what answered it. */
function runRequests(proxy: Ec2FaultProxy): string[] {
  return proxy.requests
    .filter((r) => r.action === 'RunInstances')
    .map(
      (r) =>
        `${r.params.get('InstanceType')} ${r.params.get('SubnetId') ?? r.params.get('NetworkInterface.1.SubnetId')} ${marketOf(r)} -> ${r.answeredBy}`,
    );
}

describeWithMoto('EC2 provider contract against moto_server', () => {
  let moto: Moto;
  let proxy: Ec2FaultProxy;
  /** Straight to moto, for setting up and for checking what moto recorded. */
  let ec2: EC2Client;
  let net: Network;
  let clock: ManualClock;
  let sleeps: number[];
  let image: Image | undefined;
  const clients: EC2Client[] = [];

  beforeAll(async () => {
    moto = await startMoto();
    proxy = await startEc2FaultProxy({
      target: moto.endpoint,
      region: REGION,
      enforceNetworkInterfaceRules: true,
    });
    ec2 = new EC2Client({
      region: REGION,
      endpoint: moto.endpoint,
      credentials: MOTO_CREDENTIALS,
      maxAttempts: 1,
    });
  }, 60_000);

  afterAll(async () => {
    for (const client of clients) client.destroy();
    ec2?.destroy();
    await proxy?.close();
    await moto?.stop();
  });

  beforeEach(async () => {
    await moto.reset();
    proxy.clear();
    clock = new ManualClock();
    sleeps = [];
    const vpc = await ec2.send(new CreateVpcCommand({ CidrBlock: '10.0.0.0/16' }));
    const vpcId = vpc.Vpc?.VpcId ?? '';
    const subnet = async (cidr: string, zone: string) =>
      (await ec2.send(new CreateSubnetCommand({ VpcId: vpcId, CidrBlock: cidr, AvailabilityZone: zone })))
        .Subnet?.SubnetId ?? '';
    const group = async (name: string) =>
      (await ec2.send(new CreateSecurityGroupCommand({ VpcId: vpcId, GroupName: name, Description: name })))
        .GroupId ?? '';
    // moto's catalogue of images is the same after every reset, and a search of it by name takes seconds
    // (1.5-4 s here, in each of the file's tests): looked up once.
    image ??= (
      await ec2.send(new DescribeImagesCommand({ Filters: [{ Name: 'name', Values: ['amzn2-ami-*'] }] }))
    ).Images?.find((i) => i.RootDeviceName !== undefined);
    if (!image?.ImageId || !image.RootDeviceName) throw new Error('moto offers no Amazon Linux 2 image');
    net = {
      vpcId,
      subnets: [await subnet('10.0.1.0/24', `${REGION}a`), await subnet('10.0.2.0/24', `${REGION}b`)],
      groups: [await group('builders'), await group('ssh')],
      imageId: image.ImageId,
      rootDevice: image.RootDeviceName,
    };
  });

  function provider(
    pool: Obj,
    labels: Record<string, Obj>,
    options: Partial<Ec2ProviderOptions> & { poolId?: string } = {},
  ): Ec2Provider {
    const client = createEc2Client(REGION, { endpoint: proxy.endpoint, credentials: MOTO_CREDENTIALS });
    clients.push(client);
    return new Ec2Provider({
      client,
      pools: [awsPool({ 'subnet-ids': [...net.subnets], ...pool }, labels)],
      poolId: POOL_ID,
      clock,
      sleep: async (ms) => {
        sleeps.push(ms);
      },
      random: () => 0.5,
      ...options,
    });
  }

  /** A label launching the moto image (moto needs the volume size). */
  const imageLabel = (extra: Obj = {}): Obj => ({
    'instance-type': 'm7i.large',
    'image-id': net.imageId,
    'volume-size': 16,
    ...extra,
  });

  /** A label launching the moto image from several instance types, in order. */
  const typesLabel = (types: string[], extra: Obj = {}): Obj => ({
    'instance-types': types,
    'image-id': net.imageId,
    'volume-size': 16,
    ...extra,
  });

  async function instance(id: string): Promise<Instance> {
    const out = await ec2.send(new DescribeInstancesCommand({ InstanceIds: [id] }));
    const found = out.Reservations?.[0]?.Instances?.[0];
    if (!found) throw new Error(`moto has no instance ${id}`);
    return found;
  }

  const groupsOf = (i: Instance) => (i.NetworkInterfaces?.[0]?.Groups ?? []).map((g) => g.GroupId).sort();

  // ---- launch -------------------------------------------------------------------------------------

  it('launches from an image: top-level subnet and groups, tags on instance and volume, encrypted root of the given size', async () => {
    const p = provider(
      { 'security-group-ids': [...net.groups] },
      { [LABEL]: imageLabel({ tags: { team: 'ci' }, 'volume-type': 'gp3' }) },
    );
    const { resourceId } = await p.launch(spec());

    const recorded = await instance(resourceId);
    expect(recorded.SubnetId).toBe(net.subnets[0]);
    expect(recorded.Placement?.AvailabilityZone).toBe(`${REGION}a`);
    expect(groupsOf(recorded)).toEqual([...net.groups].sort());
    expect(recorded.InstanceType).toBe('m7i.large');
    expect(recorded.InstanceLifecycle).toBeUndefined(); // on-demand
    expect(recorded.MetadataOptions?.HttpTokens).toBe('required');
    const tags = {
      [TAG_POOL]: POOL_ID,
      [TAG_BACKING_NODE_ID]: 'bn-1',
      [TAG_BACKING_POOL]: POOL_KEY,
      [TAG_LABEL]: LABEL,
      Name: 'metastatic-bn-1',
      team: 'ci',
    };
    expect(tagsOf(recorded.Tags)).toEqual(tags);
    const volumes = await ec2.send(
      new DescribeVolumesCommand({ Filters: [{ Name: 'attachment.instance-id', Values: [resourceId] }] }),
    );
    expect(volumes.Volumes).toHaveLength(1);
    expect(volumes.Volumes?.[0]).toMatchObject({ Size: 16, Encrypted: true, VolumeType: 'gp3' });
    expect(volumes.Volumes?.[0]?.Attachments?.[0]?.Device).toBe(net.rootDevice);
    expect(tagsOf(volumes.Volumes?.[0]?.Tags)).toEqual(tags);

    // On the wire: instance-level subnet and groups, no network interface.
    const [run] = proxy.requests.filter((r) => r.action === 'RunInstances');
    expect(run?.params.get('SubnetId')).toBe(net.subnets[0]);
    expect(run ? listParam(run, 'SecurityGroupId') : []).toEqual([...net.groups]);
    expect([...(run?.params.keys() ?? [])].filter((k) => k.startsWith('NetworkInterface'))).toEqual([]);

    // describe() maps what moto answers.
    expect(await p.describe(resourceId)).toMatchObject({
      resourceId,
      backingNodeId: 'bn-1',
      poolKey: POOL_KEY,
      state: 'running',
      host: recorded.PrivateIpAddress,
      port: 22,
      attributes: {
        instanceType: 'm7i.large',
        availabilityZone: `${REGION}a`,
        spot: false,
        imageId: net.imageId,
      },
    });
    expect(await p.describe('i-0123456789abcdef0')).toBeUndefined();
  });

  it("launches with the pool's authorized-keys and per-slot users combined with the label's script (MIME multipart), as EC2 stores it", async () => {
    const script = '#!/bin/sh\necho ready > /var/tmp/ready\n';
    const p = provider(
      { 'authorized-keys': [ED25519_KEY, RSA_KEY] },
      { [LABEL]: imageLabel({ userdata: script, username: 'zuul', 'per-slot-users': true }) },
    );
    const { resourceId } = await p.launch({ ...spec(), slots: 3 });
    const expected = composeUserData({
      own: script,
      authorizedKeys: [ED25519_KEY, RSA_KEY],
      slotUsers: { username: 'zuul', slots: 3 },
    }) as string;
    expect(expected).toContain('Content-Type: multipart/mixed');
    expect(expected).toContain('"zuul-2"');
    // On the wire, base64 as EC2 takes it; and what EC2 (moto) kept for the instance is the same text.
    const [run] = proxy.requests.filter((r) => r.action === 'RunInstances');
    expect(Buffer.from(run?.params.get('UserData') ?? '', 'base64').toString('utf8')).toBe(expected);
    const stored = await ec2.send(
      new DescribeInstanceAttributeCommand({ InstanceId: resourceId, Attribute: 'userData' }),
    );
    expect(Buffer.from(stored.UserData?.Value ?? '', 'base64').toString('utf8')).toBe(expected);
  });

  it("combines the pool's authorized-keys with a launch template's own user data, which a launch's user data would replace", async () => {
    const script = '#!/bin/sh\necho from-template\n';
    await ec2.send(
      new CreateLaunchTemplateCommand({
        LaunchTemplateName: 'scripted',
        LaunchTemplateData: { ImageId: net.imageId, UserData: Buffer.from(script).toString('base64') },
      }),
    );
    const p = provider(
      { 'authorized-keys': [ED25519_KEY] },
      { [LABEL]: { 'instance-type': 'm7i.large', 'launch-template': { name: 'scripted' } } },
    );
    const { resourceId } = await p.launch(spec());
    const stored = await ec2.send(
      new DescribeInstanceAttributeCommand({ InstanceId: resourceId, Attribute: 'userData' }),
    );
    expect(Buffer.from(stored.UserData?.Value ?? '', 'base64').toString('utf8')).toBe(
      composeUserData({ own: script, authorizedKeys: [ED25519_KEY] }),
    );
  });

  it('launches from a launch template that sets security groups, with an instance profile from IAM', async () => {
    // Defect 2: NetworkInterfaces was always sent; EC2 rejects it with a template's instance-level groups.
    const template = await ec2.send(
      new CreateLaunchTemplateCommand({
        LaunchTemplateName: 'builders',
        LaunchTemplateData: {
          ImageId: net.imageId,
          SecurityGroupIds: [net.groups[0]],
          BlockDeviceMappings: [{ DeviceName: '/dev/xvda', Ebs: { VolumeSize: 30, Encrypted: true } }],
        },
      }),
    );
    await createInstanceProfile(moto, 'builder');
    const p = provider(
      {},
      {
        [LABEL]: {
          'instance-type': 'm7i.large',
          'launch-template': { name: 'builders' },
          'iam-instance-profile': { name: 'builder' },
        },
      },
    );
    const { resourceId } = await p.launch(spec());
    expect(runRequests(proxy)).toEqual([`m7i.large ${net.subnets[0]} on-demand -> moto`]);

    const recorded = await instance(resourceId);
    expect(recorded.SubnetId).toBe(net.subnets[0]);
    expect(groupsOf(recorded)).toEqual([net.groups[0]]); // the template's
    expect(recorded.ImageId).toBe(net.imageId);
    expect(recorded.IamInstanceProfile?.Arn).toBe(`arn:aws:iam::${MOTO_ACCOUNT}:instance-profile/builder`);
    expect(tagsOf(recorded.Tags)).toMatchObject({
      [TAG_POOL]: POOL_ID,
      'aws:ec2launchtemplate:id': template.LaunchTemplate?.LaunchTemplateId,
    });
    // The template was read once, from moto, through the SDK.
    expect(proxy.requests.filter((r) => r.action === 'DescribeLaunchTemplateVersions')).toHaveLength(1);
  });

  it('launches from a template whose network interface carries the groups: the subnet goes into that interface', async () => {
    await ec2.send(
      new CreateLaunchTemplateCommand({
        LaunchTemplateName: 'eni',
        LaunchTemplateData: {
          ImageId: net.imageId,
          NetworkInterfaces: [{ DeviceIndex: 0, Groups: [net.groups[1]], DeleteOnTermination: true }],
        },
      }),
    );
    const p = provider({}, { [LABEL]: { 'instance-type': 'm7i.large', 'launch-template': { name: 'eni' } } });
    const { resourceId } = await p.launch(spec());
    const [run] = proxy.requests.filter((r) => r.action === 'RunInstances');
    expect(run?.params.get('SubnetId')).toBeNull();
    expect(run?.params.get('NetworkInterface.1.SubnetId')).toBe(net.subnets[0]);
    expect(run?.answeredBy).toBe('moto');
    const recorded = await instance(resourceId);
    expect(recorded.SubnetId).toBe(net.subnets[0]);
    expect(groupsOf(recorded)).toEqual([net.groups[1]]);
  });

  it('requests a public IPv4 address through one network interface, and connects to it', async () => {
    const p = provider(
      { 'public-ipv4': true, 'security-group-ids': [net.groups[1]] },
      { [LABEL]: imageLabel() },
    );
    const { resourceId } = await p.launch(spec());
    const [run] = proxy.requests.filter((r) => r.action === 'RunInstances');
    expect(run?.params.get('NetworkInterface.1.AssociatePublicIpAddress')).toBe('true');
    expect(run?.params.get('SubnetId')).toBeNull();
    expect(run ? listParam(run, 'SecurityGroupId') : []).toEqual([]);
    const recorded = await instance(resourceId);
    expect(recorded.PublicIpAddress).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(groupsOf(recorded)).toEqual([net.groups[1]]);
    expect((await p.describe(resourceId))?.host).toBe(recorded.PublicIpAddress);
  });

  it('refuses public-ipv4 with a template that sets instance-level groups, before calling RunInstances', async () => {
    await ec2.send(
      new CreateLaunchTemplateCommand({
        LaunchTemplateName: 'builders',
        LaunchTemplateData: { ImageId: net.imageId, SecurityGroupIds: [net.groups[0]] },
      }),
    );
    const p = provider(
      { 'public-ipv4': true },
      { [LABEL]: { 'instance-type': 'm7i.large', 'launch-template': { name: 'builders' } } },
    );
    const err = await rejection(p.launch(spec()));
    expect(err.message).toMatch(
      /^launch template name=builders version \$Default sets security groups at instance level/,
    );
    expect(runRequests(proxy)).toEqual([]);
  });

  // ---- list, terminate ----------------------------------------------------------------------------

  it('lists only its own live instances, across pages, by the pool tag', async () => {
    const p = provider({}, { [LABEL]: imageLabel() }, { listPageSize: 5 });
    const ours: string[] = [];
    for (let i = 1; i <= 7; i++) ours.push((await p.launch(spec(`bn-${i}`))).resourceId);
    const other = provider({}, { [LABEL]: imageLabel() }, { poolId: 'another-stack' });
    await other.launch(spec('bn-x'));
    await ec2.send(
      new RunInstancesCommand({ MinCount: 1, MaxCount: 1, ImageId: net.imageId, SubnetId: net.subnets[1] }),
    );
    await p.terminate(ours[0] ?? '');
    proxy.clear();

    const listed = await p.list();
    expect(listed.map((r) => r.resourceId).sort()).toEqual(ours.slice(1).sort());
    expect(new Set(listed.map((r) => r.state))).toEqual(new Set(['running']));
    const pages = proxy.requests.filter((r) => r.action === 'DescribeInstances');
    expect(pages.map((r) => [r.params.get('MaxResults'), r.params.has('NextToken')])).toEqual([
      ['5', false],
      ['5', true],
    ]);
    expect(pages[0]?.params.get('Filter.1.Name')).toBe(`tag:${TAG_POOL}`);
    expect(pages[0]?.params.get('Filter.1.Value.1')).toBe(POOL_ID);
  });

  it('terminates many instances with unknown and foreign-shaped ids mixed in, idempotently', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    const [a, b, c] = [
      (await p.launch(spec('bn-1'))).resourceId,
      (await p.launch(spec('bn-2'))).resourceId,
      (await p.launch(spec('bn-3'))).resourceId,
    ];
    const unknown = ['i-0123456789abcdef0', 'i-0fedcba9876543210'];
    proxy.clear();
    await p.terminateMany([unknown[0] ?? '', a ?? '', 'local-abc', unknown[1] ?? '', b ?? '', a ?? '']);
    expect((await instance(a ?? '')).State?.Name).toBe('terminated');
    expect((await instance(b ?? '')).State?.Name).toBe('terminated');
    expect((await instance(c ?? '')).State?.Name).toBe('running');
    // moto names every unknown id in one InvalidInstanceID.NotFound: one retry without them.
    const calls = proxy.requests
      .filter((r) => r.action === 'TerminateInstances')
      .map((r) => listParam(r, 'InstanceId'));
    expect(calls).toEqual([
      [unknown[0], a, unknown[1], b],
      [a, b],
    ]);
    // Terminating again, and an unknown id alone, succeed.
    await p.terminate(a ?? '');
    await p.terminate(unknown[0] ?? '');
    await p.terminateMany([]);
  });

  it("describes many instances with an instance-id filter: unknown ids and other stacks' left out, no error", async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    const [a, b] = [(await p.launch(spec('bn-1'))).resourceId, (await p.launch(spec('bn-2'))).resourceId];
    const foreign = (
      await provider({}, { [LABEL]: imageLabel() }, { poolId: 'another-stack' }).launch(spec('bn-x'))
    ).resourceId;
    await p.terminate(b);
    proxy.clear();
    const found = await p.describeMany(['i-0123456789abcdef0', a, b, foreign, 'local-abc']);
    expect([...found.keys()].sort()).toEqual([a, b].sort());
    expect(found.get(a)).toMatchObject({ resourceId: a, backingNodeId: 'bn-1', state: 'running' });
    expect(['shutting-down', 'terminated']).toContain(found.get(b)?.state);
    const calls = proxy.requests.filter((r) => r.action === 'DescribeInstances');
    expect(calls).toHaveLength(1);
    expect(calls[0]?.params.get('Filter.1.Name')).toBe('instance-id');
  });

  // ---- error paths through the fault proxy --------------------------------------------------------

  const spotLabels = (types: string[]) => ({ [LABEL]: typesLabel(types, { 'use-spot': true }) });

  it('on InsufficientInstanceCapacity (HTTP 500) for spot tries spot in the next subnet before on-demand', async () => {
    // Defect 10: the order was type x subnet x [spot, on-demand]: the miss bought on-demand in subnet a.
    const p = provider({}, spotLabels(['m7i.large']));
    proxy.fail({
      action: 'RunInstances',
      when: (r) => marketOf(r) === 'spot' && r.params.get('SubnetId') === net.subnets[0],
      code: 'InsufficientInstanceCapacity',
    });
    const { resourceId } = await p.launch(spec());
    expect(runRequests(proxy)).toEqual([
      `m7i.large ${net.subnets[0]} spot -> InsufficientInstanceCapacity`,
      `m7i.large ${net.subnets[1]} spot -> moto`,
    ]);
    const recorded = await instance(resourceId);
    expect(recorded.InstanceLifecycle).toBe('spot');
    expect(recorded.SubnetId).toBe(net.subnets[1]);
  });

  it('names the code and message EC2 sent when no offering has capacity', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    proxy.fail({
      action: 'RunInstances',
      code: 'InsufficientInstanceCapacity',
      times: Number.POSITIVE_INFINITY,
    });
    const err = await rejection(p.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    expect(err.message).toBe(
      `no capacity for label large in backing pool ec2/main: m7i.large in ${net.subnets[0]} (on-demand): InsufficientInstanceCapacity: We currently do not have sufficient capacity in the Availability Zone you requested. Our system will be working on provisioning additional capacity.; m7i.large in ${net.subnets[1]} (on-demand): InsufficientInstanceCapacity: We currently do not have sufficient capacity in the Availability Zone you requested. Our system will be working on provisioning additional capacity.`,
    );
  });

  it('on MaxSpotInstanceCountExceeded launches on-demand, and skips spot for 5 minutes', async () => {
    // Defect 3: the spot quota paused the whole pool (CapacityError, nothing launched).
    const p = provider({}, spotLabels(['m7i.large', 'm6i.large']));
    proxy.fail({
      action: 'RunInstances',
      when: (r) => marketOf(r) === 'spot',
      code: 'MaxSpotInstanceCountExceeded',
      times: Number.POSITIVE_INFINITY,
    });
    const first = await p.launch(spec('bn-1'));
    expect(runRequests(proxy)).toEqual([
      `m7i.large ${net.subnets[0]} spot -> MaxSpotInstanceCountExceeded`,
      `m7i.large ${net.subnets[0]} on-demand -> moto`,
    ]);
    expect((await instance(first.resourceId)).InstanceLifecycle).toBeUndefined();
    expect(p.launchBlocked(POOL_KEY, LABEL)).toBeUndefined();

    proxy.clear();
    clock.advance(QUOTA_PAUSE_MS - 1);
    await p.launch(spec('bn-2'));
    expect(runRequests(proxy)).toEqual([`m7i.large ${net.subnets[0]} on-demand -> moto`]);
  });

  it('on VcpuLimitExceeded skips the bucket (Standard) of that market and launches from another (G)', async () => {
    const p = provider(
      { 'subnet-ids': [net.subnets[0]] },
      {
        [LABEL]: typesLabel(['m7i.large', 'm6i.large', 'g5.xlarge']),
        standard: typesLabel(['m7i.large', 'm6i.large']),
      },
    );
    proxy.fail({
      action: 'RunInstances',
      when: (r) => r.params.get('InstanceType') === 'm7i.large',
      code: 'VcpuLimitExceeded',
    });
    const { resourceId } = await p.launch(spec());
    expect(runRequests(proxy)).toEqual([
      `m7i.large ${net.subnets[0]} on-demand -> VcpuLimitExceeded`,
      `g5.xlarge ${net.subnets[0]} on-demand -> moto`,
    ]);
    expect((await instance(resourceId)).InstanceType).toBe('g5.xlarge');
    // A label with Standard types only waits (CapacityError) without calling EC2.
    proxy.clear();
    const waiting = await rejection(p.launch(spec('bn-2', 'standard')));
    expect(waiting).toBeInstanceOf(CapacityError);
    expect(waiting.message).toContain(
      'VcpuLimitExceeded (quota: on-demand Standard (A, C, D, H, I, M, R, T, Z) instances)',
    );
    expect(runRequests(proxy)).toEqual([]);
  });

  it('retries RequestLimitExceeded (HTTP 503) with backoff and the same ClientToken, then gives up with RetryableError', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    proxy.fail({ action: 'RunInstances', code: 'RequestLimitExceeded', times: 2 });
    const { resourceId } = await p.launch(spec());
    const runs = proxy.requests.filter((r) => r.action === 'RunInstances');
    expect(runs.map((r) => r.answeredBy)).toEqual(['RequestLimitExceeded', 'RequestLimitExceeded', 'moto']);
    expect(new Set(runs.map((r) => r.params.get('ClientToken'))).size).toBe(1);
    expect(sleeps).toEqual([750, 1125]);
    expect((await instance(resourceId)).State?.Name).toBe('running');

    proxy.clear();
    proxy.fail({ action: 'RunInstances', code: 'RequestLimitExceeded', times: Number.POSITIVE_INFINITY });
    const err = await rejection(p.launch(spec('bn-2')));
    expect(err).toBeInstanceOf(RetryableError);
    expect(err).not.toBeInstanceOf(CapacityError);
    expect(err.message).toBe(
      'RunInstances throttled after 4 retries: RequestLimitExceeded: Request limit exceeded.',
    );
  });

  it('answers "not found" for an instance EC2 does not show yet, and terminate() does not throw; then sees it', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    expect(p.eventuallyConsistent).toBe(true);
    const { resourceId } = await p.launch(spec());
    const naming = (r: Ec2Request) => listParam(r, 'InstanceId').includes(resourceId);
    const notFound = `The instance ID '${resourceId}' does not exist`;
    proxy.fail({
      action: 'DescribeInstances',
      when: naming,
      code: 'InvalidInstanceID.NotFound',
      message: notFound,
    });
    proxy.fail({
      action: 'TerminateInstances',
      when: naming,
      code: 'InvalidInstanceID.NotFound',
      message: notFound,
    });
    expect(await p.describe(resourceId)).toBeUndefined();
    await p.terminate(resourceId); // succeeds: "not found" is not proof that it is gone
    expect((await instance(resourceId)).State?.Name).toBe('running');
    expect(await p.describe(resourceId)).toMatchObject({ resourceId, state: 'running' });
  });

  // ---- host keys from the console ---------------------------------------------------------------------

  it("reads the console through GetConsoleOutput with Latest, decodes moto's base64 answer, and finds no key block in it", async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    const { resourceId } = await p.launch(spec());
    proxy.clear();
    // moto 5.2.1 answers a fixed Xen kernel log (no cloud-init): a console with no host-key block yet.
    expect(await p.reportedHostKeys(resourceId)).toEqual({ kind: 'none' });
    const [read] = proxy.requests.filter((r) => r.action === 'GetConsoleOutput');
    expect(read?.params.get('InstanceId')).toBe(resourceId);
    expect(read?.params.get('Latest')).toBe('true');
    expect(read?.answeredBy).toBe('moto');
  });

  it('asks again without Latest when EC2 refuses it (not a Nitro instance), and retries throttling', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    const { resourceId } = await p.launch(spec());
    proxy.clear();
    proxy.fail({ action: 'GetConsoleOutput', code: 'RequestLimitExceeded', times: 1 });
    proxy.fail({
      action: 'GetConsoleOutput',
      when: (r) => r.params.get('Latest') === 'true',
      code: 'UnsupportedOperation',
      message: 'The requested operation is not supported for this instance type.',
    });
    expect(await p.reportedHostKeys(resourceId)).toEqual({ kind: 'none' });
    expect(
      proxy.requests
        .filter((r) => r.action === 'GetConsoleOutput')
        .map((r) => `${r.params.get('Latest') ?? '-'} -> ${r.answeredBy}`),
    ).toEqual(['true -> RequestLimitExceeded', 'true -> UnsupportedOperation', '- -> moto']);
  });

  it('takes an instance EC2 does not know (yet) for one with no keys yet; a refusal is an error naming it', async () => {
    const p = provider({}, { [LABEL]: imageLabel() });
    // moto's own InvalidInstanceID.NotFound.
    expect(await p.reportedHostKeys('i-0123456789abcdef0')).toEqual({ kind: 'none' });
    proxy.clear();
    proxy.fail({ action: 'GetConsoleOutput', code: 'UnauthorizedOperation', times: 2 });
    const err = await rejection(p.reportedHostKeys('i-0123456789abcdef0'));
    expect(err.message).toMatch(/^GetConsoleOutput i-0123456789abcdef0 failed: UnauthorizedOperation/);
    // Not asked again without Latest: only a refusal of Latest is (issue 40, defect 4).
    expect(proxy.requests.filter((r) => r.action === 'GetConsoleOutput')).toHaveLength(1);
  });
});

/** Creates an instance profile in moto's IAM (a Query API call; the project has no IAM SDK client). */
async function createInstanceProfile(moto: Moto, name: string): Promise<void> {
  const res = await fetch(moto.endpoint, {
    method: 'POST',
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      // moto routes by the credential scope's service; it checks no signature.
      authorization:
        'AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/iam/aws4_request, SignedHeaders=host, Signature=0',
    },
    body: new URLSearchParams({
      Action: 'CreateInstanceProfile',
      InstanceProfileName: name,
      Version: '2010-05-08',
    }),
  });
  if (!res.ok)
    throw new Error(`moto IAM CreateInstanceProfile failed: HTTP ${res.status} ${await res.text()}`);
}
