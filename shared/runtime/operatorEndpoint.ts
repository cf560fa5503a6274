import { randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import { PermanentError } from '../core/errors.ts';
import type { Log } from '../core/log.ts';

/**
 * The operator endpoint of `metastatic dev`: the CLI's operator verbs (hold, drain, reap) are run by the
 * running pool, with its configuration and its provider, never by the CLI. Otherwise a CLI that launches
 * a backing node (reap's min-ready step) becomes that process's parent, and Ctrl-C on the CLI kills it;
 * and a CLI that reads the configuration file again acts on edits the pool does not know of.
 *
 * HTTP on loopback only, one POST per verb, answered when the verb is done. Its URL and a random bearer
 * token are in dev.json, which only the state dir's owner can read (privateState.ts): the endpoint does
 * what that owner can do anyway, through the table, and nothing for anyone else.
 */

export const OperatorCall = z.discriminatedUnion('verb', [
  z.object({ verb: z.literal('hold'), id: z.string().min(1).max(1024) }),
  z.object({ verb: z.literal('drain'), id: z.string().min(1).max(1024) }),
  z.object({ verb: z.literal('reap') }),
]);
export type OperatorCall = z.infer<typeof OperatorCall>;

/** The answer: the verb's result as JSON, or why it was refused (permanent: a domain refusal, exit 1). */
export const OperatorAnswer = z.union([
  z.object({ ok: z.literal(true), result: z.unknown() }),
  z.object({ ok: z.literal(false), permanent: z.boolean(), message: z.string() }),
]);
export type OperatorAnswer = z.infer<typeof OperatorAnswer>;

/** The path every call is posted to. */
export const OPERATOR_PATH = '/operator';
/** A call is a few hundred bytes; anything much larger is not one. */
const MAX_BODY_BYTES = 16 * 1024;

export interface OperatorEndpoint {
  readonly url: string;
  readonly token: string;
  close(): Promise<void>;
}

export async function startOperatorEndpoint(
  run: (call: OperatorCall) => Promise<unknown>,
  log: Log,
): Promise<OperatorEndpoint> {
  const token = randomBytes(32).toString('hex');
  const expected = Buffer.from(`Bearer ${token}`);
  const server = createServer((req, res) => {
    void serve(req, res).catch((err: unknown) => {
      log.error('operator endpoint: could not answer', { error: err as Error });
      if (!res.headersSent) reply(res, 500, { ok: false, permanent: false, message: 'internal error' });
    });
  });
  const serve = async (req: IncomingMessage, res: ServerResponse) => {
    const given = Buffer.from(req.headers.authorization ?? '');
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
      reply(res, 401, { ok: false, permanent: true, message: 'not authorized' });
      return;
    }
    if (req.method !== 'POST' || req.url !== OPERATOR_PATH) {
      reply(res, 404, { ok: false, permanent: true, message: `POST ${OPERATOR_PATH} only` });
      return;
    }
    const body = await readBody(req);
    let parsed: ReturnType<typeof OperatorCall.safeParse>;
    try {
      parsed = OperatorCall.safeParse(body === undefined ? undefined : JSON.parse(body));
    } catch {
      parsed = OperatorCall.safeParse(undefined);
    }
    if (!parsed.success) {
      reply(res, 400, { ok: false, permanent: true, message: 'not an operator call' });
      return;
    }
    try {
      reply(res, 200, { ok: true, result: await run(parsed.data) });
    } catch (err) {
      const permanent = err instanceof PermanentError;
      if (!permanent) log.error(`operator ${parsed.data.verb} failed`, { error: err as Error });
      reply(res, permanent ? 409 : 500, { ok: false, permanent, message: (err as Error).message });
    }
  };
  await new Promise<void>((listening, failed) => {
    server.once('error', failed);
    server.listen(0, '127.0.0.1', () => listening());
  });
  // A reap can take as long as a reaper run: no socket timeout cuts it short.
  server.requestTimeout = 0;
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}${OPERATOR_PATH}`,
    token,
    close: () =>
      new Promise<void>((closed) => {
        server.close(() => closed());
        server.closeAllConnections();
      }),
  };
}

function reply(res: ServerResponse, status: number, answer: OperatorAnswer): void {
  const text = JSON.stringify(answer);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** The request's body, or undefined when it is larger than any call. */
async function readBody(req: IncomingMessage): Promise<string | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}
