import type { Instance } from '@aws-sdk/client-ec2';
import type { BackingResource, ResourceState } from '../../core/provider.ts';
import { TAG_BACKING_NODE_ID, TAG_BACKING_POOL, TAG_LABEL, TAG_POOL, tagMap } from './runInstancesRequest.ts';
import type { AwsLabelSettings } from './settings.ts';

/** What the provider reports of an EC2 instance: a backing resource, for instances of this pool only. */

/** Instance states list() returns (terminated ones are left out). */
export const LISTED_STATES: readonly ResourceState[] = [
  'pending',
  'running',
  'stopping',
  'stopped',
  'shutting-down',
];
const RESOURCE_STATES: ReadonlySet<string> = new Set<ResourceState>([...LISTED_STATES, 'terminated']);

/**
 * An instance of this deployment (tagged with its pool id) as a backing resource: its state, the host to
 * connect to (public IP with public-ipv4, else private), its port, and attributes for its nodes.
 */
export function resourceOf(
  instance: Instance,
  poolId: string,
  settingsByPool: ReadonlyMap<string, ReadonlyMap<string, AwsLabelSettings>>,
): BackingResource | undefined {
  const tags = tagMap(instance.Tags);
  const instanceId = instance.InstanceId;
  if (tags[TAG_POOL] !== poolId || !instanceId) return undefined;
  const stateName = instance.State?.Name ?? 'pending';
  const state: ResourceState = RESOURCE_STATES.has(stateName) ? (stateName as ResourceState) : 'pending';
  const poolKey = tags[TAG_BACKING_POOL] ?? '';
  const label = tags[TAG_LABEL] ?? '';
  const settings = settingsByPool.get(poolKey)?.get(label);
  const privateIp = instance.PrivateIpAddress;
  const publicIp = instance.PublicIpAddress;
  const host = settings?.publicIpv4 ? publicIp : privateIp;
  const region = settings?.region ?? instance.Placement?.AvailabilityZone?.replace(/[a-z]$/, '') ?? 'unknown';
  return {
    resourceId: instanceId,
    backingNodeId: tags[TAG_BACKING_NODE_ID] ?? '',
    poolKey,
    state,
    ...(host !== undefined && host !== '' ? { host } : {}),
    port: settings?.connectionPort ?? 22,
    ...(instance.LaunchTime ? { launchedAt: new Date(instance.LaunchTime).getTime() } : {}),
    attributes: {
      provider: 'aws',
      region,
      instanceId,
      instanceType: instance.InstanceType,
      availabilityZone: instance.Placement?.AvailabilityZone,
      imageId: instance.ImageId,
      privateIp,
      ...(publicIp !== undefined ? { publicIp } : {}),
      spot: instance.InstanceLifecycle === 'spot',
      label,
    },
  };
}
