import { asRecord, asString, type PathIssue, type PathSegment } from '../../fields/paths.ts';

/**
 * Rules that depend on where the configuration is deployed, not on the file alone: on AWS the functions
 * open connections to the instances, which they can do only from inside the instances' VPC or to a
 * public address. The file does not say where the functions run (the stack does: MetastaticPool's `vpc`,
 * bin/cdk.ts's `-c vpcId=… -c functionSubnetIds=…`), so these rules run only when the caller says:
 * synth (lib/metastaticPool.ts) and `metastatic validate` (cli/commands/config.ts, `--functions-in-vpc`).
 *
 * Of the settings that reach the instances from the functions, only the SSH scans need the path: a scan
 * that cannot connect fails the backing node, so every launch ends in a terminated instance and, after
 * launch-retries of them, a failed request, every instance launched for nothing. So an aws
 * `host-keys: scan` needs the path, and so does host-key-checking unless the backing label's host keys
 * come from the console output (`host-keys: console`, the default without a path): those keys then stand
 * in for the scan at each allocation. The port check before ready (connection-port within boot-timeout)
 * is skipped where it cannot connect (shared/runtime/awsContext.ts): a backing node is then ready when
 * EC2 reports it running.
 */
export interface FunctionsNetwork {
  /** The functions run in the instances' VPC, so they reach private addresses. */
  readonly functionsInVpc: boolean;
}

/** What the fix is, in the error: the two ways to give the functions a path, or no scan. */
const FIX =
  "put the functions in the instances' VPC (cdk synth -c vpcId=… -c functionSubnetIds=…, MetastaticPool's " +
  '`vpc`; check with `metastatic validate --functions-in-vpc`), give the aws pool public-ipv4: true (the ' +
  "instances' security group must then admit connection-port from Lambda's addresses), take the keys from " +
  'the console output instead (host-keys: console on the aws pool or label, or unset), or set host-key-checking: false';

const FIX_SCAN =
  "put the functions in the instances' VPC (cdk synth -c vpcId=… -c functionSubnetIds=…, MetastaticPool's " +
  '`vpc`; check with `metastatic validate --functions-in-vpc`), give the pool public-ipv4: true, or use ' +
  'host-keys: console (or leave it unset: console is the default without a network path)';

/** An aws pool offering a backing label: its key and whether its instances have public addresses. */
interface AwsOffer {
  readonly poolKey: string;
  readonly publicIpv4: boolean;
  /** The label's host-keys, else the pool's; unset: console here (no network path). */
  readonly hostKeys: unknown;
}

/**
 * host-key-checking on a label backed by an aws pool whose instances the functions cannot reach: an
 * error at the key that turns it on (the label's, else the pool's), naming the labels and the fix.
 * Checked on the raw data, like rules.ts: what the schema rejects is left to the schema.
 */
export function checkFunctionsNetwork(data: unknown, network: FunctionsNetwork): PathIssue[] {
  if (network.functionsInVpc) return [];
  const providers = asRecord(data)?.providers;
  if (!Array.isArray(providers)) return [];
  const backing = backingOffers(providers);
  const issues: PathIssue[] = scansWithoutPath(providers);
  providers.forEach((rawProvider, pi) => {
    const provider = asRecord(rawProvider);
    if (provider?.driver !== 'metastatic' || !Array.isArray(provider.pools)) return;
    provider.pools.forEach((rawPool, qi) => {
      const pool = asRecord(rawPool);
      if (!pool || !Array.isArray(pool.labels)) return;
      const poolPath: PathSegment[] = ['providers', pi, 'pools', qi];
      // Labels that take the pool's value: one error at the pool's key, naming them.
      const inheriting: string[] = [];
      let unreachable: AwsOffer | undefined;
      pool.labels.forEach((rawLabel, li) => {
        const label = asRecord(rawLabel);
        const backingLabel = asString(label?.['backing-label']);
        const offer = backingLabel === undefined ? undefined : backing.get(backingLabel);
        if (!label || !offer || offer === 'local' || offer.publicIpv4) return;
        if (offer.hostKeys === undefined || offer.hostKeys === 'console') return; // the console's keys
        const own = label['host-key-checking'];
        if (own === true) {
          issues.push({
            path: [...poolPath, 'labels', li, 'host-key-checking'],
            message: unreachableMessage(offer, `backing-label "${backingLabel}"`),
          });
        } else if (own === undefined && pool['host-key-checking'] === true) {
          inheriting.push(`"${asString(label.name) ?? `labels[${li}]`}"`);
          unreachable ??= offer;
        }
      });
      if (unreachable && inheriting.length > 0) {
        issues.push({
          path: [...poolPath, 'host-key-checking'],
          message: unreachableMessage(
            unreachable,
            `${inheriting.length === 1 ? 'label' : 'labels'} ${inheriting.join(', ')}, which take this value`,
          ),
        });
      }
    });
  });
  return issues;
}

