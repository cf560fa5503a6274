import { ConflictError, LostWriteError } from '../core/errors.ts';

/**
 * The one retry loop of the lock-free protocol. Every change to a record is read -> decide ->
 * conditional write (the stored version is still the one read, or the item does not exist yet); a
 * write that loses to a concurrent writer throws LostWriteError, and the step runs again from a fresh
 * read (a ConflictError of another kind, e.g. a nested step that gave up, is not retried here). A step decides again on what it reads each time: the change it wanted may be done by now
 * (return that), or no longer wanted (return why not).
 */

/** How many times a step re-reads and retries after losing a conditional write. */
export const MAX_CONFLICT_RETRIES = 20;

/** Returned by a step to go round again at once (e.g. an item created meanwhile: read it). */
export const AGAIN: unique symbol = Symbol('again');

/**
 * Runs `step` (read, decide, conditional write) until it returns a result, going round again when it
 * throws LostWriteError (its conditional write lost) or returns AGAIN. After MAX_CONFLICT_RETRIES rounds it gives up: with
 * `giveUp`, that is the result (a step whose work the next run or delivery redoes anyway); otherwise a
 * ConflictError naming `what` (retryable: the message comes back).
 */
export async function retryOnConflict<T>(
  what: string,
  step: (round: number) => Promise<T | typeof AGAIN>,
  giveUp?: () => T,
): Promise<T> {
  for (let round = 0; round < MAX_CONFLICT_RETRIES; round++) {
    try {
      const result = await step(round);
      if (result !== AGAIN) return result;
    } catch (err) {
      if (!(err instanceof LostWriteError)) throw err;
    }
  }
  if (giveUp) return giveUp();
  throw new ConflictError(`gave up ${what} after ${MAX_CONFLICT_RETRIES} conflicts`);
}

/** A conditional write whose loss is not worth a retry (someone else's change wins): false when lost. */
export async function unlessConflict(write: () => Promise<unknown>): Promise<boolean> {
  try {
    await write();
    return true;
  } catch (err) {
    if (err instanceof LostWriteError) return false;
    throw err;
  }
}
