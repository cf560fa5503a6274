import {
  DescribeImagesCommand,
  DescribeInstancesCommand,
  DescribeLaunchTemplateVersionsCommand,
  type EC2Client,
} from '@aws-sdk/client-ec2';
import type { Clock } from '../../core/clock.ts';
import { type CallPolicy, ec2CallOr, type RetryBudget } from './ec2Calls.ts';
import {
  DEFAULT_ROOT_DEVICE,
  describeTemplate,
  TAG_BACKING_NODE_ID,
  TAG_POOL,
  type TemplateNetwork,
} from './runInstancesRequest.ts';
import type { AwsImage } from './settings.ts';

/** How long what a `$Default`/`$Latest` launch template version says is trusted (a numbered one: always). */
export const TEMPLATE_CACHE_MS = 5 * 60_000;

/**
 * What a launch needs to know from EC2 before its RunInstances, each read once and remembered: an
 * image's root device (never changes for an AMI), a launch template version's network (numbered versions
 * for good, $Default/$Latest for TEMPLATE_CACHE_MS), and whether a backing node already has an instance.
 */
export class Ec2Lookups {
  /** imageId -> root device name. */
  private readonly rootDevices = new Map<string, string>();
  /** What launch template versions say about the network, until when. */
  private readonly templates = new Map<
    string,
    { readonly network: TemplateNetwork; readonly until: number }
  >();

  constructor(
    private readonly client: EC2Client,
    private readonly clock: Clock,
    private readonly policy: CallPolicy,
  ) {}

  /**
   * What the label's launch template version says about the network, and its user data
   * (DescribeLaunchTemplateVersions).
   */
  async templateNetwork(
    image: Extract<AwsImage, { kind: 'launch-template' }>,
    budget: RetryBudget,
  ): Promise<TemplateNetwork> {
    const version = image.version ?? '$Default';
    const key = `${image.id ?? ''}\n${image.name ?? ''}\n${version}`;
    const now = this.clock.now();
    const known = this.templates.get(key);
    if (known && known.until > now) return known.network;
    const describe = describeTemplate(image);
    const out = await ec2CallOr(
      this.policy,
      'DescribeLaunchTemplateVersions',
      budget,
      () =>
        this.client.send(
          new DescribeLaunchTemplateVersionsCommand({
            ...(image.id !== undefined ? { LaunchTemplateId: image.id } : { LaunchTemplateName: image.name }),
            Versions: [version],
          }),
        ),
      `DescribeLaunchTemplateVersions (launch template ${describe})`,
    );
    const data = out.LaunchTemplateVersions?.[0]?.LaunchTemplateData;
    if (!data) throw new Error(`launch template ${describe} does not exist`);
    const network: TemplateNetwork = {
      describe,
      interfaces: data.NetworkInterfaces ?? [],
      instanceGroups: [...(data.SecurityGroupIds ?? []), ...(data.SecurityGroups ?? [])],
      ...(data.UserData ? { userData: Buffer.from(data.UserData, 'base64').toString('utf8') } : {}),
    };
    this.templates.set(key, {
      network,
      until: /^\d+$/.test(version) ? Number.POSITIVE_INFINITY : now + TEMPLATE_CACHE_MS,
    });
    return network;
  }

  /** The image's root device name (for the encrypted root volume mapping). */
  async rootDevice(imageId: string, budget: RetryBudget): Promise<string> {
    const known = this.rootDevices.get(imageId);
    if (known !== undefined) return known;
    const out = await ec2CallOr(
      this.policy,
      'DescribeImages',
      budget,
      () => this.client.send(new DescribeImagesCommand({ ImageIds: [imageId] })),
      `DescribeImages ${imageId}`,
    );
    const image = out.Images?.find((i) => i.ImageId === imageId) ?? out.Images?.[0];
    if (!image) throw new Error(`image ${imageId} does not exist (or is not shared with this account)`);
    const device = image.RootDeviceName ?? DEFAULT_ROOT_DEVICE;
    this.rootDevices.set(imageId, device);
    return device;
  }

  /** A pending or running instance of this pool already tagged with the backing node id, if any. */
  async findLive(poolId: string, backingNodeId: string, budget: RetryBudget): Promise<string | undefined> {
    const out = await ec2CallOr(
      this.policy,
      'DescribeInstances',
      budget,
      () =>
        this.client.send(
          new DescribeInstancesCommand({
            Filters: [
              { Name: `tag:${TAG_POOL}`, Values: [poolId] },
              { Name: `tag:${TAG_BACKING_NODE_ID}`, Values: [backingNodeId] },
              { Name: 'instance-state-name', Values: ['pending', 'running'] },
            ],
          }),
        ),
      `DescribeInstances (backing node ${backingNodeId})`,
    );
    return (out.Reservations ?? []).flatMap((r) => r.Instances ?? []).find((i) => i.InstanceId)?.InstanceId;
  }
}
