import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The pool configuration of a deployed function is a file in its code package, next to the bundle:
 * the stack writes it into each function's asset at synth (lib/poolFunction.ts), so it changes the
 * asset hash with the configuration and is bounded by the package size, not by Lambda's 4 KB for the
 * whole environment. The function reads it once per cold start from its directory (LAMBDA_TASK_ROOT).
 */
export const FUNCTION_CONFIG_FILE = 'metastatic.yaml';

/** The configuration text and where it came from (for error messages). */
export interface FunctionConfigText {
  readonly text: string;
  readonly source: string;
}

/**
 * The function's configuration: the file in LAMBDA_TASK_ROOT when there is one (what the stack validated
 * at synth and derived the IAM policy from), otherwise METASTATIC_CONFIG (YAML text in the environment:
 * for tests and for running the handlers outside Lambda; the stack never sets it).
 */
export function readFunctionConfig(env: {
  readonly LAMBDA_TASK_ROOT?: string | undefined;
  readonly METASTATIC_CONFIG?: string | undefined;
}): FunctionConfigText {
  let missing = 'LAMBDA_TASK_ROOT is not set';
  if (env.LAMBDA_TASK_ROOT) {
    const path = join(env.LAMBDA_TASK_ROOT, FUNCTION_CONFIG_FILE);
    try {
      return { text: readFileSync(path, 'utf8'), source: path };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
        throw new Error(`cannot read the pool configuration ${path}: ${(err as Error).message}`, {
          cause: err,
        });
      }
      missing = `${path} does not exist`;
    }
  }
  if (env.METASTATIC_CONFIG) return { text: env.METASTATIC_CONFIG, source: 'METASTATIC_CONFIG' };
  throw new Error(
    `no pool configuration: ${missing} and METASTATIC_CONFIG is not set (a function deployed by the ` +
      `metastatic stack has ${FUNCTION_CONFIG_FILE} next to its code)`,
  );
}
