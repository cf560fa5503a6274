import { execFile } from 'node:child_process';
import { createPublicKey, generateKeyPairSync, verify } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import ssh2, { type ClientChannel } from 'ssh2';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { systemClock } from '../../shared/core/clock.ts';
import type { BackingPool } from '../../shared/core/model.ts';
import type { BackingResource } from '../../shared/core/provider.ts';
import { scanHostKeys } from '../../shared/providers/hostKeys.ts';
import {
  ed25519PublicBlob,
  ed25519PublicKeyOf,
  encodeEd25519PrivateKey,
  newEd25519KeyPair,
  newEd25519PrivateKey,
} from '../../shared/providers/local/hostKey.ts';
import { LocalProvider } from '../../shared/providers/local/localProvider.ts';

const POOL_KEY = 'local/main';

const pool: BackingPool = {
  key: POOL_KEY,
  providerName: 'local',
  poolName: 'main',
  driver: 'local',
  maxServers: undefined,
  providerOptions: {},
  poolOptions: {},
  labels: new Map([['fast', { name: 'fast', options: {} }]]),
};

const SCAN_TIMEOUT_MS = 10_000;

/** The one key the backing nodes of these tests let in (not ssh2's generator, which mangles one key in ~256). */
const CLIENT_KEY = newEd25519PrivateKey();
const CLIENT_PUBLIC = (() => {
  const parsed = ssh2.utils.parseKey(CLIENT_KEY);
  if (parsed instanceof Error) throw parsed;
  return `${parsed.type} ${parsed.getPublicSSH().toString('base64')} test-client`;
})();
// A backing process boots in about a second; many times that on a loaded machine (a hang detector, not a speed check).
const WAIT = { timeout: 45_000, interval: 20 };

/** The OpenSSH client, when this machine has one (checked once; the one test that needs it is skipped otherwise). */
const hasSsh = await promisify(execFile)('ssh', ['-V']).then(
  () => true,
  () => false,
);

/** OpenSSH's ssh-keygen, when this machine has one (only the cross-check with OpenSSH needs it). */
const hasSshKeygen = await promisify(execFile)('ssh-keygen', ['-?']).then(
  () => true,
  (err: { code?: unknown }) => err.code !== 'ENOENT',
);

let stateDir: string;
const providers: LocalProvider[] = [];
const servers: Server[] = [];
const sockets = new Set<Socket>();

beforeEach(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'metastatic-hostkeys-'));
});

afterEach(async () => {
  await Promise.allSettled(providers.splice(0).map((p) => p.shutdown()));
  for (const socket of sockets) socket.destroy();
  sockets.clear();
  await Promise.all(servers.splice(0).map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  await rm(stateDir, { recursive: true, force: true });
});

/** Launches a backing node through the local provider and waits until it is running. */
async function backingNode(
  backingNodeId: string,
): Promise<{ resource: BackingResource; port: number; provider: LocalProvider }> {
  const provider = new LocalProvider({
    stateDir,
    pools: [pool],
    clock: systemClock,
    onEvent: () => {},
    logger: { info: () => {}, warn: () => {}, error: () => {} },
    authorizedKeys: [CLIENT_PUBLIC],
  });
  providers.push(provider);
  const { resourceId } = await provider.launch({
    backingNodeId,
    attempt: 1,
    poolKey: POOL_KEY,
    label: 'fast',
  });
  let resource: BackingResource | undefined;
  await vi.waitFor(async () => {
    resource = await provider.describe(resourceId);
    expect(resource?.state).toBe('running');
  }, WAIT);
  if (!resource?.port) throw new Error(`backing node ${backingNodeId} has no port`);
  return { resource, port: resource.port, provider };
}

/** A TCP server on a free loopback port, closed (with its connections) after the test. */
async function tcpServer(onConnection: (socket: Socket) => void): Promise<number> {
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => {});
    socket.on('close', () => sockets.delete(socket));
    onConnection(socket);
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (!address || typeof address === 'string') throw new Error('no port');
  return address.port;
}

