import type { BackingDriver } from '../driver.ts';
import { localProviderSchema } from './configSchema.ts';

/** Whether `resourceId` has the shape of a local resource id (localRecords.ts localResourceId). */
export function isLocalResourceId(resourceId: string): boolean {
  return /^local-[0-9a-f]{16}$/.test(resourceId);
}

/** `local`: backing nodes are child processes of `metastatic dev` (localProvider.ts). */
export const localDriver = {
  schema: localProviderSchema,
  ownsResource: isLocalResourceId,
  embeddedOnly: true,
} satisfies BackingDriver;
