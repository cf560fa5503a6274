/** An error the CLI reports as a message (no stack) with an exit code: 1 failure, 2 usage. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: 1 | 2 = 1,
  ) {
    super(message);
    this.name = 'CliError';
  }
}
