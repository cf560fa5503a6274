/**
 * What an EC2 instance type gives (vCPUs, memory) and what it costs an hour on demand, for the common
 * general purpose, compute and memory families: a label backed by an aws pool gets its slot shape and
 * cost from here when it declares none (the slot is the instance divided by max-parallel-jobs).
 *
 * Sizes are facts of the type. Prices are AWS's on-demand list prices for Linux in us-east-1 (USD per
 * hour, as published in 2025): other regions, Spot and savings plans differ, so a pool that cares sets
 * `hourly-cost` on its backing label, which always wins. A type not listed here has no derived shape or
 * cost: set them on the labels (docs/configuration.md, Shapes).
 */

export interface InstanceTypeFacts {
  readonly vcpus: number;
  readonly memoryMiB: number;
  /** USD per hour, on demand, Linux, us-east-1. */
  readonly hourlyCost: number;
}

interface Family {
  /** GiB of memory per vCPU. */
  readonly memoryPerVcpu: number;
  /** USD per hour of the `large` size (2 vCPUs); the family's price scales with vCPUs. */
  readonly largeCost: number;
  readonly sizes: readonly string[];
}

const INTEL_SIZES = ['large', 'xlarge', '2xlarge', '4xlarge', '8xlarge', '12xlarge', '16xlarge', '24xlarge'];
const GRAVITON_SIZES = ['medium', 'large', 'xlarge', '2xlarge', '4xlarge', '8xlarge', '12xlarge', '16xlarge'];

const FAMILIES: Readonly<Record<string, Family>> = {
  m5: { memoryPerVcpu: 4, largeCost: 0.096, sizes: INTEL_SIZES },
  m6i: { memoryPerVcpu: 4, largeCost: 0.096, sizes: INTEL_SIZES },
  m7i: { memoryPerVcpu: 4, largeCost: 0.1008, sizes: INTEL_SIZES },
  c5: {
    memoryPerVcpu: 2,
    largeCost: 0.085,
    sizes: ['large', 'xlarge', '2xlarge', '4xlarge', '9xlarge', '12xlarge', '18xlarge', '24xlarge'],
  },
  c6i: { memoryPerVcpu: 2, largeCost: 0.085, sizes: INTEL_SIZES },
  c7i: { memoryPerVcpu: 2, largeCost: 0.08925, sizes: INTEL_SIZES },
  r5: { memoryPerVcpu: 8, largeCost: 0.126, sizes: INTEL_SIZES },
  r6i: { memoryPerVcpu: 8, largeCost: 0.126, sizes: INTEL_SIZES },
  m6g: { memoryPerVcpu: 4, largeCost: 0.077, sizes: GRAVITON_SIZES },
  c6g: { memoryPerVcpu: 2, largeCost: 0.068, sizes: GRAVITON_SIZES },
  r6g: { memoryPerVcpu: 8, largeCost: 0.1008, sizes: GRAVITON_SIZES },
  m7g: { memoryPerVcpu: 4, largeCost: 0.0816, sizes: GRAVITON_SIZES },
  c7g: { memoryPerVcpu: 2, largeCost: 0.0725, sizes: GRAVITON_SIZES },
};

/** Burstable t3: neither memory nor price scales with vCPUs, so each size is listed. */
const T3: Readonly<Record<string, InstanceTypeFacts>> = {
  nano: { vcpus: 2, memoryMiB: 512, hourlyCost: 0.0052 },
  micro: { vcpus: 2, memoryMiB: 1024, hourlyCost: 0.0104 },
  small: { vcpus: 2, memoryMiB: 2048, hourlyCost: 0.0208 },
  medium: { vcpus: 2, memoryMiB: 4096, hourlyCost: 0.0416 },
  large: { vcpus: 2, memoryMiB: 8192, hourlyCost: 0.0832 },
  xlarge: { vcpus: 4, memoryMiB: 16384, hourlyCost: 0.1664 },
  '2xlarge': { vcpus: 8, memoryMiB: 32768, hourlyCost: 0.3328 },
};

/** vCPUs of a size: `medium` 1, `large` 2, `xlarge` 4, `<n>xlarge` 4n. */
function vcpusOf(size: string): number | undefined {
  if (size === 'medium') return 1;
  if (size === 'large') return 2;
  if (size === 'xlarge') return 4;
  const m = /^(\d+)xlarge$/.exec(size);
  return m ? 4 * Number(m[1]) : undefined;
}

/** The facts of an instance type this table knows, else undefined. */
export function instanceTypeFacts(type: string): InstanceTypeFacts | undefined {
  const [family, size] = type.split('.');
  if (!family || !size) return undefined;
  if (family === 't3') return T3[size];
  const f = FAMILIES[family];
  const vcpus = vcpusOf(size);
  if (!f || vcpus === undefined || !f.sizes.includes(size)) return undefined;
  return {
    vcpus,
    memoryMiB: vcpus * f.memoryPerVcpu * 1024,
    hourlyCost: +((f.largeCost * vcpus) / 2).toFixed(6),
  };
}
