import {
  DescribeImagesCommand,
  DescribeInstancesCommand,
  DescribeLaunchTemplateVersionsCommand,
  type DescribeLaunchTemplateVersionsCommandInput,
  GetConsoleOutputCommand,
  type ResponseLaunchTemplateData,
  RunInstancesCommand,
  type RunInstancesCommandInput,
  TerminateInstancesCommand,
} from '@aws-sdk/client-ec2';
import { afterEach, describe, expect, it } from 'vitest';
import { parseConfig } from '../../shared/config/load.ts';
import { ManualClock } from '../../shared/core/clock.ts';
import { CapacityError, DeadlineError, RetryableError } from '../../shared/core/errors.ts';
import type { BackingPool } from '../../shared/core/model.ts';
import type { LaunchSpec } from '../../shared/core/provider.ts';
import { StateChangeEvent } from '../../shared/core/stateChanges.ts';
import { isEc2InstanceId } from '../../shared/providers/aws/driver.ts';
import {
  backoffDelay,
  DEFAULT_BACKOFF,
  quotaScope,
  vcpuQuotaBucket,
} from '../../shared/providers/aws/ec2Errors.ts';
import { TEMPLATE_CACHE_MS } from '../../shared/providers/aws/ec2Lookups.ts';
import { Ec2Provider, type Ec2ProviderOptions } from '../../shared/providers/aws/ec2Provider.ts';
import { OFFERING_BACKOFF_MS, offeringsOf, QUOTA_PAUSE_MS } from '../../shared/providers/aws/offerings.ts';
import {
  clientToken,
  networkParameters,
  TAG_BACKING_NODE_ID,
  TAG_BACKING_POOL,
  TAG_LABEL,
  TAG_POOL,
} from '../../shared/providers/aws/runInstancesRequest.ts';
import { awsPoolSettings } from '../../shared/providers/aws/settings.ts';
import { EC2_EVENT_SOURCE, ec2Error, FakeEc2, type FakeEc2Options } from '../../testkit/fakeEc2.ts';

type Obj = Record<string, unknown>;

const POOL_ID = 'metastatic-test';
const POOL_KEY = 'ec2/main';
const LABEL = 'large';

function awsPool(poolOptions: Obj, labels: Record<string, Obj>, key = POOL_KEY): BackingPool {
  const [providerName = 'ec2', poolName = 'main'] = key.split('/');
  return {
    key,
    providerName,
    poolName,
    driver: 'aws',
    maxServers: undefined,
    providerOptions: { driver: 'aws', region: 'eu-west-1' },
    poolOptions: { 'subnet-id': 'subnet-1', ...poolOptions },
    labels: new Map(Object.entries(labels).map(([name, options]) => [name, { name, options }])),
  };
}

/** The settings of LABEL in a setup's pool (for offeringsOf). */
function awsPoolSettingsOf(options: { pool?: Obj; labels: Record<string, Obj> }, useSpot = false) {
  const pool = awsPool(options.pool ?? {}, {
    [LABEL]: { ...options.labels[LABEL], ...(useSpot ? { 'use-spot': true } : {}) },
  });
  const settings = awsPoolSettings(pool).get(LABEL);
  if (!settings) throw new Error('no settings');
  return settings;
}

const simpleLabel: Obj = { 'instance-type': 'm7i.large', 'image-id': 'ami-0abc' };

interface Setup {
  readonly clock: ManualClock;
  readonly fake: FakeEc2;
  readonly provider: Ec2Provider;
  readonly sleeps: number[];
}

const fakes: FakeEc2[] = [];
afterEach(() => {
  for (const fake of fakes.splice(0)) fake.restore();
});

function setup(
  options: {
    pool?: Obj;
    labels?: Record<string, Obj>;
    fake?: FakeEc2Options;
    provider?: Partial<Ec2ProviderOptions>;
    random?: () => number;
  } = {},
): Setup {
  const clock = new ManualClock();
  const fake = new FakeEc2({ clock, ...options.fake });
  fakes.push(fake);
  const sleeps: number[] = [];
  const provider = new Ec2Provider({
    client: fake.client,
    pools: [awsPool(options.pool ?? {}, options.labels ?? { [LABEL]: simpleLabel })],
    poolId: POOL_ID,
    clock,
    sleep: async (ms) => {
      sleeps.push(ms);
    },
    random: options.random ?? (() => 0.5),
    ...options.provider,
  });
  return { clock, fake, provider, sleeps };
}

const spec = (backingNodeId = 'bn-1', attempt = 1, label = LABEL): LaunchSpec => ({
  backingNodeId,
  attempt,
  poolKey: POOL_KEY,
  label,
});

function runInputs(fake: FakeEc2): RunInstancesCommandInput[] {
  return fake.mock.commandCalls(RunInstancesCommand).map((call) => call.args[0].input);
}

/** `<type> <subnet> <spot|on-demand>` of every RunInstances call. */
function offeringsTried(fake: FakeEc2): string[] {
  return runInputs(fake).map(
    (input) =>
      `${input.InstanceType} ${input.SubnetId ?? input.NetworkInterfaces?.[0]?.SubnetId} ${input.InstanceMarketOptions ? 'spot' : 'on-demand'}`,
  );
}

/**
 * Launch templates as DescribeLaunchTemplateVersions answers them (the fake EC2 has none): by id or name,
 * any version. Returns the inputs of the calls.
 */
function templates(
  fake: FakeEc2,
  data: Record<string, ResponseLaunchTemplateData>,
): DescribeLaunchTemplateVersionsCommandInput[] {
  const calls: DescribeLaunchTemplateVersionsCommandInput[] = [];
  fake.mock
    .on(DescribeLaunchTemplateVersionsCommand)
    .callsFake((input: DescribeLaunchTemplateVersionsCommandInput) => {
      calls.push(structuredClone(input));
      const key = input.LaunchTemplateId ?? input.LaunchTemplateName ?? '';
      const found = data[key];
      if (!found) {
        throw ec2Error(
          'InvalidLaunchTemplateName.NotFoundException',
          'At least one of the launch templates specified in the request does not exist.',
        );
      }
      return {
        LaunchTemplateVersions: [{ LaunchTemplateName: key, VersionNumber: 1, LaunchTemplateData: found }],
      };
    });
  return calls;
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (err) {
    return err as Error;
  }
  throw new Error('expected a rejection');
}

