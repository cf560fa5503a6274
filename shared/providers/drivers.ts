import { awsDriver } from './aws/driver.ts';
import type { BackingDriver } from './driver.ts';
import { localDriver } from './local/driver.ts';

/**
 * The backing drivers, by the name a provider section's `driver` gives: adding one is its module
 * (`shared/providers/<driver>/`, with a driver.ts exporting its BackingDriver) and a line here.
 * `metastatic` is not one: its providers offer slots on the backing nodes of these.
 */
export const BACKING_DRIVERS = {
  local: localDriver,
  aws: awsDriver,
} as const satisfies Record<string, BackingDriver>;

export type BackingDriverName = keyof typeof BACKING_DRIVERS;

/** Every `driver` a provider section may name. */
export const DRIVERS = ['metastatic', ...(Object.keys(BACKING_DRIVERS) as BackingDriverName[])] as const;

/** The backing driver of that name, if there is one. */
export function backingDriver(name: unknown): BackingDriver | undefined {
  return typeof name === 'string' && Object.hasOwn(BACKING_DRIVERS, name)
    ? BACKING_DRIVERS[name as BackingDriverName]
    : undefined;
}
