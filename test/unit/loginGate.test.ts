import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { LoginGate } from '../../shared/providers/local/loginGate.ts';

/** A socket as the gate sees one: an address, a port, destroy() (which closes it) and 'close'. */
class FakeSocket extends EventEmitter {
  destroyed = false;
  constructor(
    readonly remoteAddress: string,
    readonly remotePort: number,
  ) {
    super();
  }
  destroy(): void {
    if (this.destroyed) return;
    this.destroyed = true;
    this.emit('close');
  }
}

const limits = { graceMs: 1_000, maxPending: 4, maxPendingPerSource: 3 };

describe('the login gate of a local backing node', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  const setup = () => {
    const warnings: string[] = [];
    const gate = new LoginGate((m) => warnings.push(m), limits);
    let port = 1000;
    const open = (address: string) => {
      const socket = new FakeSocket(address, ++port);
      gate.admit(socket as unknown as Socket);
      return socket;
    };
    return { gate, open, warnings };
  };

  it('closes the oldest waiting connection of the same address beyond its per-address bound', () => {
    const { gate, open } = setup();
    const [a1, a2, a3] = [open('10.0.0.1'), open('10.0.0.1'), open('10.0.0.1')];
    const b1 = open('10.0.0.2');
    const a4 = open('10.0.0.1');
    expect([a1, a2, a3, a4, b1].map((s) => s.destroyed)).toEqual([true, false, false, false, false]);
    expect(gate.pending).toBe(4);
  });

  it('closes the oldest connection of any address beyond the total bound', () => {
    const { open } = setup();
    const a = [open('10.0.0.1'), open('10.0.0.2'), open('10.0.0.3'), open('10.0.0.4')];
    const e = open('10.0.0.5');
    expect([...a, e].map((s) => s.destroyed)).toEqual([true, false, false, false, false]);
  });

  it('closes one that finished its key exchange only after those that did not', () => {
    const { gate, open } = setup();
    const a1 = open('10.0.0.1');
    const a2 = open('10.0.0.1');
    const a3 = open('10.0.0.1');
    gate.exchanged(a1.remoteAddress, a1.remotePort);
    open('10.0.0.1');
    expect([a1, a2, a3].map((s) => s.destroyed)).toEqual([false, true, false]);
    gate.exchanged(a3.remoteAddress, a3.remotePort);
    open('10.0.0.1'); // the fourth, not exchanged, goes; a1 and a3 stay
    expect([a1.destroyed, a3.destroyed]).toEqual([false, false]);
  });

  it('closes a connection that has not logged in within the grace time, never one that has', () => {
    vi.useFakeTimers();
    const { gate, open, warnings } = setup();
    const slow = open('10.0.0.1');
    const prompt = open('10.0.0.1');
    gate.loggedIn(prompt.remoteAddress, prompt.remotePort);
    expect(gate.pending).toBe(1);
    vi.advanceTimersByTime(limits.graceMs);
    expect([slow.destroyed, prompt.destroyed]).toEqual([true, false]);
    expect(gate.pending).toBe(0);
    expect(warnings).toEqual([
      'closed 1 connection(s) that had not logged in (after 1s, or beyond 4 waiting)',
    ]);
  });

  it('says what it closed at most every ten seconds, and the rest when the flood is over', () => {
    vi.useFakeTimers();
    const { open, warnings } = setup();
    for (let i = 0; i < 100; i += 1) open('10.0.0.1');
    expect(warnings).toHaveLength(1);
    vi.advanceTimersByTime(10_000);
    expect(warnings).toHaveLength(2);
    expect(warnings[1]).toMatch(/^closed 99 connection/);
  });
});
