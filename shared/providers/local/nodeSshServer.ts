/**
 * The SSH side of a local backing node (backingNode.ts): logins by public key as `slot<N>`, sessions that
 * run commands (slotProcess.ts) and serve sftp (sftpServer.ts).
 */
import ssh2, { type SessionAccept } from 'ssh2';
import { slotOfUser } from './liveSlots.ts';
import type { AllowedKey, HostKey } from './nodeKeys.ts';
import { ACCEPTED_ENV, type Login, type Slots, slotEnv } from './nodeSlots.ts';
import { serveSftp } from './sftpServer.ts';
import { endGroup, type PtyInfo, runOnChannel } from './slotProcess.ts';

/** An SSH identification string carries no spaces, control or non-ASCII characters. */
function identFor(backingNodeId: string): string {
  return `metastatic_${backingNodeId.replace(/[^\x21-\x7e]/g, '_')}`;
}

/** Each authorized key line parsed once, when a client first offers it. */
const parsedKeys = new Map<string, ssh2.ParsedKey | undefined>();

function parsedKey(allowed: AllowedKey): ssh2.ParsedKey | undefined {
  if (!parsedKeys.has(allowed.line)) {
    const parsed = ssh2.utils.parseKey(allowed.line);
    const key = Array.isArray(parsed) ? parsed[0] : parsed;
    const usable =
      key && !(key instanceof Error) && key.getPublicSSH().equals(allowed.blob) ? key : undefined;
    if (!usable) {
      process.stderr.write(
        `backing node: refusing an authorized key it cannot parse: ${allowed.line.slice(0, 40)}\n`,
      );
    }
    parsedKeys.set(allowed.line, usable);
  }
  return parsedKeys.get(allowed.line);
}

/** What the SSH side asks of the backing node: its keys now, whether it stops, whom to tell of a login. */
export interface SshServerHooks {
  readonly keys: () => readonly AllowedKey[];
  readonly stopping: () => boolean;
  /** The connection from this address and port finished its key exchange (loginGate.ts). */
  readonly exchanged: (address: string | undefined, port: number | undefined) => void;
  /** The connection from this address and port logged in (loginGate.ts stops counting it). */
  readonly loggedIn: (address: string | undefined, port: number | undefined) => void;
}

/** Authentication requests one connection may make (sshd's MaxAuthTries is 6 failures). */
const MAX_AUTH_REQUESTS = 20;

/**
 * The SSH side of a local backing node. Public-key authentication only, as `slot<N>` for a live slot N,
 * with a key of the authorized-keys file; every client and channel error is swallowed (it is the client's).
 * backingNode.ts imports this module (and so `ssh2`) when its first connection arrives.
 */
export function sshServer(
  backingNodeId: string,
  hostKey: HostKey,
  slots: Slots,
  { keys, stopping, exchanged, loggedIn }: SshServerHooks,
): InstanceType<typeof ssh2.Server> {
  const ident = identFor(backingNodeId);
  return new ssh2.Server({ hostKeys: [hostKey.privateKey], ident }, (client, info) => {
    client.on('error', () => {});
    let login: Login | undefined;
    let authRequests = 0;
    client.once('handshake', () => exchanged(info.ip, info.port));
    client.on('authentication', (ctx) => {
      if (++authRequests > MAX_AUTH_REQUESTS) return void client.end();
      if (ctx.method !== 'publickey' || stopping()) return ctx.reject(['publickey']);
      const slot = slotOfUser(ctx.username);
      const allowed = slot === undefined ? undefined : keys().find((k) => k.blob.equals(ctx.key.data));
      if (slot === undefined || !allowed) return ctx.reject(['publickey']);
      // Without a signature the client only asks whether this key would do.
      if (!ctx.signature || !ctx.blob) return ctx.accept();
      const key = parsedKey(allowed);
      if (key?.verify(ctx.blob, ctx.signature, ctx.hashAlgo) !== true) return ctx.reject(['publickey']);
      void (async () => {
        const nodeId = await slots.waitFor(slot);
        if (nodeId === undefined || stopping()) return ctx.reject(['publickey']);
        const dir = await slots.dirOf(slot);
        const groups = new Set<number>();
        login = {
          slot,
          nodeId,
          dir,
          home: slots.homeOf(slot, dir),
          groups,
          end: () => {
            for (const pgid of groups) endGroup(pgid);
            client.end();
          },
        };
        ctx.accept();
      })().catch((err: unknown) => {
        process.stderr.write(`backing node: login as ${ctx.username} failed: ${String(err)}\n`);
        ctx.reject(['publickey']);
      });
    });
    client.on('ready', () => {
      const current = login;
      if (!current) return void client.end();
      loggedIn(info.ip, info.port);
      slots.logins.add(current);
      // The slot may have been released between the check and now.
      if (slots.nodeOn(current.slot) !== current.nodeId) return current.end();
      client.on('close', () => {
        slots.logins.delete(current);
        for (const pgid of current.groups) endGroup(pgid);
      });
      client.on('session', (acceptSession) => {
        const session = acceptSession();
        let pty: PtyInfo | undefined;
        const env: Record<string, string> = {};
        const sessionGroups = new Set<number>();
        const track = (pgid: number, started: boolean): void => {
          for (const set of [current.groups, sessionGroups]) {
            if (started) set.add(pgid);
            else set.delete(pgid);
          }
        };
        const wrap = slots.wrapperOf(current.slot, current.dir);
        const options = () => ({
          cwd: current.dir,
          env: slotEnv(current, env),
          track,
          ...(wrap ? { wrap } : {}),
        });
        // Replies are only owed when the client asked for one (accept is then undefined at run time).
        session.on('pty', (accept: SessionAccept | undefined, _reject, info) => {
          pty = { term: info.term, rows: info.rows, cols: info.cols };
          accept?.();
        });
        session.on('env', (accept: SessionAccept | undefined, reject: (() => void) | undefined, info) => {
          if (ACCEPTED_ENV.test(info.key)) {
            env[info.key] = info.val;
            accept?.();
          } else reject?.();
        });
        session.on('window-change', (accept: SessionAccept | undefined) => accept?.());
        session.on('signal', (accept: SessionAccept | undefined, _reject, info) => {
          const name = `SIG${info.name.replace(/^SIG/, '')}` as NodeJS.Signals;
          for (const pgid of sessionGroups) {
            try {
              process.kill(-pgid, name);
            } catch {
              // Gone, or not a signal this system knows.
            }
          }
          accept?.();
        });
        session.on('exec', (accept, _reject, info) => {
          const channel = accept();
          if (!channel) return;
          channel.on('error', () => {});
          runOnChannel(channel, info.command, pty, options());
        });
        session.on('shell', (accept) => {
          const channel = accept();
          if (!channel) return;
          channel.on('error', () => {});
          runOnChannel(channel, undefined, pty, options());
        });
        session.on('sftp', (accept) => {
          const sftp = accept();
          if (sftp) serveSftp(sftp, current.dir, slots.confineOf(current.slot));
        });
        session.on('subsystem', (_accept, reject) => reject?.());
      });
    });
  });
}