describe('launch: the RunInstances request', () => {
  it('sends exactly the expected request: tags on instance and volume, IMDSv2, encrypted root, no public IP', async () => {
    const { fake, provider } = setup({
      pool: { 'security-group-ids': ['sg-1', 'sg-2'] },
      labels: {
        [LABEL]: {
          ...simpleLabel,
          'key-name': 'ops',
          userdata: '#!/bin/sh\necho hi\n',
          'iam-instance-profile': { name: 'builder' },
          'volume-size': 100,
          tags: { team: 'ci' },
        },
      },
    });
    const { resourceId } = await provider.launch(spec());
    expect(isEc2InstanceId(resourceId)).toBe(true);

    const tags = [
      { Key: TAG_POOL, Value: POOL_ID },
      { Key: TAG_BACKING_NODE_ID, Value: 'bn-1' },
      { Key: TAG_BACKING_POOL, Value: POOL_KEY },
      { Key: TAG_LABEL, Value: LABEL },
      { Key: 'Name', Value: 'metastatic-bn-1' },
      { Key: 'team', Value: 'ci' },
    ];
    const token = clientToken(POOL_ID, spec(), {
      instanceType: 'm7i.large',
      subnetId: 'subnet-1',
      market: 'on-demand',
    });
    expect(runInputs(fake)).toEqual([
      {
        MinCount: 1,
        MaxCount: 1,
        MetadataOptions: { HttpTokens: 'required', HttpEndpoint: 'enabled', HttpPutResponseHopLimit: 2 },
        InstanceInitiatedShutdownBehavior: 'terminate',
        TagSpecifications: [
          { ResourceType: 'instance', Tags: tags },
          { ResourceType: 'volume', Tags: tags },
        ],
        ImageId: 'ami-0abc',
        BlockDeviceMappings: [
          {
            DeviceName: '/dev/xvda',
            Ebs: { Encrypted: true, DeleteOnTermination: true, VolumeType: 'gp3', VolumeSize: 100 },
          },
        ],
        KeyName: 'ops',
        UserData: Buffer.from('#!/bin/sh\necho hi\n').toString('base64'),
        IamInstanceProfile: { Name: 'builder' },
        InstanceType: 'm7i.large',
        SubnetId: 'subnet-1',
        SecurityGroupIds: ['sg-1', 'sg-2'],
        ClientToken: token,
      },
    ]);
    expect(token).toMatch(/^metastatic-[0-9a-f]{48}$/);
    expect(token.length).toBeLessThanOrEqual(64);
    // The root device comes from the image.
    expect(fake.mock.commandCalls(DescribeImagesCommand).map((c) => c.args[0].input)).toEqual([
      { ImageIds: ['ami-0abc'] },
    ]);

    const instance = fake.instance(resourceId);
    expect(instance?.tags).toEqual(Object.fromEntries(tags.map((t) => [t.Key, t.Value])));
    expect(instance?.volumes[0]).toMatchObject({
      encrypted: true,
      deviceName: '/dev/xvda',
      tags: instance?.tags,
    });
    expect(instance?.publicIp).toBeUndefined();
  });

  it('uses a deterministic ClientToken: a repeated launch gets the same instance, another attempt a new one', async () => {
    const { fake, provider } = setup();
    const first = await provider.launch(spec('bn-1', 1));
    const again = await provider.launch(spec('bn-1', 1));
    expect(again).toEqual(first);
    const other = await provider.launch(spec('bn-1', 2));
    expect(other.resourceId).not.toBe(first.resourceId);

    const tokens = runInputs(fake).map((input) => input.ClientToken);
    expect(tokens[0]).toBe(tokens[1]);
    expect(tokens[2]).not.toBe(tokens[0]);
    expect(fake.instances).toHaveLength(2);
    // A provider of another deployment (pool id) never shares tokens with this one.
    const offering = { instanceType: 'm7i.large', subnetId: 'subnet-1', market: 'on-demand' } as const;
    expect(clientToken('other', spec(), offering)).not.toBe(clientToken(POOL_ID, spec(), offering));
  });

  it('asks for a public IPv4 address when the pool says so (only then with a network interface), and connects to it', async () => {
    const { fake, provider } = setup({ pool: { 'public-ipv4': true, 'security-group-ids': ['sg-1'] } });
    const { resourceId } = await provider.launch(spec());
    const [input] = runInputs(fake);
    // RunInstances: with a network interface, subnet and groups go in it, never at instance level.
    expect(input?.NetworkInterfaces).toEqual([
      {
        DeviceIndex: 0,
        SubnetId: 'subnet-1',
        AssociatePublicIpAddress: true,
        DeleteOnTermination: true,
        Groups: ['sg-1'],
      },
    ]);
    expect(input?.SubnetId).toBeUndefined();
    expect(input?.SecurityGroupIds).toBeUndefined();
    const resource = await provider.describe(resourceId);
    expect(resource?.host).toBe(fake.instance(resourceId)?.publicIp);
    expect(resource?.host).toMatch(/^203\.0\.113\./);
  });

  it('leaves the root volume to a launch template, and looks no image up', async () => {
    const { fake, provider } = setup({
      labels: {
        [LABEL]: { 'instance-type': 'c7i.large', 'launch-template': { name: 'builders', version: 3 } },
      },
    });
    templates(fake, { builders: {} });
    await provider.launch(spec());
    const [input] = runInputs(fake);
    expect(input?.LaunchTemplate).toEqual({ LaunchTemplateName: 'builders', Version: '3' });
    expect(input?.ImageId).toBeUndefined();
    expect(input?.BlockDeviceMappings).toBeUndefined();
    expect(fake.mock.commandCalls(DescribeImagesCommand)).toHaveLength(0);
  });

  it("maps the image's own root device (once per image) and requests spot with use-spot", async () => {
    const { fake, provider } = setup({
      fake: { images: { 'ami-ubuntu': { rootDeviceName: '/dev/sda1' } } },
      labels: { [LABEL]: { 'instance-type': 'm7i.large', 'image-id': 'ami-ubuntu', 'use-spot': true } },
    });
    await provider.launch(spec('bn-1'));
    await provider.launch(spec('bn-2'));
    const inputs = runInputs(fake);
    expect(inputs.map((i) => i.BlockDeviceMappings?.[0]?.DeviceName)).toEqual(['/dev/sda1', '/dev/sda1']);
    expect(fake.mock.commandCalls(DescribeImagesCommand)).toHaveLength(1);
    expect(inputs[0]?.InstanceMarketOptions).toEqual({
      MarketType: 'spot',
      SpotOptions: { SpotInstanceType: 'one-time', InstanceInterruptionBehavior: 'terminate' },
    });
  });

  it('fails the attempt when the image does not exist', async () => {
    const { provider } = setup({ fake: { images: {} } });
    const err = await rejection(provider.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    expect(err.message).toMatch(/DescribeImages ami-0abc failed: InvalidAMIID.NotFound/);
  });

  it('rejects pools and labels it does not serve, and invalid options up front', async () => {
    const { provider } = setup();
    await expect(provider.launch({ ...spec(), poolKey: 'ec2/other' })).rejects.toThrow(
      'backing pool ec2/other is not an aws pool of this provider',
    );
    await expect(provider.launch(spec('bn-1', 1, 'nope'))).rejects.toThrow(
      'backing pool ec2/main has no label nope',
    );
    expect(
      () =>
        new Ec2Provider({
          client: setup().fake.client,
          pools: [awsPool({}, { [LABEL]: { 'image-id': 'ami-1' } })],
          poolId: POOL_ID,
          clock: new ManualClock(),
        }),
    ).toThrow(/invalid aws backing pool ec2\/main: .*instance-type: missing required key "instance-type"/);
  });
});

describe('launch: network parameters and launch templates (RunInstances rules)', () => {
  const templated = (template: Obj, extra: Obj = {}): Record<string, Obj> => ({
    [LABEL]: { 'instance-type': 'm7i.large', 'launch-template': template, ...extra },
  });

  it('sends subnet and groups at instance level with a template that sets its own groups there', async () => {
    // Defect: NetworkInterfaces was always sent; with a template carrying SecurityGroupIds EC2 answers
    // InvalidParameterCombination ("Network interfaces and an instance-level security groups ...").
    const { fake, provider } = setup({ labels: templated({ name: 'builders' }) });
    const calls = templates(fake, { builders: { SecurityGroupIds: ['sg-template'] } });
    await provider.launch(spec());
    const [input] = runInputs(fake);
    expect(input?.LaunchTemplate).toEqual({ LaunchTemplateName: 'builders' });
    expect(input?.SubnetId).toBe('subnet-1');
    expect(input?.NetworkInterfaces).toBeUndefined();
    expect(input?.SecurityGroupIds).toBeUndefined(); // the template's groups apply
    expect(calls).toEqual([{ LaunchTemplateName: 'builders', Versions: ['$Default'] }]);
  });

  it("lets the pool's security groups override the template's instance-level ones", async () => {
    const { fake, provider } = setup({
      pool: { 'security-group-ids': ['sg-pool'] },
      labels: templated({ id: 'lt-1', version: 2 }),
    });
    const calls = templates(fake, { 'lt-1': { SecurityGroupIds: ['sg-template'] } });
    await provider.launch(spec());
    expect(runInputs(fake)[0]).toMatchObject({ SubnetId: 'subnet-1', SecurityGroupIds: ['sg-pool'] });
    expect(calls).toEqual([{ LaunchTemplateId: 'lt-1', Versions: ['2'] }]);
  });

  it("puts the subnet into a template's network interfaces, keeping their groups, never at instance level", async () => {
    const { fake, provider } = setup({ labels: templated({ name: 'eni' }) });
    templates(fake, {
      eni: {
        NetworkInterfaces: [
          { DeviceIndex: 0, Groups: ['sg-a', 'sg-b'], DeleteOnTermination: true, Ipv6AddressCount: 1 },
          { DeviceIndex: 1, SubnetId: 'subnet-side', Groups: ['sg-side'] },
        ],
      },
    });
    await provider.launch(spec());
    const [input] = runInputs(fake);
    expect(input?.SubnetId).toBeUndefined();
    expect(input?.SecurityGroupIds).toBeUndefined();
    expect(input?.NetworkInterfaces).toEqual([
      {
        DeviceIndex: 0,
        SubnetId: 'subnet-1',
        Groups: ['sg-a', 'sg-b'],
        DeleteOnTermination: true,
        Ipv6AddressCount: 1,
      },
      { DeviceIndex: 1, SubnetId: 'subnet-side', Groups: ['sg-side'] },
    ]);
  });

  it("replaces the template interface's groups with the pool's and asks for a public address with public-ipv4", async () => {
    const parameters = networkParameters({ securityGroupIds: ['sg-pool'], publicIpv4: true }, 'subnet-2', {
      describe: 'name=eni version $Default',
      interfaces: [{ DeviceIndex: 0, Groups: ['sg-a'], AssociatePublicIpAddress: false }],
      instanceGroups: [],
    });
    expect(parameters).toEqual({
      NetworkInterfaces: [
        { DeviceIndex: 0, SubnetId: 'subnet-2', Groups: ['sg-pool'], AssociatePublicIpAddress: true },
      ],
    });
  });

  it('refuses combinations EC2 rejects, naming the template and what to change, without calling RunInstances', async () => {
    const { fake, provider } = setup({
      pool: { 'public-ipv4': true },
      labels: templated({ name: 'builders' }),
    });
    templates(fake, { builders: { SecurityGroupIds: ['sg-template'] } });
    const err = await rejection(provider.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    expect(err.message).toBe(
      "launch template name=builders version $Default sets security groups at instance level (sg-template): public-ipv4 needs a network interface in the request, and EC2 rejects a network interface with instance-level security groups (InvalidParameterCombination); move the groups into the template's network interface (DeviceIndex 0, Groups), or give them as the pool's security-group-ids and remove them from the template",
    );
    expect(runInputs(fake)).toHaveLength(0);

    const both = { describe: 't', interfaces: [{ DeviceIndex: 0 }], instanceGroups: ['sg-1'] };
    expect(() => networkParameters({ securityGroupIds: [], publicIpv4: false }, 'subnet-1', both)).toThrow(
      /also has network interfaces, and EC2 rejects instance-level security groups with network interfaces/,
    );
    const attached = {
      describe: 't',
      interfaces: [{ DeviceIndex: 0, NetworkInterfaceId: 'eni-1' }],
      instanceGroups: [],
    };
    expect(() =>
      networkParameters({ securityGroupIds: [], publicIpv4: false }, 'subnet-1', attached),
    ).toThrow('launch template t attaches the existing network interface eni-1');
  });

  it('reads a numbered template version once, and $Default again after 5 minutes', async () => {
    const { fake, clock, provider } = setup({
      labels: {
        numbered: { 'instance-type': 'm7i.large', 'launch-template': { name: 'a', version: 4 } },
        moving: { 'instance-type': 'm7i.large', 'launch-template': { name: 'b' } },
      },
    });
    const calls = templates(fake, { a: {}, b: {} });
    await provider.launch(spec('bn-1', 1, 'numbered'));
    await provider.launch(spec('bn-2', 1, 'moving'));
    clock.advance(TEMPLATE_CACHE_MS - 1);
    await provider.launch(spec('bn-3', 1, 'numbered'));
    await provider.launch(spec('bn-4', 1, 'moving'));
    expect(calls).toHaveLength(2);
    clock.advance(1);
    await provider.launch(spec('bn-5', 1, 'numbered'));
    await provider.launch(spec('bn-6', 1, 'moving'));
    expect(calls.map((c) => `${c.LaunchTemplateName} ${c.Versions?.join()}`)).toEqual([
      'a 4',
      'b $Default',
      'b $Default',
    ]);
  });

  it('fails the attempt when the launch template cannot be read', async () => {
    const { fake, provider } = setup({ labels: templated({ name: 'missing' }) });
    templates(fake, {});
    const err = await rejection(provider.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    expect(err.message).toBe(
      'DescribeLaunchTemplateVersions (launch template name=missing version $Default) failed: InvalidLaunchTemplateName.NotFoundException: At least one of the launch templates specified in the request does not exist.',
    );
    expect(runInputs(fake)).toHaveLength(0);
  });
});

describe('pools from the configuration loader', () => {
  it('launches from pools as parseConfig resolves them (defaults applied)', async () => {
    const result = parseConfig(
      [
        'providers:',
        '  - name: ec2',
        '    driver: aws',
        '    region: eu-west-1',
        '    pools:',
        '      - name: main',
        '        subnet-id: subnet-1',
        '        labels:',
        '          - { name: plain, instance-type: m7i.large, image-id: ami-0abc }',
        '          - { name: templated, instance-type: m7i.large, launch-template: { id: lt-1 } }',
        '  - name: meta',
        '    driver: metastatic',
        '    pools: [{ name: main, labels: [{ name: small, backing-label: plain }] }]',
      ].join('\n'),
      'test.yaml',
    );
    if (!result.ok) throw new Error(JSON.stringify(result.errors));
    const fake = new FakeEc2();
    fakes.push(fake);
    templates(fake, { 'lt-1': {} });
    const provider = new Ec2Provider({
      client: fake.client,
      pools: result.config.backingPools,
      poolId: POOL_ID,
      clock: fake.clock,
    });
    await provider.launch(spec('bn-1', 1, 'plain'));
    await provider.launch(spec('bn-2', 1, 'templated'));
    const [plain, templated] = runInputs(fake);
    expect(plain?.BlockDeviceMappings?.[0]?.Ebs).toEqual({
      Encrypted: true,
      DeleteOnTermination: true,
      VolumeType: 'gp3',
    });
    expect(templated?.LaunchTemplate).toEqual({ LaunchTemplateId: 'lt-1' });
    expect(templated?.BlockDeviceMappings).toBeUndefined();
  });
});

describe('launch: offerings and capacity', () => {
  const twoByTwo = {
    pool: { 'subnet-id': undefined, 'subnet-ids': ['subnet-1', 'subnet-2'] },
    labels: { [LABEL]: { 'instance-types': ['m7i.large', 'm6i.large'], 'image-id': 'ami-0abc' } },
  };

  it('falls back across subnets, then instance types, each with its own token', async () => {
    const { fake, provider } = setup(twoByTwo);
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: 'm7i.large' });
    const { resourceId } = await provider.launch(spec());
    expect(offeringsTried(fake)).toEqual([
      'm7i.large subnet-1 on-demand',
      'm7i.large subnet-2 on-demand',
      'm6i.large subnet-1 on-demand',
    ]);
    expect(fake.instance(resourceId)).toMatchObject({ instanceType: 'm6i.large', subnetId: 'subnet-1' });
    expect(new Set(runInputs(fake).map((i) => i.ClientToken)).size).toBe(3);
    // With several offerings, a live instance of the backing node is looked for first.
    expect(fake.mock.commandCalls(DescribeInstancesCommand).map((c) => c.args[0].input)).toEqual([
      {
        Filters: [
          { Name: `tag:${TAG_POOL}`, Values: [POOL_ID] },
          { Name: `tag:${TAG_BACKING_NODE_ID}`, Values: ['bn-1'] },
          { Name: 'instance-state-name', Values: ['pending', 'running'] },
        ],
      },
    ]);
  });

  it('returns the instance an earlier delivery launched on a fallback offering (another container)', async () => {
    const { fake, clock, provider } = setup(twoByTwo);
    fake.failLaunches({
      code: 'InsufficientInstanceCapacity',
      instanceType: 'm7i.large',
      subnetId: 'subnet-1',
    });
    const first = await provider.launch(spec());
    fake.clearFailures();
    const fresh = new Ec2Provider({
      client: fake.client,
      pools: [awsPool(twoByTwo.pool, twoByTwo.labels)],
      poolId: POOL_ID,
      clock,
    });
    expect(await fresh.launch(spec())).toEqual(first);
    expect(runInputs(fake)).toHaveLength(2); // no third RunInstances
    expect(fake.live()).toHaveLength(1);
  });

  it('tries spot first, then on-demand of the same type and subnet', async () => {
    const { fake, provider } = setup({
      labels: { [LABEL]: { ...simpleLabel, 'use-spot': true } },
    });
    fake.failLaunches({ code: 'SpotMaxPriceTooLow', market: 'spot' });
    const { resourceId } = await provider.launch(spec());
    expect(offeringsTried(fake)).toEqual(['m7i.large subnet-1 spot', 'm7i.large subnet-1 on-demand']);
    expect(runInputs(fake)[1]?.InstanceMarketOptions).toBeUndefined();
    expect((await provider.describe(resourceId))?.attributes.spot).toBe(false);
  });

  it('tries spot in every subnet and instance type before any on-demand offering', async () => {
    // Defect: offerings went type x subnet x [spot, on-demand], so one spot miss bought on-demand.
    const { fake, provider } = setup({
      ...twoByTwo,
      labels: { [LABEL]: { ...twoByTwo.labels[LABEL], 'use-spot': true } },
    });
    expect(
      offeringsOf(awsPoolSettingsOf(twoByTwo, true)).map(
        (o) => `${o.instanceType} ${o.subnetId} ${o.market}`,
      ),
    ).toEqual([
      'm7i.large subnet-1 spot',
      'm7i.large subnet-2 spot',
      'm6i.large subnet-1 spot',
      'm6i.large subnet-2 spot',
      'm7i.large subnet-1 on-demand',
      'm7i.large subnet-2 on-demand',
      'm6i.large subnet-1 on-demand',
      'm6i.large subnet-2 on-demand',
    ]);
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', market: 'spot', instanceType: 'm7i.large' });
    const { resourceId } = await provider.launch(spec());
    expect(offeringsTried(fake)).toEqual([
      'm7i.large subnet-1 spot',
      'm7i.large subnet-2 spot',
      'm6i.large subnet-1 spot',
    ]);
    expect(fake.instance(resourceId)).toMatchObject({ instanceType: 'm6i.large', spot: true });
  });

  it('remembers an offering without capacity for 5 minutes, then tries it again', async () => {
    const { fake, clock, provider } = setup(twoByTwo);
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: 'm7i.large', times: 2 });
    await provider.launch(spec('bn-1'));
    expect(offeringsTried(fake)).toHaveLength(3);

    clock.advance(OFFERING_BACKOFF_MS - 1);
    await provider.launch(spec('bn-2'));
    expect(offeringsTried(fake).slice(3)).toEqual(['m6i.large subnet-1 on-demand']);

    clock.advance(1);
    await provider.launch(spec('bn-3'));
    expect(offeringsTried(fake).slice(4)).toEqual(['m7i.large subnet-1 on-demand']);
  });

  it('skips a whole subnet that ran out of addresses', async () => {
    const { fake, provider } = setup(twoByTwo);
    fake.failLaunches({ code: 'InsufficientFreeAddressesInSubnet', subnetId: 'subnet-1', times: 1 });
    await provider.launch(spec('bn-1'));
    await provider.launch(spec('bn-2'));
    expect(offeringsTried(fake)).toEqual([
      'm7i.large subnet-1 on-demand',
      'm7i.large subnet-2 on-demand',
      'm7i.large subnet-2 on-demand',
    ]);
  });

  it('fails the attempt naming every offering when none has capacity; then waits while all are remembered', async () => {
    const { fake, clock, provider } = setup({
      ...twoByTwo,
      labels: { [LABEL]: { ...twoByTwo.labels[LABEL], 'use-spot': true } },
    });
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', market: 'spot' });
    fake.failLaunches({ code: 'Unsupported', message: 'not in this zone', instanceType: 'm6i.large' });
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', message: 'none left' });
    const err = await rejection(provider.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    const spotMiss =
      'InsufficientInstanceCapacity: We currently do not have sufficient capacity in the Availability Zone you requested.';
    expect(err.message).toBe(
      [
        'no capacity for label large in backing pool ec2/main: ',
        `m7i.large in subnet-1 (spot): ${spotMiss}; `,
        `m7i.large in subnet-2 (spot): ${spotMiss}; `,
        `m6i.large in subnet-1 (spot): ${spotMiss}; `,
        `m6i.large in subnet-2 (spot): ${spotMiss}; `,
        'm7i.large in subnet-1 (on-demand): InsufficientInstanceCapacity: none left; ',
        'm7i.large in subnet-2 (on-demand): InsufficientInstanceCapacity: none left; ',
        'm6i.large in subnet-1 (on-demand): Unsupported: not in this zone; ',
        'm6i.large in subnet-2 (on-demand): Unsupported: not in this zone',
      ].join(''),
    );
    expect(runInputs(fake)).toHaveLength(8);

    // Every offering is known to be out: the next launch waits without calling RunInstances.
    clock.advance(60_000);
    const waiting = await rejection(provider.launch(spec('bn-2')));
    expect(waiting).toBeInstanceOf(CapacityError);
    expect(waiting.message).toMatch(
      /^no offering of label large in backing pool ec2\/main can launch until 2026-01-01T00:05:00\.000Z: m7i\.large in subnet-1 \(spot\): InsufficientInstanceCapacity; /,
    );
    expect(runInputs(fake)).toHaveLength(8);
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBe(waiting.message);
    expect(provider.launchBlocked(POOL_KEY)).toBe(waiting.message); // its only label

    clock.advance(OFFERING_BACKOFF_MS);
    fake.clearFailures();
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBeUndefined();
    await provider.launch(spec('bn-2'));
    expect(offeringsTried(fake).slice(8)).toEqual(['m7i.large subnet-1 spot']);
  });

  it('on MaxSpotInstanceCountExceeded skips every spot offering for 5 minutes and launches on-demand', async () => {
    // Defect: the spot quota paused the whole pool, though on-demand has quotas of its own.
    const { fake, clock, provider } = setup({
      ...twoByTwo,
      labels: { [LABEL]: { ...twoByTwo.labels[LABEL], 'use-spot': true } },
    });
    fake.failLaunches({
      code: 'MaxSpotInstanceCountExceeded',
      message: 'Max spot instance count exceeded',
      market: 'spot',
    });
    const first = await provider.launch(spec('bn-1'));
    expect(offeringsTried(fake)).toEqual(['m7i.large subnet-1 spot', 'm7i.large subnet-1 on-demand']);
    expect(fake.instance(first.resourceId)?.spot).toBe(false);
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBeUndefined();
    expect(provider.launchBlocked(POOL_KEY)).toBeUndefined();

    clock.advance(QUOTA_PAUSE_MS - 1);
    await provider.launch(spec('bn-2'));
    expect(offeringsTried(fake).slice(2)).toEqual(['m7i.large subnet-1 on-demand']);

    clock.advance(1);
    fake.clearFailures();
    const later = await provider.launch(spec('bn-3'));
    expect(offeringsTried(fake).slice(3)).toEqual(['m7i.large subnet-1 spot']);
    expect(fake.instance(later.resourceId)?.spot).toBe(true);
  });

  it('on VcpuLimitExceeded skips the vCPU bucket of that market only, and tries the others', async () => {
    const { fake, provider } = setup({
      labels: {
        [LABEL]: {
          'instance-types': ['m7i.large', 'm6i.large', 'g5.xlarge'],
          'image-id': 'ami-0abc',
          'use-spot': true,
        },
      },
    });
    // Spot m7i hits the spot Standard quota: spot m6i (same bucket) is skipped, spot g5 is tried.
    fake.failLaunches({ code: 'VcpuLimitExceeded', market: 'spot', instanceType: 'm7i.large' });
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', market: 'spot', instanceType: 'g5.xlarge' });
    const { resourceId } = await provider.launch(spec());
    expect(offeringsTried(fake)).toEqual([
      'm7i.large subnet-1 spot',
      'g5.xlarge subnet-1 spot',
      'm7i.large subnet-1 on-demand', // the on-demand Standard quota is another one
    ]);
    expect(fake.instance(resourceId)).toMatchObject({ instanceType: 'm7i.large', spot: false });
  });

  it('makes the request wait when only quotas failed: CapacityError, launchBlocked, cleared after 5 minutes', async () => {
    const { fake, clock, provider } = setup(twoByTwo);
    fake.failNextLaunches(1, 'VcpuLimitExceeded');
    const err = await rejection(provider.launch(spec()));
    expect(err).toBeInstanceOf(CapacityError);
    const scope = 'on-demand Standard (A, C, D, H, I, M, R, T, Z) instances';
    expect(err.message).toBe(
      [
        'no offering of label large in backing pool ec2/main can launch until 2026-01-01T00:05:00.000Z: ',
        `m7i.large in subnet-1 (on-demand): VcpuLimitExceeded (quota: ${scope}); `,
        `m7i.large in subnet-2 (on-demand): VcpuLimitExceeded (quota: ${scope}); `,
        `m6i.large in subnet-1 (on-demand): VcpuLimitExceeded (quota: ${scope}); `,
        `m6i.large in subnet-2 (on-demand): VcpuLimitExceeded (quota: ${scope})`,
      ].join(''),
    );
    // Every offering is on-demand and in the Standard bucket: one call, then all are skipped.
    expect(runInputs(fake)).toHaveLength(1);
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBe(err.message);
    expect(provider.launchBlocked('ec2/other')).toBeUndefined();

    clock.advance(QUOTA_PAUSE_MS - 1);
    await expect(provider.launch(spec('bn-2'))).rejects.toBeInstanceOf(CapacityError);
    expect(runInputs(fake)).toHaveLength(1);

    clock.advance(1);
    expect(provider.launchBlocked(POOL_KEY)).toBeUndefined();
    await provider.launch(spec('bn-2'));
    expect(runInputs(fake)).toHaveLength(2);
  });

  it('on InstanceLimitExceeded skips that instance type in that market only', async () => {
    const { fake, provider } = setup(twoByTwo);
    fake.failLaunches({ code: 'InstanceLimitExceeded', message: 'limit', instanceType: 'm7i.large' });
    await provider.launch(spec());
    expect(offeringsTried(fake)).toEqual(['m7i.large subnet-1 on-demand', 'm6i.large subnet-1 on-demand']);
  });

  it('shares quotas between the pools of one provider (one account)', async () => {
    const clock = new ManualClock();
    const fake = new FakeEc2({ clock });
    fakes.push(fake);
    const provider = new Ec2Provider({
      client: fake.client,
      pools: [awsPool({}, { [LABEL]: simpleLabel }), awsPool({}, { [LABEL]: simpleLabel }, 'ec2/second')],
      poolId: POOL_ID,
      clock,
    });
    fake.failNextLaunches(1, 'VcpuLimitExceeded');
    await expect(provider.launch(spec())).rejects.toBeInstanceOf(CapacityError);
    expect(provider.launchBlocked('ec2/second', LABEL)).toMatch(
      /VcpuLimitExceeded \(quota: on-demand Standard/,
    );
  });

  it('fails the attempt with the code and message of any other error, without trying other offerings', async () => {
    const { fake, provider } = setup(twoByTwo);
    fake.failNextLaunches(1, 'InvalidSubnetID.NotFound', "The subnet ID 'subnet-1' does not exist");
    const err = await rejection(provider.launch(spec()));
    expect(err).not.toBeInstanceOf(RetryableError);
    expect(err.message).toBe(
      "RunInstances (m7i.large in subnet-1 (on-demand)) for backing node bn-1 failed: InvalidSubnetID.NotFound: The subnet ID 'subnet-1' does not exist",
    );
    expect(runInputs(fake)).toHaveLength(1);
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBeUndefined();
  });
});

describe('quota scopes', () => {
  it.each([
    ['m7i.large', 'Standard (A, C, D, H, I, M, R, T, Z)'],
    ['c7gn.xlarge', 'Standard (A, C, D, H, I, M, R, T, Z)'],
    ['im4gn.large', 'Standard (A, C, D, H, I, M, R, T, Z)'],
    ['t4g.micro', 'Standard (A, C, D, H, I, M, R, T, Z)'],
    ['z1d.large', 'Standard (A, C, D, H, I, M, R, T, Z)'],
    ['dl1.24xlarge', 'DL'],
    ['hpc7g.4xlarge', 'HPC'],
    ['inf2.xlarge', 'Inf'],
    ['trn1.2xlarge', 'Trn'],
    ['g5.xlarge', 'G and VT'],
    ['gr6.4xlarge', 'G and VT'],
    ['vt1.3xlarge', 'G and VT'],
    ['p5.48xlarge', 'P'],
    ['x2idn.16xlarge', 'X'],
    ['f1.2xlarge', 'F'],
    ['u-6tb1.metal', 'High Memory (U)'],
    ['q9.large', 'Q'], // a family it does not know: a bucket of its own
  ])('puts %s in the vCPU bucket %s', (type, bucket) => {
    expect(vcpuQuotaBucket(type)).toBe(bucket);
  });

  it('scopes each quota code by market, and by bucket or type where the quota has them', () => {
    const spot = { instanceType: 'm7i.large', market: 'spot' } as const;
    const onDemand = { instanceType: 'm7i.large', market: 'on-demand' } as const;
    expect(quotaScope('MaxSpotInstanceCountExceeded', spot)).toBe('spot instances');
    expect(quotaScope('VcpuLimitExceeded', spot)).toBe('spot Standard (A, C, D, H, I, M, R, T, Z) instances');
    expect(quotaScope('VcpuLimitExceeded', onDemand)).toBe(
      'on-demand Standard (A, C, D, H, I, M, R, T, Z) instances',
    );
    expect(quotaScope('InstanceLimitExceeded', onDemand)).toBe('on-demand m7i.large instances');
  });
});

describe('throttling', () => {
  it('retries with growing, jittered sleeps and the same ClientToken', async () => {
    const randoms = [0, 1, 0.5];
    const { fake, provider, sleeps } = setup({ random: () => randoms.shift() ?? 0.5 });
    fake.throttle(1, { commands: ['DescribeImages'] });
    fake.throttle(2, { commands: ['RunInstances'], code: 'Throttling' });
    const { resourceId } = await provider.launch(spec());
    expect(fake.instance(resourceId)).toBeDefined();
    // Equal jitter: step/2 + random * step/2, steps 1000, 1500, 2250; one budget for the whole call.
    expect(sleeps).toEqual([500, 1500, 1688]);
    const tokens = runInputs(fake).map((i) => i.ClientToken);
    expect(tokens).toHaveLength(3);
    expect(new Set(tokens).size).toBe(1);
    expect(fake.instances).toHaveLength(1);
  });

  it('gives up after 4 retries in one call with RetryableError, to come back later', async () => {
    const { fake, provider, sleeps } = setup();
    fake.throttle(10, { commands: ['RunInstances'] });
    const err = await rejection(provider.launch(spec()));
    expect(err).toBeInstanceOf(RetryableError);
    expect(err).not.toBeInstanceOf(CapacityError);
    expect(err.message).toBe(
      'RunInstances throttled after 4 retries: RequestLimitExceeded: Request limit exceeded.',
    );
    expect(sleeps).toEqual([750, 1125, 1688, 2531]);
    expect(runInputs(fake)).toHaveLength(5);
    expect(provider.launchBlocked(POOL_KEY, LABEL)).toBeUndefined(); // throttling is not remembered
  });

  it('caps the step at 60 s', async () => {
    const { fake, provider, sleeps } = setup({ provider: { backoff: { maxRetries: 14 } }, random: () => 1 });
    fake.throttle(14, { code: 'Throttling' });
    await provider.list();
    expect(sleeps).toHaveLength(14);
    for (let i = 1; i < sleeps.length; i++) expect(sleeps[i]).toBeGreaterThanOrEqual(sleeps[i - 1] ?? 0);
    expect(sleeps.slice(0, 3)).toEqual([1000, 1500, 2250]);
    expect(sleeps.slice(-4)).toEqual([57665, 60000, 60000, 60000]);
    expect(backoffDelay(DEFAULT_BACKOFF, 30, () => 0)).toBe(30_000);
  });

  it('retries transient server errors the same way', async () => {
    const { fake, provider, sleeps } = setup();
    const { resourceId } = await provider.launch(spec());
    fake.failCalls(() => ec2Error('InternalError', 'oops', 'server'), { commands: ['DescribeInstances'] });
    expect((await provider.describe(resourceId))?.state).toBe('pending');
    expect(sleeps).toEqual([750]);
    expect(fake.mock.commandCalls(DescribeInstancesCommand)).toHaveLength(2);
  });
});

describe("the invocation's deadline (issue 24)", () => {
  /** An invocation's deadline `ms` from now on the setup's clock (what Context.deadline holds). */
  const deadlineIn = (clock: ManualClock, ms: number) => {
    const end = clock.now() + ms;
    return { remainingMs: () => end - clock.now() };
  };

  it('stops retrying a throttled call when the next backoff would outlast the invocation, without sleeping it', async () => {
    const sleeps: number[] = [];
    const { clock, fake, provider } = setup({
      provider: {
        sleep: async (ms) => {
          sleeps.push(ms);
          clock.advance(ms);
        },
      },
    });
    fake.throttle(10, { commands: ['RunInstances'] });
    const err = await rejection(provider.launch(spec(), deadlineIn(clock, 2_000)));
    expect(err).toBeInstanceOf(DeadlineError);
    expect(err.message).toMatch(/RunInstances throttled; .*left in this invocation/);
    // 750 ms fits the 2 s, then 1,125 ms the 1,250 left; the next 1,688 ms would not fit the 125 left.
    expect(sleeps).toEqual([750, 1125]);
    expect(runInputs(fake)).toHaveLength(3);
  });

  it('tries no further offering once the invocation has no time left, and launches nothing', async () => {
    const { clock, fake, provider } = setup({
      pool: { 'subnet-id': undefined, 'subnet-ids': ['subnet-1', 'subnet-2'] },
      labels: { [LABEL]: { 'instance-types': ['m7i.large', 'm6i.large'], 'image-id': 'ami-0abc' } },
    });
    fake.failLaunches({ code: 'InsufficientInstanceCapacity', instanceType: 'm7i.large' });
    fake.slowCalls(3_000, ['RunInstances']);
    const err = await rejection(provider.launch(spec(), deadlineIn(clock, 5_000)));
    expect(err).toBeInstanceOf(DeadlineError);
    // Two offerings took the 5 s; the third (m6i.large, which has capacity) is left to the next try.
    expect(offeringsTried(fake)).toEqual(['m7i.large subnet-1 on-demand', 'm7i.large subnet-2 on-demand']);
    expect(fake.instances).toEqual([]);
    // Without a deadline the same launch goes on to the offering that works.
    const { resourceId } = await provider.launch(spec());
    expect(fake.instance(resourceId)?.instanceType).toBe('m6i.large');
  });

  it('asks nothing of EC2 when the invocation has no time left (launch, list, terminate)', async () => {
    const { clock, fake, provider } = setup();
    const { resourceId } = await provider.launch(spec());
    fake.resetCalls();
    const spent = deadlineIn(clock, 0);
    expect(await rejection(provider.launch(spec('bn-2'), spent))).toBeInstanceOf(DeadlineError);
    expect(await rejection(provider.list(spent))).toBeInstanceOf(DeadlineError);
    expect(await rejection(provider.terminateMany([resourceId], spent))).toBeInstanceOf(DeadlineError);
    expect(fake.mock.calls()).toHaveLength(0);
  });
});

describe('describe', () => {
  it('maps a pending then running instance', async () => {
    const { fake, clock, provider } = setup({
      labels: { [LABEL]: { ...simpleLabel, 'connection-port': 2222 } },
    });
    const launchedAt = clock.now();
    const { resourceId } = await provider.launch(spec());
    const instance = fake.instance(resourceId);
    const expected = {
      resourceId,
      backingNodeId: 'bn-1',
      poolKey: POOL_KEY,
      state: 'pending',
      host: instance?.privateIp,
      port: 2222,
      launchedAt,
      attributes: {
        provider: 'aws',
        region: 'eu-west-1',
        instanceId: resourceId,
        instanceType: 'm7i.large',
        availabilityZone: 'eu-west-1a',
        imageId: 'ami-0abc',
        privateIp: instance?.privateIp,
        spot: false,
        label: LABEL,
      },
    };
    expect(await provider.describe(resourceId)).toEqual(expected);
    await fake.advance(30_000);
    expect(await provider.describe(resourceId)).toEqual({ ...expected, state: 'running' });
  });

  it('reports spot instances', async () => {
    const { fake, provider } = setup({ labels: { [LABEL]: { ...simpleLabel, 'use-spot': true } } });
    const { resourceId } = await provider.launch(spec());
    expect((await provider.describe(resourceId))?.attributes).toMatchObject({ spot: true });
    expect(fake.instance(resourceId)?.spot).toBe(true);
  });

  it('says it is eventually consistent (a new instance can be unknown to describe and terminate a moment)', () => {
    expect(setup().provider.eventuallyConsistent).toBe(true);
  });

  it('returns undefined for an instance that is not ours, unknown, or not an instance id', async () => {
    const { fake, provider } = setup();
    const foreign = await fake.client.send(
      new RunInstancesCommand({
        MinCount: 1,
        MaxCount: 1,
        ImageId: 'ami-1',
        InstanceType: 'm7i.large',
        SubnetId: 'subnet-1',
        TagSpecifications: [{ ResourceType: 'instance', Tags: [{ Key: TAG_POOL, Value: 'another-stack' }] }],
      }),
    );
    const foreignId = foreign.Instances?.[0]?.InstanceId ?? '';
    expect(await provider.describe(foreignId)).toBeUndefined();
    expect(await provider.describe('i-0123456789abcdef0')).toBeUndefined();
    const calls = fake.mock.commandCalls(DescribeInstancesCommand).length;
    expect(await provider.describe('local-0123456789abcdef')).toBeUndefined();
    expect(fake.mock.commandCalls(DescribeInstancesCommand)).toHaveLength(calls);
  });

  it('describes many instances with an instance-id filter, 200 ids a call, leaving out the unknown ones', async () => {
    const { fake, provider } = setup();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await provider.launch(spec(`bn-${i}`))).resourceId);
    await provider.terminate(ids[2] as string);
    const unknown = Array.from(
      { length: 250 },
      (_, i) => `i-${(0xf0000 + i).toString(16).padStart(17, '0')}`,
    );
    fake.resetCalls();
    const found = await provider.describeMany([...unknown, ...ids, 'local-0123456789abcdef']);
    expect([...found.keys()].sort()).toEqual([...ids].sort());
    expect(ids.map((id) => found.get(id)?.state)).toEqual(['pending', 'pending', 'shutting-down']);
    const calls = fake.mock.commandCalls(DescribeInstancesCommand).map((c) => c.args[0].input);
    expect(calls.map((c) => c.Filters?.[0]?.Values?.length)).toEqual([200, 53]);
    expect(calls.every((c) => c.Filters?.[0]?.Name === 'instance-id' && c.InstanceIds === undefined)).toBe(
      true,
    );
  });

  it('keeps describing a terminated instance while EC2 does, then not', async () => {
    const { fake, provider } = setup();
    const { resourceId } = await provider.launch(spec());
    await provider.terminate(resourceId);
    expect((await provider.describe(resourceId))?.state).toBe('shutting-down');
    await fake.advance(10_000);
    const gone = await provider.describe(resourceId);
    expect(gone).toMatchObject({ state: 'terminated', backingNodeId: 'bn-1', poolKey: POOL_KEY });
    expect(gone?.host).toBeUndefined();
    await fake.advance(60 * 60_000);
    expect(await provider.describe(resourceId)).toBeUndefined();
  });
});

