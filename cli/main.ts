import { CommanderError } from 'commander';
import { asCliError } from './errors.ts';
import { exitQuietlyWhenOutputCloses } from './output.ts';
import { buildProgram } from './program.ts';
import { terminalText } from './terminal.ts';

/**
 * The `metastatic` CLI: exit 0 on success and --help, 1 on a failure, 2 on a usage error, 141 when the
 * reader of its output went away.
 */
exitQuietlyWhenOutputCloses();
try {
  await buildProgram().parseAsync(process.argv);
} catch (err) {
  const known = asCliError(err);
  if (err instanceof CommanderError) {
    // --help and --version exit 0; usage errors (already printed by commander) exit 2.
    process.exitCode = err.exitCode === 0 ? 0 : 2;
  } else if (known) {
    process.stderr.write(terminalText(`metastatic: ${known.message}\n`));
    process.exitCode = known.exitCode;
  } else {
    process.stderr.write(terminalText(`metastatic: ${(err as Error).stack ?? String(err)}\n`));
    process.exitCode = 1;
  }
}
