/**
 * What a local backing node lets a connection cost before it has logged in, as sshd's LoginGraceTime and
 * MaxStartups do: a connection not logged in within `graceMs` is closed, and at most `maxPending`
 * connections (`maxPendingPerSource` from one address) wait to log in at once. A new connection beyond
 * either bound closes the oldest waiting one (of its own address first; one still without a key exchange
 * before one past it), so a flood of idle connections costs the flooder its earlier connections, holds
 * a bounded number of descriptors, and keeps out for long no client that logs in promptly. Logged-in connections (a key of the slot's) are not bounded
 * here; the listener's `maxConnections` bounds every connection.
 */
import type { Socket } from 'node:net';

export interface GateLimits {
  /** A connection that has not logged in after this long is closed (sshd's LoginGraceTime is 120 s). */
  readonly graceMs: number;
  /** Connections waiting to log in, from every address. */
  readonly maxPending: number;
  /** Connections waiting to log in from one address. */
  readonly maxPendingPerSource: number;
}

export const GATE_LIMITS: GateLimits = { graceMs: 20_000, maxPending: 64, maxPendingPerSource: 32 };

/** Every connection a backing node holds, logged in or not (the listener closes any beyond this at once). */
export const MAX_CONNECTIONS = 512;

/** How often the gate says how many connections it closed (a flood would say it on every one). */
const REPORT_EVERY_MS = 10_000;

interface Waiting {
  readonly socket: Socket;
  readonly source: string;
  readonly timer: NodeJS.Timeout;
  /** The key exchange is done: closed only when no waiting connection has not got that far. */
  exchanged: boolean;
}

export class LoginGate {
  /** By `address|port`; a Map iterates in insertion order, so the first of an address is its oldest. */
  private readonly waiting = new Map<string, Waiting>();
  private readonly perSource = new Map<string, number>();
  private closedSinceReport = 0;
  private reportedAt = Number.NEGATIVE_INFINITY;
  private reportTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly warn: (message: string) => void,
    private readonly limits: GateLimits = GATE_LIMITS,
  ) {}

  /** Connections waiting to log in now. */
  get pending(): number {
    return this.waiting.size;
  }

  /** Takes a new connection in, closing the oldest waiting one when a bound is reached. */
  admit(socket: Socket): void {
    const source = socket.remoteAddress ?? 'unknown';
    const key = keyOf(source, socket.remotePort);
    if ((this.perSource.get(source) ?? 0) >= this.limits.maxPendingPerSource) this.closeOldest(source);
    else if (this.waiting.size >= this.limits.maxPending) this.closeOldest(undefined);
    const timer = setTimeout(() => this.close(key), this.limits.graceMs);
    timer.unref();
    this.waiting.set(key, { socket, source, timer, exchanged: false });
    this.perSource.set(source, (this.perSource.get(source) ?? 0) + 1);
    socket.once('close', () => this.forget(key));
  }

  /** The connection from `address`:`port` finished its key exchange (it is closed after those that did not). */
  exchanged(address: string | undefined, port: number | undefined): void {
    const entry = this.waiting.get(keyOf(address ?? 'unknown', port));
    if (entry) entry.exchanged = true;
  }

  /** The connection from `address`:`port` logged in: it no longer counts, and has no deadline. */
  loggedIn(address: string | undefined, port: number | undefined): void {
    this.forget(keyOf(address ?? 'unknown', port));
  }

  private closeOldest(source: string | undefined): void {
    let oldestExchanged: string | undefined;
    for (const [key, entry] of this.waiting) {
      if (source !== undefined && entry.source !== source) continue;
      if (!entry.exchanged) {
        this.close(key);
        return;
      }
      oldestExchanged ??= key;
    }
    if (oldestExchanged !== undefined) this.close(oldestExchanged);
  }

  private close(key: string): void {
    const entry = this.waiting.get(key);
    if (!entry) return;
    this.forget(key);
    entry.socket.destroy();
    this.closedSinceReport += 1;
    this.report();
  }

  /** Says how many connections it closed: at once after a quiet while, then at most every REPORT_EVERY_MS. */
  private report(): void {
    if (this.reportTimer) return;
    const wait = this.reportedAt + REPORT_EVERY_MS - Date.now();
    if (wait > 0) {
      this.reportTimer = setTimeout(() => {
        this.reportTimer = undefined;
        this.report();
      }, wait);
      this.reportTimer.unref();
      return;
    }
    this.reportedAt = Date.now();
    this.warn(
      `closed ${this.closedSinceReport} connection(s) that had not logged in (after ` +
        `${this.limits.graceMs / 1000}s, or beyond ${this.limits.maxPending} waiting)`,
    );
    this.closedSinceReport = 0;
  }

  private forget(key: string): void {
    const entry = this.waiting.get(key);
    if (!entry) return;
    clearTimeout(entry.timer);
    this.waiting.delete(key);
    const left = (this.perSource.get(entry.source) ?? 1) - 1;
    if (left > 0) this.perSource.set(entry.source, left);
    else this.perSource.delete(entry.source);
  }
}

function keyOf(address: string, port: number | undefined): string {
  return `${address}|${port ?? 0}`;
}
