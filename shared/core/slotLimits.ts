import type { Shape } from './shapes.ts';

/**
 * What one contained slot may use, from its metastatic label's shape: thousandths of a core (a CFS
 * quota), MiB of memory (a cgroup limit), processes (0: not limited). The same numbers go to the slot
 * program (slotProgram.ts) on a local backing node and on an EC2 instance.
 */
export interface SlotLimits {
  readonly millicores: number;
  readonly memoryMiB: number;
  readonly pids: number;
}

/** Processes (and threads) one slot may run at once. */
export const SLOT_PIDS = 1024;

/** The limits of a slot of this shape: its cores and memory, and SLOT_PIDS. */
export function limitsOf(shape: Pick<Shape, 'cores' | 'memoryMiB'> | undefined): SlotLimits {
  return {
    millicores: shape?.cores === undefined ? 0 : Math.max(1, Math.round(shape.cores * 1000)),
    memoryMiB: shape?.memoryMiB ?? 0,
    pids: SLOT_PIDS,
  };
}
