/**
 * The configuration's JSON Schema (draft 2020-12), generated from the zod schema, for editors and
 * `docs/config.schema.json`. Generated for the input side, so keys with defaults are not required.
 */
import { z } from 'zod';
import { configSchema } from './schema.ts';

export function configJsonSchema(): Record<string, unknown> {
  return z.toJSONSchema(configSchema, { io: 'input' }) as Record<string, unknown>;
}
