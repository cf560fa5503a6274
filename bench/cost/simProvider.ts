/**
 * An in-process backing provider for the cost simulator: no processes, no cloud. A launch records a
 * resource that turns `running` after the boot time on the virtual clock; the simulator is told (via
 * `schedule`) when, and then feeds the fulfil use case, as the provider's state event would. Terminate
 * ends billing at once. Billing is per second from launch to terminate, kept here as the truth.
 */
import type { Clock } from '../../shared/core/clock.ts';
import type {
  BackingProvider,
  BackingResource,
  LaunchSpec,
  ProviderRegistry,
  ResourceState,
} from '../../shared/core/provider.ts';

export const SIM_RESOURCE_PREFIX = 'sim-';

export interface SimResource {
  readonly resourceId: string;
  readonly backingNodeId: string;
  readonly poolKey: string;
  readonly label: string;
  state: ResourceState;
  /** Virtual epoch ms. */
  readonly launchedAt: number;
  runningAt?: number;
  terminatedAt?: number;
}

export interface SimProviderOptions {
  readonly clock: Clock;
  /** Milliseconds from launch to `running`. */
  readonly bootMs: number;
  /** Called at launch: the simulator runs `boot` at the given virtual instant. */
  readonly schedule: (atMs: number, resourceId: string) => void;
}

export class SimProvider implements BackingProvider {
  private readonly resources = new Map<string, SimResource>();
  /** (backingNodeId, attempt) -> resource id: the idempotency token of a launch. */
  private readonly tokens = new Map<string, string>();
  private seq = 0;

  constructor(private readonly options: SimProviderOptions) {}

  async launch(spec: LaunchSpec): Promise<{ resourceId: string }> {
    const token = `${spec.backingNodeId}#${spec.attempt}`;
    const known = this.tokens.get(token);
    if (known) return { resourceId: known };
    const resourceId = `${SIM_RESOURCE_PREFIX}${String(++this.seq).padStart(6, '0')}`;
    const now = this.options.clock.now();
    this.resources.set(resourceId, {
      resourceId,
      backingNodeId: spec.backingNodeId,
      poolKey: spec.poolKey,
      label: spec.label,
      state: 'pending',
      launchedAt: now,
    });
    this.tokens.set(token, resourceId);
    this.options.schedule(now + this.options.bootMs, resourceId);
    return { resourceId };
  }

  /** The boot finished: the resource runs (unless it was terminated meanwhile). */
  boot(resourceId: string): BackingResource | undefined {
    const r = this.resources.get(resourceId);
    if (r?.state !== 'pending') return undefined;
    r.state = 'running';
    r.runningAt = this.options.clock.now();
    return this.view(r);
  }

  async describe(resourceId: string): Promise<BackingResource | undefined> {
    const r = this.resources.get(resourceId);
    return r ? this.view(r) : undefined;
  }

  async terminate(resourceId: string): Promise<void> {
    const r = this.resources.get(resourceId);
    if (!r || r.state === 'terminated') return;
    r.state = 'terminated';
    r.terminatedAt = this.options.clock.now();
  }

  /** Live resources only (a terminated one is gone; describe still answers for it). */
  async list(): Promise<BackingResource[]> {
    return [...this.resources.values()].filter((r) => r.state !== 'terminated').map((r) => this.view(r));
  }

  /** Every resource ever launched, for billing. */
  all(): readonly SimResource[] {
    return [...this.resources.values()];
  }

  private view(r: SimResource): BackingResource {
    return {
      resourceId: r.resourceId,
      backingNodeId: r.backingNodeId,
      poolKey: r.poolKey,
      state: r.state,
      launchedAt: r.launchedAt,
      ...(r.state === 'running' ? { host: `sim-host-${r.resourceId}`, port: 22 } : {}),
      attributes: { provider: 'sim', label: r.label },
    };
  }
}

/** Every backing pool of the configuration is served by the one simulated provider. */
export function simRegistry(provider: SimProvider, backingPoolKeys: readonly string[]): ProviderRegistry {
  const keys = new Set(backingPoolKeys);
  return {
    forPool(poolKey) {
      if (!keys.has(poolKey)) throw new Error(`unknown backing pool ${poolKey}`);
      return provider;
    },
    forResource: (resourceId) => (resourceId.startsWith(SIM_RESOURCE_PREFIX) ? provider : undefined),
  };
}
