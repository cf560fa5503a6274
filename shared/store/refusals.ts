import type { DynamoDBDocumentClient } from '@aws-sdk/lib-dynamodb';
import { ItemTooLargeError, StoreRefusedError } from '../core/errors.ts';

/**
 * DynamoDB's answer to a request it will never accept as sent (dynalite answers alike): a number out of
 * its range ("Number underflow"), an item over 400 KB, an empty key, an expression past DynamoDB's
 * limits... Not a throttle, not a conflict.
 */
function isRefusal(err: unknown): err is Error {
  return err instanceof Error && err.name === 'ValidationException';
}

/** The ValidationException of a put or update whose item would exceed 400 KB. */
function isItemTooLarge(err: Error): boolean {
  return /item size.*exceeded/i.test(err.message);
}

/**
 * Makes every write the table refuses as invalid (an item over its size limit, a number out of its
 * range) a permanent error on this document client: it fails the same way every time, so it is not a
 * transient one retried until the message's receives run out. (docs/table.md, Writes and their
 * conditions.)
 */
export function makeRefusalsPermanent(doc: DynamoDBDocumentClient): void {
  doc.middlewareStack.add(
    (next) => async (args) => {
      try {
        return await next(args);
      } catch (err) {
        if (!isRefusal(err)) throw err;
        const message = `the table refused a write: ${err.message}`;
        throw isItemTooLarge(err)
          ? new ItemTooLargeError(message, { cause: err })
          : new StoreRefusedError(message, { cause: err });
      }
    },
    // The document client shares the client's stack: a second store on one client replaces it.
    { step: 'initialize', name: 'metastaticStoreRefused', override: true },
  );
}