function unreachableMessage(offer: AwsOffer, whose: string): string {
  return (
    `host-key-checking: the functions scan the host keys of ${offer.poolKey}'s instances (${whose}), but ` +
    `they run outside a VPC and the pool gives its instances no public address: ${FIX}`
  );
}

/** `host-keys: scan` on an aws pool or label whose instances have no public address: an error at the key. */
function scansWithoutPath(providers: readonly unknown[]): PathIssue[] {
  const issues: PathIssue[] = [];
  providers.forEach((rawProvider, pi) => {
    const provider = asRecord(rawProvider);
    if (provider?.driver !== 'aws' || !Array.isArray(provider.pools)) return;
    provider.pools.forEach((rawPool, qi) => {
      const pool = asRecord(rawPool);
      if (!pool || pool['public-ipv4'] === true) return;
      const poolKey = `${asString(provider.name) ?? '?'}/${asString(pool.name) ?? '?'}`;
      const message = `host-keys: scan: the functions scan the host keys of ${poolKey}'s instances, but they run outside a VPC and the pool gives its instances no public address: ${FIX_SCAN}`;
      const poolPath: PathSegment[] = ['providers', pi, 'pools', qi];
      if (pool['host-keys'] === 'scan') issues.push({ path: [...poolPath, 'host-keys'], message });
      if (!Array.isArray(pool.labels)) return;
      pool.labels.forEach((rawLabel, li) => {
        if (asRecord(rawLabel)?.['host-keys'] === 'scan') {
          issues.push({ path: [...poolPath, 'labels', li, 'host-keys'], message });
        }
      });
    });
  });
  return issues;
}

/**
 * Backing labels by name: the first pool offering each in file order (as resolve.ts picks), aws with its
 * public-ipv4, or 'local' (local processes: the embedded pool reaches them on its host).
 */
function backingOffers(providers: readonly unknown[]): Map<string, AwsOffer | 'local'> {
  const offers = new Map<string, AwsOffer | 'local'>();
  for (const rawProvider of providers) {
    const provider = asRecord(rawProvider);
    const driver = provider?.driver;
    if ((driver !== 'aws' && driver !== 'local') || !Array.isArray(provider?.pools)) continue;
    for (const rawPool of provider.pools) {
      const pool = asRecord(rawPool);
      if (!pool || !Array.isArray(pool.labels)) continue;
      for (const rawLabel of pool.labels) {
        const label = asRecord(rawLabel);
        const name = asString(label?.name);
        if (name === undefined || offers.has(name)) continue;
        offers.set(
          name,
          driver === 'local'
            ? 'local'
            : {
                poolKey: `${asString(provider.name) ?? '?'}/${asString(pool.name) ?? '?'}`,
                publicIpv4: pool['public-ipv4'] === true,
                hostKeys: label?.['host-keys'] ?? pool['host-keys'],
              },
        );
      }
    }
  }
  return offers;
}
