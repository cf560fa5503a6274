import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDynalite, startSqsEngine } from '../../shared/runtime/engines.ts';
import { smallOnLarge } from '../../testkit/configs.ts';
import { type Harness, startHarness } from '../../testkit/harness.ts';

/**
 * What a process listens on, read from /proc: the TCP sockets in LISTEN state whose inodes are among
 * the process's open file descriptors, as `address:port` (IPv4 dotted, IPv6 compressed to `::1` /
 * `::` where it is loopback / any).
 */
function listeningSockets(pid: number | 'self'): string[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      const m = /^socket:\[(\d+)\]$/.exec(target);
      if (m?.[1]) inodes.add(m[1]);
    } catch {
      // closed meanwhile
    }
  }
  const out: string[] = [];
  for (const file of ['tcp', 'tcp6']) {
    let text: string;
    try {
      text = readFileSync(`/proc/${pid}/net/${file}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.trim().split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      const [local, , state] = [cols[1], cols[2], cols[3]];
      const inode = cols[9];
      if (state !== '0A' || !local || !inode || !inodes.has(inode)) continue; // 0A: LISTEN
      const [hex, portHex] = local.split(':') as [string, string];
      out.push(`${decodeAddress(hex)}:${Number.parseInt(portHex, 16)}`);
    }
  }
  return out;
}

function decodeAddress(hex: string): string {
  if (hex.length === 8) {
    // IPv4, little-endian on x86 and arm64.
    return [3, 2, 1, 0].map((i) => Number.parseInt(hex.slice(i * 2, i * 2 + 2), 16)).join('.');
  }
  if (/^0{32}$/.test(hex)) return '::';
  if (hex === '00000000000000000000000001000000') return '::1';
  if (hex.startsWith('0000000000000000FFFF0000')) return `::ffff:${decodeAddress(hex.slice(24))}`;
  return hex;
}

const isLoopback = (socket: string): boolean =>
  /^(127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+):\d+$/.test(socket);

const linux = process.platform === 'linux';

describe.runIf(linux)('listening sockets', () => {
  it('reads a known listener back from /proc (the check itself works)', async () => {
    const { createServer } = await import('node:net');
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '0.0.0.0', resolve));
    const port = (server.address() as { port: number }).port;
    try {
      expect(listeningSockets('self')).toContain(`0.0.0.0:${port}`);
      expect(isLoopback(`0.0.0.0:${port}`)).toBe(false);
    } finally {
      server.close();
    }
  });

  it('the embedded DynamoDB and SQS engines listen on loopback only', async () => {
    const before = new Set(listeningSockets('self'));
    const ddb = await startDynalite();
    const sqs = await startSqsEngine();
    try {
      const opened = listeningSockets('self').filter((s) => !before.has(s));
      expect(opened).toHaveLength(2);
      expect(opened.filter((s) => !isLoopback(s))).toEqual([]);
      for (const engine of [ddb, sqs]) {
        const port = new URL(engine.endpoint).port;
        expect(opened.some((s) => s.endsWith(`:${port}`))).toBe(true);
      }
    } finally {
      await sqs.close();
      await ddb.close();
    }
  });

  describe('a running embedded pool', () => {
    let h: Harness;
    beforeAll(async () => {
      h = await startHarness(smallOnLarge());
    });
    afterAll(async () => {
      await h?.close();
    });

    it('listens on loopback only: the stack, and every backing process it started', async () => {
      await h.send({ kind: 'request', id: 'listen-1', labels: ['small'] });
      await h.drainRequests();
      await h.fulfilUntil(
        async () => (await h.pool.context.store.getRequest('listen-1'))?.state === 'fulfilled',
      );
      const own = listeningSockets('self');
      expect(own.length).toBeGreaterThanOrEqual(2); // dynalite and the SQS engine at least
      expect(own.filter((s) => !isLoopback(s))).toEqual([]);
      const children = (await h.pool.context.providers.forPool('local/main').list())
        .map((r) => Number(r.attributes.pid))
        .filter((pid) => Number.isInteger(pid) && pid > 0);
      expect(children.length).toBeGreaterThan(0);
      for (const pid of children) {
        const sockets = listeningSockets(pid);
        expect(sockets.length).toBeGreaterThan(0);
        expect(sockets.filter((s) => !isLoopback(s))).toEqual([]);
      }
    });
  });
});