describe('list', () => {
  it('lists our live instances across pages with the tag and state filters', async () => {
    const { fake, provider } = setup({ fake: { pageSize: 2 } });
    const ids: string[] = [];
    for (const bn of ['bn-1', 'bn-2', 'bn-3', 'bn-4']) ids.push((await provider.launch(spec(bn))).resourceId);
    await fake.advance(30_000);
    await fake.client.send(
      new RunInstancesCommand({
        MinCount: 1,
        MaxCount: 1,
        ImageId: 'ami-1',
        InstanceType: 'm7i.large',
        SubnetId: 'subnet-1',
        TagSpecifications: [{ ResourceType: 'instance', Tags: [{ Key: TAG_POOL, Value: 'another-stack' }] }],
      }),
    );
    await provider.terminate(ids[0] ?? '');
    await fake.advance(10_000); // ids[0] terminated
    await provider.terminate(ids[1] ?? ''); // ids[1] shutting-down

    fake.resetCalls();
    const listed = await provider.list();
    expect(listed.map((r) => [r.resourceId, r.state])).toEqual([
      [ids[1], 'shutting-down'],
      [ids[2], 'running'],
      [ids[3], 'running'],
    ]);
    const inputs = fake.inputs('DescribeInstances');
    expect(inputs).toHaveLength(2);
    expect(inputs[0]).toEqual({
      Filters: [
        { Name: `tag:${TAG_POOL}`, Values: [POOL_ID] },
        {
          Name: 'instance-state-name',
          Values: ['pending', 'running', 'stopping', 'stopped', 'shutting-down'],
        },
      ],
      MaxResults: 1000,
    });
    expect(inputs[1]).toEqual({ ...inputs[0], NextToken: '2' });
  });

  it('asks for pages of listPageSize (EC2 accepts 5 to 1000)', async () => {
    const { fake, provider } = setup({ provider: { listPageSize: 5 } });
    for (let i = 1; i <= 6; i++) await provider.launch(spec(`bn-${i}`));
    fake.resetCalls();
    expect(await provider.list()).toHaveLength(6);
    const inputs = fake.inputs('DescribeInstances');
    expect(inputs.map((i) => [i.MaxResults, i.NextToken])).toEqual([
      [5, undefined],
      [5, '5'],
    ]);
    for (const listPageSize of [4, 1001, 2.5]) {
      expect(() => setup({ provider: { listPageSize } })).toThrow(
        `Ec2Provider: listPageSize must be an integer from 5 to 1000 (EC2's MaxResults), not ${listPageSize}`,
      );
    }
  });

  it('restarts the listing after a throttled page', async () => {
    const { fake, provider, sleeps } = setup({ fake: { pageSize: 1 } });
    await provider.launch(spec('bn-1'));
    await provider.launch(spec('bn-2'));
    fake.resetCalls();
    fake.throttle(1, { commands: ['DescribeInstances'], skip: 1 }); // the second page
    expect((await provider.list()).map((r) => r.backingNodeId)).toEqual(['bn-1', 'bn-2']);
    expect(sleeps).toEqual([750]);
    const tokens = fake.inputs('DescribeInstances').map((input) => input.NextToken);
    expect(tokens).toEqual([undefined, '1', undefined, '1']);
  });
});

