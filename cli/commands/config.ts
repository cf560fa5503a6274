import { writeFile } from 'node:fs/promises';
import { configJsonSchema } from '../../shared/config/jsonSchema.ts';
import { formatConfigErrors, loadConfigFile } from '../../shared/config/load.ts';
import { print, printError, printJson } from '../output.ts';

/** `metastatic validate FILE`: every error with its YAML path (exit 1), warnings for ignored keys. */
export async function validate(file: string, opts: { json?: boolean }): Promise<void> {
  const result = await loadConfigFile(file);
  if (opts.json) {
    printJson(
      result.ok
        ? { valid: true, errors: [], warnings: result.config.notices }
        : { valid: false, errors: result.errors, warnings: [] },
    );
  } else if (result.ok) {
    const c = result.config;
    print(
      `${file}: valid (${c.metastaticPools.length} metastatic pool(s), labels ${[...c.metastaticLabelNames].join(', ')})`,
    );
    for (const n of c.notices) printError(`warning: ${file}: ${n.path}: ${n.message}`);
  } else {
    printError(formatConfigErrors(result.errors));
  }
  if (!result.ok) process.exitCode = 1;
}

/** `metastatic schema`: the configuration's JSON Schema, for editors. */
export async function schema(opts: { out?: string }): Promise<void> {
  const text = `${JSON.stringify(configJsonSchema(), null, 2)}\n`;
  if (opts.out) await writeFile(opts.out, text);
  else process.stdout.write(text);
}
