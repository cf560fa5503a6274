/**
 * Which slots of a local backing node are live, and for which node: the channel from the pool to a
 * backing process. The pool (shared/runtime/liveSlotSync.ts, through LocalProvider.setLiveSlots) writes
 * `<stateDir>/local/<resourceId>.live` atomically and sends the process SIGHUP; the process re-reads the
 * file on SIGHUP, every LIVE_POLL_MS as a fallback (a signal can be missed across a restart of the pool),
 * and while a login waits for its slot. The file is the truth, the signal only a prompt.
 *
 * A login as `slot<N>` is let in only while the file names a node on slot N; a session belongs to the
 * node it logged in for, and ends (its processes killed) once the file no longer names that node there.
 */

/** What the file holds: slot index (as a string) -> node id. */
export interface LiveSlots {
  readonly slots: Readonly<Record<string, string>>;
}

/** How often a backing process re-reads the file without a signal. */
export const LIVE_POLL_MS = 1_000;

/** Slot N's user is this and N: one process on one port serves every slot. */
export const SLOT_USER_PREFIX = 'slot';

/** The user name of slot N on a local backing node. */
export function slotUser(slot: number): string {
  return `${SLOT_USER_PREFIX}${slot}`;
}

/** The slot a user name logs into, or undefined when it is no slot's user. */
export function slotOfUser(user: string): number | undefined {
  const match = /^slot(0|[1-9]\d{0,5})$/.exec(user);
  return match ? Number(match[1]) : undefined;
}

/** The file's text for `slots` (stable: keys in slot order, so an unchanged set writes the same bytes). */
export function formatLiveSlots(slots: Readonly<Record<string, string>>): string {
  const ordered = Object.fromEntries(Object.entries(slots).sort(([a], [b]) => Number(a) - Number(b)));
  return `${JSON.stringify({ slots: ordered })}\n`;
}

/** The file's slots, or undefined when the text is not such a file (then nothing is live). */
export function parseLiveSlots(text: string): LiveSlots | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return undefined;
  const slots = (raw as { slots?: unknown }).slots;
  if (typeof slots !== 'object' || slots === null || Array.isArray(slots)) return undefined;
  const out: Record<string, string> = {};
  for (const [slot, node] of Object.entries(slots)) {
    if (/^\d+$/.test(slot) && typeof node === 'string' && node !== '') out[slot] = node;
  }
  return { slots: out };
}