describe('terminate', () => {
  it('terminates in batches of 1000, skipping ids EC2 reports gone and ids that are not instances', async () => {
    const { fake, provider } = setup();
    const live = [
      (await provider.launch(spec('bn-1'))).resourceId,
      (await provider.launch(spec('bn-2'))).resourceId,
    ];
    const unknown = Array.from(
      { length: 1999 },
      (_, i) => `i-${(0xf0000 + i).toString(16).padStart(17, '0')}`,
    );
    await provider.terminateMany([
      ...unknown.slice(0, 999),
      live[0] ?? '',
      'local-abc',
      ...unknown.slice(999),
      live[1] ?? '',
      live[0] ?? '',
    ]);

    const sizes = fake.mock
      .commandCalls(TerminateInstancesCommand)
      .map((c) => c.args[0].input.InstanceIds?.length);
    // Batch 1: 999 unknown + live[0] -> NotFound naming the 999 -> live[0] alone.
    // Batch 2: 1000 unknown -> NotFound naming all -> done. Batch 3: live[1].
    expect(sizes).toEqual([1000, 1, 1000, 1]);
    expect(fake.live()).toHaveLength(0);
    expect(live.map((id) => fake.instance(id)?.state)).toEqual(['shutting-down', 'shutting-down']);
  });

  it('is idempotent: terminating a terminating, terminated or forgotten instance succeeds', async () => {
    const { fake, provider } = setup();
    const { resourceId } = await provider.launch(spec());
    await provider.terminate(resourceId);
    await provider.terminate(resourceId);
    await fake.advance(10_000);
    await provider.terminate(resourceId);
    await fake.advance(60 * 60_000);
    await provider.terminate(resourceId);
    await provider.terminate('i-0123456789abcdef0');
    await provider.terminateMany([]);
    expect(fake.mock.commandCalls(TerminateInstancesCommand)).toHaveLength(5);
  });

  it('falls back to one id at a time when EC2 does not say which ids are gone', async () => {
    const { fake, provider } = setup();
    const a = (await provider.launch(spec('bn-1'))).resourceId;
    const b = (await provider.launch(spec('bn-2'))).resourceId;
    fake.failCalls(() => ec2Error('InvalidInstanceID.NotFound', 'gone'), {
      commands: ['TerminateInstances'],
    });
    await provider.terminateMany([a, b]);
    const inputs = fake.mock.commandCalls(TerminateInstancesCommand).map((c) => c.args[0].input.InstanceIds);
    expect(inputs).toEqual([[a, b], [a], [b]]);
  });

  it('reports other errors and retries throttling', async () => {
    const { fake, provider, sleeps } = setup();
    const { resourceId } = await provider.launch(spec());
    fake.throttle(1, { commands: ['TerminateInstances'] });
    await provider.terminate(resourceId);
    expect(sleeps).toEqual([750]);
    fake.failCalls(() => ec2Error('UnauthorizedOperation', 'not allowed'), {
      commands: ['TerminateInstances'],
    });
    await expect(provider.terminate(resourceId)).rejects.toThrow(
      'TerminateInstances failed: UnauthorizedOperation: not allowed',
    );
  });
});

