import type { z } from 'zod';
import type { PathIssue, PathSegment } from '../fields/paths.ts';
import type { FunctionsNetwork } from './aws/networkRules.ts';

/**
 * A backing driver as the rest of the pool sees it: everything a new kind of backing node (a cloud, a
 * hypervisor) brings besides its provider adapter (core/provider.ts BackingProvider). Each driver's module
 * (`shared/providers/<driver>/driver.ts`) exports one, and shared/providers/drivers.ts lists them: the
 * configuration's schema, rules and resolution, and the routing of resources, take it from there.
 */
export interface BackingDriver {
  /**
   * The driver's provider section (`providers[]` with `driver: <name>`): a strict object whose `driver`
   * is the literal name, with `name` and `pools` (each with `name`, `max-servers`, `labels`, each with
   * `name`).
   */
  readonly schema: z.ZodObject;
  /**
   * Rules across the section's fields, on the raw data (what the schema cannot say), with YAML paths.
   * `slotsOf` is the most slots any metastatic label asks of one of its backing labels.
   */
  readonly rules?: (
    provider: Record<string, unknown>,
    path: readonly PathSegment[],
    slotsOf: (backingLabel: string) => number,
  ) => PathIssue[];
  /**
   * Rules over the whole configuration that may depend on where the functions run (`network`: given by
   * synth and `metastatic validate --functions-in-vpc`; unset, the file alone): errors, and warnings
   * that become the resolved configuration's notices.
   */
  readonly deploymentRules?: (
    data: unknown,
    network: FunctionsNetwork | undefined,
  ) => { readonly errors: PathIssue[]; readonly warnings: PathIssue[] };
  /** What one backing node of a label gives and costs, where the driver knows it from the label's options. */
  readonly machine?: (options: Readonly<Record<string, unknown>>) => Machine;
  /** Whether a provider resource id is one of this driver's (events and reconciliation are routed by it). */
  readonly ownsResource: (resourceId: string) => boolean;
  /** Its backing nodes run only in the embedded pool (`metastatic dev`), never from deployed functions. */
  readonly embeddedOnly: boolean;
}

/** A backing driver's provider section as the schema gives it: what every driver's has, and its own keys. */
export interface BackingProviderSection {
  readonly name: string;
  readonly driver: string;
  readonly pools: readonly BackingPoolSection[];
  readonly [key: string]: unknown;
}

export interface BackingPoolSection {
  readonly name: string;
  readonly 'max-servers'?: number | undefined;
  readonly labels: readonly { readonly name: string; readonly [key: string]: unknown }[];
  readonly [key: string]: unknown;
}

/** What one backing node gives and costs, each unknown when undefined. */
export interface Machine {
  readonly vcpus?: number | undefined;
  readonly memoryMiB?: number | undefined;
  readonly hourlyCost?: number | undefined;
}