/** A loopback port that nothing listens on (bound, then released). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (!address || typeof address === 'string') throw new Error('no port');
  return address.port;
}

/** The first line a connection to `port` receives, without CR LF. */
function firstLine(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1');
    let received = '';
    socket.setEncoding('latin1');
    socket.on('error', reject);
    socket.on('data', (chunk: string) => {
      received += chunk;
      const newline = received.indexOf('\n');
      if (newline < 0) return;
      socket.destroy();
      resolve(received.slice(0, newline).replace(/\r$/, ''));
    });
  });
}

/** One authentication method, forced (ssh2's client would otherwise try `none` first, which succeeds). */
type ClientAuth =
  | { readonly method: 'none' }
  | { readonly method: 'password'; readonly password: string }
  | { readonly method: 'publickey'; readonly privateKey: string }
  | { readonly method: 'keyboard-interactive' };

/** Runs a command (or a shell, when `command` is undefined) over SSH with the ssh2 client. */
function sshRun(
  port: number,
  command: string | undefined,
  auth: ClientAuth,
  username = 'slot0',
): Promise<{ out: string; code: unknown }> {
  return new Promise((resolve, reject) => {
    const client = new ssh2.Client();
    const fail = (err: Error): void => {
      client.end();
      reject(err);
    };
    client.on('error', fail);
    client.on('ready', () => {
      const onChannel = (err: Error | undefined, channel: ClientChannel): void => {
        if (err) {
          fail(err);
          return;
        }
        let out = '';
        let code: unknown;
        channel.on('data', (data: Buffer) => {
          out += data.toString('utf8');
        });
        channel.on('exit', (status: unknown) => {
          code = status;
        });
        channel.on('close', () => {
          client.end();
          resolve({ out, code });
        });
      };
      if (command === undefined) client.shell(false, onChannel);
      else client.exec(command, onChannel);
    });
    const { method, ...credentials } = auth;
    client.connect({
      host: '127.0.0.1',
      port,
      username,
      readyTimeout: SCAN_TIMEOUT_MS,
      authHandler: [method],
      tryKeyboard: method === 'keyboard-interactive',
      ...credentials,
    });
  });
}

/** Parses an OpenSSH private key with ssh2 (as a backing node does) and proves it signs for `publicKey`. */
function expectUsableKey(text: string, publicKey: Buffer): void {
  const parsed = ssh2.utils.parseKey(text);
  if (parsed instanceof Error) throw parsed;
  expect(parsed.type).toBe('ssh-ed25519');
  expect(parsed.isPrivateKey()).toBe(true);
  expect(parsed.getPublicSSH().equals(ed25519PublicBlob(publicKey))).toBe(true);
  const data = Buffer.from('exchange hash');
  const signature = parsed.sign(data);
  if (signature instanceof Error) throw signature;
  const nodeKey = createPublicKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: publicKey.toString('base64url') },
    format: 'jwk',
  });
  expect(verify(null, data, nodeKey, signature)).toBe(true);
}