describe('the fake EC2', () => {
  it('starts instances pending, runs them after the boot delay and emits state-change events', async () => {
    const received: StateChangeEvent[] = [];
    const { fake, provider } = setup({
      fake: { bootDelayMs: 45_000, onEvent: (event) => void received.push(event) },
    });
    const { resourceId } = await provider.launch(spec());
    await fake.advance(44_999);
    expect(fake.instance(resourceId)?.state).toBe('pending');
    await fake.advance(1);
    expect(fake.instance(resourceId)?.state).toBe('running');
    expect(received.map((e) => e.detail)).toEqual([
      { 'instance-id': resourceId, state: 'pending' },
      { 'instance-id': resourceId, state: 'running' },
    ]);
    const running = received[1];
    expect(StateChangeEvent.parse(running)).toEqual(running);
    expect(running).toMatchObject({
      'detail-type': 'EC2 Instance State-change Notification',
      source: EC2_EVENT_SOURCE,
      region: 'eu-west-1',
      resources: [resourceId],
      time: '2026-01-01T00:00:45.000Z',
    });
  });

  it('kills an instance later, keeps it describable, and reports both changes', async () => {
    const { fake, provider } = setup({ fake: { bootDelayMs: 0 } });
    const { resourceId } = await provider.launch(spec());
    fake.kill(resourceId, { afterMs: 60_000 });
    await fake.advance(59_999);
    expect((await provider.describe(resourceId))?.state).toBe('running');
    await fake.advance(1);
    expect((await provider.describe(resourceId))?.state).toBe('shutting-down');
    await fake.advance(10_000);
    expect((await provider.describe(resourceId))?.state).toBe('terminated');
    expect(fake.events.map((e) => e.detail.state)).toEqual([
      'pending',
      'running',
      'shutting-down',
      'terminated',
    ]);
    expect(fake.instance(resourceId)?.stateReason).toMatch(/^Server.SpotInstanceTermination/);
  });

  it('honours ClientToken idempotency like EC2, even for a terminated instance', async () => {
    const { fake } = setup();
    const input: RunInstancesCommandInput = {
      MinCount: 1,
      MaxCount: 1,
      ImageId: 'ami-1',
      InstanceType: 'm7i.large',
      SubnetId: 'subnet-1',
      ClientToken: 'token-1',
    };
    const first = await fake.client.send(new RunInstancesCommand(input));
    const id = first.Instances?.[0]?.InstanceId ?? '';
    fake.kill(id);
    const again = await fake.client.send(new RunInstancesCommand(input));
    expect(again.Instances?.[0]).toMatchObject({ InstanceId: id, State: { Name: 'shutting-down' } });
    await expect(
      fake.client.send(new RunInstancesCommand({ ...input, InstanceType: 'm6i.large' })),
    ).rejects.toMatchObject({ name: 'IdempotentParameterMismatch' });
    expect(fake.instances).toHaveLength(1);
  });

  it('delivers events one at a time, in order, and keeps going when the handler throws', async () => {
    const seen: string[] = [];
    const { fake, provider } = setup({
      fake: {
        bootDelayMs: 5_000,
        onEvent: async (event) => {
          await new Promise((resolve) => setTimeout(resolve, 1));
          seen.push(event.detail.state);
          if (event.detail.state === 'pending') throw new Error('handler failed');
        },
      },
    });
    const { resourceId } = await provider.launch(spec());
    await fake.advance(5_000);
    await provider.terminate(resourceId);
    await fake.advance(10_000);
    expect(seen).toEqual(['pending', 'running', 'shutting-down', 'terminated']);
    expect(fake.eventErrors).toHaveLength(1);
  });
});

