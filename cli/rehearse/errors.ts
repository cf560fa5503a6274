/**
 * A rehearsal that cannot go on, for a reason the user can act on (moto_server missing, a port in use,
 * an app that does not synthesize, no pool in it): the CLI prints the message, without a stack.
 */
export class RehearsalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'RehearsalError';
  }
}
