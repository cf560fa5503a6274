/**
 * The write load leases put on the table's hottest partition (issue 40, defect 1): every renewal moves its
 * request within its LEASE partition of the `free` index, which projects the whole item, so DynamoDB
 * bills the index a delete and a put of the item (an update that changes an index key), each one unit per
 * started KB. At 10,000 leased nodes (one each, as `metastatic run` holds them) renewed every third of
 * the default lease, the hottest partition takes its share of those renewals.
 *
 * Measured, not assumed: the item is a leased request as the store writes it (`requestItem`), of a node
 * placed as the pool places one (host keys and attributes included), sized as DynamoDB sizes items
 * (dynamoMeasures.ts, calibrated against DynamoDB Local); the partitions are those `leasePartition` gives
 * 10,000 request ids of the form a client makes (`newRequestId`). The figure before the partitions were
 * spread: all of them in one.
 */
import { marshall } from '@aws-sdk/util-dynamodb';
import { newRequestId, requestMessage } from '../client/messages.ts';
import { DEFAULT_RUN_LEASE } from '../client/options.ts';
import type { NodeRecord, RequestRecord } from '../shared/core/records.ts';
import { placedRequest, requestedRecord } from '../shared/core/request.ts';
import { itemSize } from '../shared/runtime/dynamoMeasures.ts';
import { LEASE_SHARDS, leasePartition, requestItem } from '../shared/store/table.ts';
import { round, table, yesNo } from './common.ts';

export const LEASES = {
  leasedNodes: 10_000,
  /** DynamoDB's write throughput on one partition, units per second. */
  partitionWriteUnitsPerSecond: 1_000,
  aim: 500,
} as const;

export interface LeaseFigures {
  readonly leasedNodes: number;
  readonly renewEverySeconds: number;
  readonly itemBytes: number;
  /** Index write units of one renewal: a delete and a put of the projected item. */
  readonly indexUnitsPerRenewal: number;
  readonly partitions: number;
  readonly hottestPartitionRequests: number;
  readonly hottestPartitionUnitsPerSecond: number;
  /** The same with every leased request in one partition (before issue 40). */
  readonly onePartitionUnitsPerSecond: number;
  readonly aimMet: boolean;
}

/** A node as the pool records one placed and ready: its host, user, host keys and attributes. */
function readyNode(requestId: string): NodeRecord {
  return {
    id: `${requestId}/0`,
    label: 'small-node',
    state: 'ready',
    backingNodeId: 'bn-0123456789abcdef0',
    slot: 3,
    host: '10.0.42.117',
    port: 22,
    username: 'slot3',
    hostKeys: [
      `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${'x'.repeat(43)}`,
      `ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBB${'x'.repeat(100)}`,
      `ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABgQ${'x'.repeat(512)}`,
    ],
    attributes: { zone: 'eu-west-1a', cores: 2, team: 'ci', provider: 'aws', instanceType: 'm7g.2xlarge' },
    readyAt: 1_800_000_000_000,
  } as NodeRecord;
}

export async function measureLeases(progress: (line: string) => void): Promise<LeaseFigures> {
  progress('leases: the hottest LEASE partition at 10,000 leased nodes');
  const now = 1_800_000_000_000;
  const id = newRequestId();
  const asked = requestedRecord(
    requestMessage({ id, labels: ['small-node'], lease: DEFAULT_RUN_LEASE }),
    now,
  );
  const placed: RequestRecord = {
    ...placedRequest({ ...asked, requestor: 'gitlab-runner-7' }, 'aws/main', [readyNode(id)], now),
    lease: DEFAULT_RUN_LEASE,
    leaseExpiresAt: now + DEFAULT_RUN_LEASE * 1000,
  };
  const item = requestItem(placed);
  if (typeof item.fpk !== 'string' || !item.fpk.startsWith('LEASE')) {
    throw new Error('leases: the request is not in a LEASE partition');
  }
  const itemBytes = itemSize(marshall(item, { removeUndefinedValues: true }));
  const indexUnitsPerRenewal = 2 * Math.ceil(itemBytes / 1024);
  const counts = new Map<string, number>();
  for (let i = 0; i < LEASES.leasedNodes; i++) {
    const p = leasePartition(newRequestId());
    counts.set(p, (counts.get(p) ?? 0) + 1);
  }
  const hottest = Math.max(...counts.values());
  const renewEverySeconds = DEFAULT_RUN_LEASE / 3;
  const perSecond = (requests: number) => round((requests / renewEverySeconds) * indexUnitsPerRenewal, 0);
  const hottestPartitionUnitsPerSecond = perSecond(hottest);
  return {
    leasedNodes: LEASES.leasedNodes,
    renewEverySeconds,
    itemBytes,
    indexUnitsPerRenewal,
    partitions: counts.size,
    hottestPartitionRequests: hottest,
    hottestPartitionUnitsPerSecond,
    onePartitionUnitsPerSecond: perSecond(LEASES.leasedNodes),
    aimMet: hottestPartitionUnitsPerSecond <= LEASES.aim,
  };
}

export function leasesReport(f: LeaseFigures): string {
  return [
    `Leases (issue 40): ${f.leasedNodes} leased nodes renewed every ${f.renewEverySeconds} s; a leased request`,
    `item of ${f.itemBytes} bytes, ${f.indexUnitsPerRenewal} index write units a renewal (a delete and a put)`,
    table(
      [
        [
          `${f.partitions} of ${LEASE_SHARDS}`,
          String(f.hottestPartitionRequests),
          String(f.hottestPartitionUnitsPerSecond),
        ],
        ['1 (before)', String(f.leasedNodes), String(f.onePartitionUnitsPerSecond)],
      ],
      ['LEASE partitions', 'requests in the hottest', 'its write units / s'],
    ),
  ].join('\n');
}

export function leasesRows(f: LeaseFigures) {
  return [
    {
      figure: `hottest partition write units per second at ${f.leasedNodes.toLocaleString('en')} leased nodes`,
      measured: `${f.hottestPartitionUnitsPerSecond} (of ${LEASES.partitionWriteUnitsPerSecond} a partition; one partition: ${f.onePartitionUnitsPerSecond})`,
      aim: `<= ${LEASES.aim}`,
      met: yesNo(f.aimMet),
    },
  ];
}