describe('reportedHostKeys: the host keys cloud-init printed to the console', () => {
  it('has none while the instance boots, then the keys of the block in the base64 console output', async () => {
    const { fake, provider } = setup({ fake: { bootDelayMs: 30_000, consoleDelayMs: 60_000 } });
    const { resourceId } = await provider.launch(spec());
    expect(await provider.reportedHostKeys(resourceId)).toEqual({ kind: 'none' }); // pending: nothing posted
    await fake.advance(30_000 + 59_000);
    expect(await provider.reportedHostKeys(resourceId)).toEqual({ kind: 'none' }); // kernel log only
    await fake.advance(1_000);
    expect(await provider.reportedHostKeys(resourceId)).toEqual({
      kind: 'keys',
      keys: fake.hostKeysOf(resourceId),
    });
    // The exact request: the instance, and the console as it is now (Latest).
    const calls = fake.mock.commandCalls(GetConsoleOutputCommand).map((c) => c.args[0].input);
    expect(calls.at(-1)).toEqual({ InstanceId: resourceId, Latest: true });
  });

  it('passes on a block it cannot trust with the reason, and retries throttling within its budget', async () => {
    const { fake, provider, sleeps } = setup({ fake: { bootDelayMs: 0 } });
    const { resourceId } = await provider.launch(spec());
    const garbled =
      '-----BEGIN SSH HOST KEY KEYS-----\r\nssh-ed25519 AAAAC3Nz\r\n-----END SSH HOST KEY KEYS-----\r\n';
    fake.mock
      .on(GetConsoleOutputCommand)
      .rejectsOnce(ec2Error('RequestLimitExceeded', 'Request limit exceeded.'))
      .resolves({ InstanceId: resourceId, Output: Buffer.from(garbled).toString('base64') });
    expect(await provider.reportedHostKeys(resourceId)).toEqual({
      kind: 'invalid',
      reason: 'a ssh-ed25519 line of the host-key block holds a key that is not a ssh-ed25519 public key',
    });
    expect(sleeps).toEqual([750]);
  });
});