describe('host key generation', () => {
  it('writes a key ssh2 can use even when the public key starts with a zero byte', () => {
    // ssh2's own generator strips such a leading zero (about one key in 256) and then cannot parse its
    // key: the backing node died before it was ready. Draw key pairs until one has it.
    let pair = newEd25519KeyPair();
    for (let i = 0; i < 100_000 && pair.publicKey[0] !== 0; i++) pair = newEd25519KeyPair();
    expect(pair.publicKey[0]).toBe(0);
    expectUsableKey(encodeEd25519PrivateKey(pair.seed, pair.publicKey), pair.publicKey);
  });

  it('never hangs generating keys under memory pressure (Node 20 deadlocked exporting a new key as JWK)', async () => {
    // A process with a small heap draws keys for 3 s, keeping some memory live: garbage collections
    // run during the key's encoding. Exported through a KeyObject's JWK, Node 20 deadlocked here within
    // seconds (a backing node, or a test worker, hanging for good).
    const script = [
      `import { newEd25519KeyPair } from ${JSON.stringify(join(import.meta.dirname, '..', '..', 'shared', 'providers', 'local', 'hostKey.ts'))};`,
      'const keep = []; const end = Date.now() + 3000; let n = 0;',
      'while (Date.now() < end) {',
      "  keep.push(newEd25519KeyPair().seed.toString('base64url').repeat(50));",
      '  if (keep.length > 20000) keep.splice(0, 10000);',
      '  n++;',
      '}',
      "console.log('generated ' + n);",
    ].join('\n');
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [
        '--max-old-space-size=40',
        '--max-semi-space-size=1',
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        script,
      ],
      { timeout: 30_000, killSignal: 'SIGKILL' },
    );
    expect(stdout).toMatch(/^generated [1-9]\d*\n$/);
  });

  it('pads the private section to whole blocks for any comment length', () => {
    const { seed, publicKey } = newEd25519KeyPair();
    for (const comment of ['', 'a', 'ab', 'abc', 'abcd', 'abcde', 'abcdef', 'abcdefg', 'ünïcode']) {
      expectUsableKey(encodeEd25519PrivateKey(seed, publicKey, comment), publicKey);
    }
  });

  it('gives every new key a distinct, parseable identity', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 500; i++) {
      const parsed = ssh2.utils.parseKey(newEd25519PrivateKey());
      if (parsed instanceof Error) throw parsed;
      seen.add(parsed.getPublicSSH().toString('base64'));
    }
    expect(seen.size).toBe(500);
  });

  it('refuses a seed or public key of the wrong size', () => {
    expect(() => encodeEd25519PrivateKey(Buffer.alloc(31), Buffer.alloc(32))).toThrow(
      'an ed25519 seed is 32 bytes, got 31',
    );
    expect(() => encodeEd25519PrivateKey(Buffer.alloc(32), Buffer.alloc(33))).toThrow(
      'an ed25519 public key is 32 bytes, got 33',
    );
  });

  it.skipIf(!hasSshKeygen)('writes a file OpenSSH reads back', async () => {
    const { seed, publicKey } = newEd25519KeyPair();
    const dir = await mkdtemp(join(tmpdir(), 'metastatic-key-'));
    try {
      const file = join(dir, 'host_key');
      await writeFile(file, encodeEd25519PrivateKey(seed, publicKey, 'metastatic'), { mode: 0o600 });
      const { stdout } = await promisify(execFile)('ssh-keygen', ['-y', '-f', file]);
      expect(stdout.trim()).toBe(`ssh-ed25519 ${ed25519PublicBlob(publicKey).toString('base64')} metastatic`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("a backing node's host key file", () => {
  /** `<type> <base64>` of a private key, as ssh2 reads it. */
  function publicOf(privateKey: string): string {
    const parsed = ssh2.utils.parseKey(privateKey);
    if (parsed instanceof Error) throw parsed;
    return `${parsed.type} ${parsed.getPublicSSH().toString('base64')}`;
  }

  it('is read without ssh2 when it holds an ed25519 key: the same public key ssh2 reads', () => {
    for (const comment of ['', 'metastatic', 'ünïcode']) {
      const key = newEd25519PrivateKey(comment);
      expect(ed25519PublicKeyOf(key)).toBe(publicOf(key));
    }
  });

  it('is left to ssh2 when it holds another kind of key', () => {
    const ecdsa = ssh2.utils.generateKeyPairSync('ecdsa', { bits: 256 }).private;
    const rsaPem = generateKeyPairSync('rsa', { modulusLength: 2048 })
      .privateKey.export({ format: 'pem', type: 'pkcs1' })
      .toString();
    expect(ed25519PublicKeyOf(ecdsa)).toBeUndefined();
    expect(ed25519PublicKeyOf(rsaPem)).toBeUndefined();
    expect(ed25519PublicKeyOf('not a key')).toBeUndefined();
  });

  it('is refused, saying why, when the ed25519 key in it is damaged', () => {
    const a = newEd25519KeyPair();
    const b = newEd25519KeyPair();
    // The public key of one pair with the seed of another: consistent in form, not a key pair.
    expect(() => ed25519PublicKeyOf(encodeEd25519PrivateKey(b.seed, a.publicKey))).toThrow(
      'malformed OpenSSH ed25519 private key: its seed does not make its public key',
    );
    const good = encodeEd25519PrivateKey(a.seed, a.publicKey).split('\n');
    const cut = [...good.slice(0, 3), ...good.slice(-2)].join('\n');
    expect(() => ed25519PublicKeyOf(cut)).toThrow('malformed OpenSSH ed25519 private key: truncated');
  });

  /** Runs the backing node program on a host key file holding `key`; its stdout and exit code. */
  async function bootWith(key: string): Promise<{ stdout: string; stderr: string; code: number | null }> {
    // The backing node program as the local provider runs it in a clone (bundled by bin/fromSources.mjs).
    const fromSources = '../../bin/fromSources.mjs';
    const { sourceBuild } = (await import(fromSources)) as { sourceBuild(): Promise<string> };
    const dir = await sourceBuild();
    await writeFile(join(stateDir, 'bn.key'), key, { mode: 0o600 });
    return new Promise((resolve, reject) => {
      const child = execFile(
        process.execPath,
        [
          join(dir, 'backingNode.js'),
          '--id',
          'bn-key',
          '--resource',
          'r-key',
          '--state-file',
          join(stateDir, 'bn.json'),
        ],
        { timeout: 30_000 },
        (err, stdout, stderr) => {
          const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
          if (err && code === null && !err.killed) reject(err);
          else resolve({ stdout, stderr, code });
        },
      );
      child.stdout?.on('data', (chunk: Buffer) => {
        if (chunk.toString().includes('READY')) child.kill('SIGTERM');
      });
    });
  }

  it('serves a key of another kind an operator put there (ssh2 reads it)', async () => {
    const ecdsa = ssh2.utils.generateKeyPairSync('ecdsa', { bits: 256 }).private;
    const { stdout, code } = await bootWith(ecdsa);
    expect(stdout).toContain(`HOSTKEY ${publicOf(ecdsa)}\nREADY `);
    expect(code).toBe(0);
  });

  it('stops the backing node with the reason when its ed25519 key is damaged', async () => {
    const a = newEd25519KeyPair();
    const b = newEd25519KeyPair();
    const { stdout, stderr, code } = await bootWith(encodeEd25519PrivateKey(b.seed, a.publicKey));
    expect(stdout).toBe('');
    expect(stderr).toContain('cannot parse host key');
    expect(stderr).toContain('its seed does not make its public key');
    expect(code).toBe(2);
  });
});

describe('scanHostKeys', () => {
  it('returns exactly the host key the local provider reports for a backing node', async () => {
    const { resource, port } = await backingNode('bn-scan');
    const hostKeys = resource.attributes.hostKeys;
    expect(hostKeys).toEqual([expect.stringMatching(/^ssh-ed25519 AAAA/)]);
    expect(await scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS)).toEqual(hostKeys);
    // Scanning again gives the same key: it is the node's, not the connection's.
    expect(await scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS)).toEqual(hostKeys);
  });

  it('formats ecdsa and rsa host keys as `<type> <base64>`', async () => {
    for (const [type, options] of [
      ['ecdsa', { bits: 256 }],
      ['rsa', { bits: 2048 }],
    ] as const) {
      const pair = ssh2.utils.generateKeyPairSync(type, options);
      const server = new ssh2.Server({ hostKeys: [pair.private] }, (client) => {
        client.on('error', () => {});
      });
      const port = await tcpServer((socket) => server.injectSocket(socket));
      const [key] = await scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS);
      const expected = ssh2.utils.parseKey(pair.public);
      if (expected instanceof Error) throw expected;
      expect(key).toBe(`${expected.type} ${expected.getPublicSSH().toString('base64')}`);
      expect(key).toMatch(type === 'ecdsa' ? /^ecdsa-sha2-nistp256 AAAA/ : /^ssh-rsa AAAA/);
    }
  });

  it('fails with the reason when nothing listens on the port', async () => {
    const port = await closedPort();
    await expect(scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS)).rejects.toThrow(
      new RegExp(`^host-key scan of 127\\.0\\.0\\.1:${port} failed: .*ECONNREFUSED`),
    );
  });

  it('fails when the server closes the connection without speaking SSH', async () => {
    const port = await tcpServer((socket) => socket.end('HTTP/1.1 400 Bad Request\r\n\r\n'));
    await expect(scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS)).rejects.toThrow(
      new RegExp(`^host-key scan of 127.0.0.1:${port} failed: `),
    );
  });

  it('times out against a server that never speaks SSH', async () => {
    const port = await tcpServer(() => {});
    await expect(scanHostKeys('127.0.0.1', port, 300)).rejects.toThrow(
      `host-key scan of 127.0.0.1:${port} timed out after 300ms`,
    );
  });
});

