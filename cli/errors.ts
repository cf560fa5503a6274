import { InvalidInputError, MetastaticError } from '../client/errors.ts';

/**
 * An error the CLI reports as a message (no stack) with an exit code: 1 failure, 2 usage (`metastatic
 * run` has codes of its own, cli/commands/run.ts).
 */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = 1,
  ) {
    super(message);
    this.name = 'CliError';
  }
}

/**
 * The client library's errors as the CLI reports them: a message and exit code 2 for what the caller
 * got wrong (InvalidInputError: nothing was sent), 1 for the rest. Other errors are unexpected: undefined.
 */
export function asCliError(err: unknown): CliError | undefined {
  if (err instanceof CliError) return err;
  if (err instanceof InvalidInputError) return new CliError(err.message, 2);
  if (err instanceof MetastaticError) return new CliError(err.message, 1);
  return undefined;
}
