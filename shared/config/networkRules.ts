import { asRecord, asString, type PathIssue, type PathSegment } from './paths.ts';

/**
 * Rules that depend on where the configuration is deployed, not on the file alone: on AWS the functions
 * open connections to the instances, which they can do only from inside the instances' VPC or to a
 * public address. The file does not say where the functions run (the stack does: MetastaticPool's `vpc`,
 * bin/cdk.ts's `-c vpcId=… -c functionSubnetIds=…`), so these rules run only when the caller says:
 * synth (lib/metastaticPool.ts) and `metastatic validate` (cli/commands/config.ts, `--functions-in-vpc`).
 *
 * Of the settings that reach the instances from the functions, only host-key-checking needs the path:
 * a scan that cannot connect fails the backing node, so every launch ends in a terminated instance and,
 * after launch-retries of them, a failed request (issue 22, defect 7: three c7g.4xlarge launched for
 * nothing). The port check before ready (connection-port within boot-timeout) is skipped where it cannot
 * connect (shared/runtime/awsContext.ts): a backing node is then ready when EC2 reports it running.
 */
export interface FunctionsNetwork {
  /** The functions run in the instances' VPC, so they reach private addresses. */
  readonly functionsInVpc: boolean;
}

/** What the fix is, in the error: the two ways to give the functions a path, or no scan. */
const FIX =
  "put the functions in the instances' VPC (cdk synth -c vpcId=… -c functionSubnetIds=…, MetastaticPool's " +
  '`vpc`; check with `metastatic validate --functions-in-vpc`), give the aws pool public-ipv4: true (the ' +
  "instances' security group must then admit connection-port from Lambda's addresses), or set " +
  'host-key-checking: false';

/** An aws pool offering a backing label: its key and whether its instances have public addresses. */
interface AwsOffer {
  readonly poolKey: string;
  readonly publicIpv4: boolean;
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
  const issues: PathIssue[] = [];
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
      const offer: AwsOffer | 'local' =
        driver === 'local'
          ? 'local'
          : {
              poolKey: `${asString(provider.name) ?? '?'}/${asString(pool.name) ?? '?'}`,
              publicIpv4: pool['public-ipv4'] === true,
            };
      for (const rawLabel of pool.labels) {
        const name = asString(asRecord(rawLabel)?.name);
        if (name !== undefined && !offers.has(name)) offers.set(name, offer);
      }
    }
  }
  return offers;
}