describe('SSH on a local backing node', () => {
  it('names the backing node in its identification line', async () => {
    const { port } = await backingNode('bn-banner');
    expect(await firstLine(port)).toBe('SSH-2.0-metastatic_bn-banner');
  });

  it("lets in only its authorized key, as a live slot's user; none, password, other keys and users are refused", async () => {
    const { resource, port, provider } = await backingNode('bn-exec');
    await provider.setLiveSlots(resource.resourceId, { '0': 'req-a/0' });
    const key = { method: 'publickey', privateKey: CLIENT_KEY } as const;
    expect(await sshRun(port, 'echo "$METASTATIC_NODE_ID $METASTATIC_SLOT"; exit 3', key)).toEqual({
      out: 'req-a/0 0\n',
      code: 3,
    });
    const refused = /All configured authentication methods failed/;
    await expect(sshRun(port, 'id', { method: 'none' })).rejects.toThrow(refused);
    await expect(sshRun(port, 'id', { method: 'password', password: 'anything' })).rejects.toThrow(refused);
    await expect(sshRun(port, 'id', { method: 'keyboard-interactive' })).rejects.toThrow(refused);
    await expect(
      sshRun(port, 'id', { method: 'publickey', privateKey: newEd25519PrivateKey() }),
    ).rejects.toThrow(refused);
    await expect(sshRun(port, 'id', key, 'root')).rejects.toThrow(refused);
  });

  it('survives clients that disconnect or misbehave mid-handshake', async () => {
    const { resource, port } = await backingNode('bn-robust');
    const abuse = (send: (socket: Socket) => void): Promise<void> =>
      new Promise((resolve) => {
        const socket = connect(port, '127.0.0.1', () => send(socket));
        socket.resume(); // Read (and drop) whatever the server sends, so that 'close' can come.
        socket.on('error', () => resolve());
        socket.on('close', () => resolve());
      });
    await abuse((socket) => socket.destroy());
    await abuse((socket) => socket.end('SSH-2.0-half\r\n'));
    await abuse((socket) => {
      socket.write('SSH-2.0-garbage\r\n');
      socket.end(Buffer.alloc(64, 0xff));
    });
    await abuse((socket) => socket.end('not ssh at all\r\n'.repeat(10)));
    await abuse((socket) => {
      socket.write('SSH-2.0-reset\r\n');
      // A partial packet, then a reset.
      socket.write(Buffer.from([0, 0, 1, 0, 4, 20]));
      setTimeout(() => socket.resetAndDestroy(), 20);
    });
    expect(await scanHostKeys('127.0.0.1', port, SCAN_TIMEOUT_MS)).toEqual(resource.attributes.hostKeys);
    expect(await firstLine(port)).toBe('SSH-2.0-metastatic_bn-robust');
  });

  it.skipIf(!hasSsh)('answers the OpenSSH client', async () => {
    const { resource, port, provider } = await backingNode('bn-openssh');
    await provider.setLiveSlots(resource.resourceId, { '1': 'req-b/0' });
    const identity = join(stateDir, 'client_key');
    await writeFile(identity, CLIENT_KEY, { mode: 0o600 });
    const { stdout } = await promisify(execFile)(
      'ssh',
      [
        '-p',
        String(port),
        '-i',
        identity,
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        'StrictHostKeyChecking=no',
        '-o',
        'UserKnownHostsFile=/dev/null',
        '-o',
        'BatchMode=yes',
        '-o',
        'LogLevel=ERROR',
        'slot1@127.0.0.1',
        'echo hello $METASTATIC_NODE_ID',
      ],
      { timeout: SCAN_TIMEOUT_MS },
    );
    expect(stdout).toBe('hello req-b/0\n');
  });
});