describe('reportedHostKeys: Latest, and asking again without it (issue 40, defect 4)', () => {
  const calls = (fake: FakeEc2) =>
    fake.mock.commandCalls(GetConsoleOutputCommand).map((c) => c.args[0].input.Latest ?? '-');

  it('asks again without Latest only when EC2 refuses Latest (an instance not built on Nitro)', async () => {
    const { fake, provider } = setup({ fake: { bootDelayMs: 0 } });
    const { resourceId } = await provider.launch(spec());
    fake.mock.on(GetConsoleOutputCommand).callsFake((input: { Latest?: boolean }) => {
      if (input.Latest) throw ec2Error('UnsupportedOperation', 'The requested operation is not supported.');
      return { InstanceId: resourceId };
    });
    expect(await provider.reportedHostKeys(resourceId)).toEqual({ kind: 'none' });
    expect(calls(fake)).toEqual([true, '-']);
  });

  it('does not ask again for any other refusal: a missing permission fails with one call', async () => {
    for (const code of ['UnauthorizedOperation', 'AuthFailure', 'IncorrectState', 'OptInRequired']) {
      const { fake, provider } = setup({ fake: { bootDelayMs: 0 } });
      const { resourceId } = await provider.launch(spec());
      fake.mock.on(GetConsoleOutputCommand).rejects(ec2Error(code, `no: ${code}`));
      await expect(provider.reportedHostKeys(resourceId), code).rejects.toThrow(
        `GetConsoleOutput ${resourceId} failed: ${code}: no: ${code}`,
      );
      expect(calls(fake), code).toEqual([true]);
    }
  });
});
