import { parseNodeId } from '../core/ids.ts';
import type { Log } from '../core/log.ts';
import type { NodeRecord, RequestRecord } from '../core/records.ts';
import type { LocalProvider } from '../providers/local/localProvider.ts';
import type { DynamoStore } from '../store/dynamoStore.ts';

/**
 * Keeps every local backing process told which of its slots are live (LocalProvider.setLiveSlots,
 * providers/local/liveSlots.ts): a slot is live for the node on it while that node is ready (a min-ready
 * node in use: for the node that took it). The embedded pool runs a sync after every handler run (a
 * request or release message, a state event, a reaper run, an operator verb), so a released node's
 * sessions end and a new node can log in as soon as the table says so. Syncs run one at a time; asks
 * made during one run one more sync after it, which reads the table afresh.
 */
export class LiveSlotSync {
  private running: Promise<void> | undefined;
  private again = false;

  constructor(
    private readonly store: DynamoStore,
    private readonly provider: LocalProvider,
    private readonly localPools: ReadonlySet<string>,
    private readonly log: Log,
  ) {}

  /** Resolves once a sync that started after this call has finished. Never throws (a failure is logged). */
  async sync(): Promise<void> {
    if (this.running) {
      this.again = true;
      // The run in progress may have read the table before the change that asked for this one.
      while (this.running) await this.running;
      return;
    }
    this.running = (async () => {
      do {
        this.again = false;
        try {
          await this.syncOnce();
        } catch (err) {
          this.log.warn('could not tell the local backing nodes which slots are live', {
            error: err as Error,
          });
        }
      } while (this.again);
    })().finally(() => {
      this.running = undefined;
    });
    await this.running;
  }

  private async syncOnce(): Promise<void> {
    const requests = new Map<string, Promise<RequestRecord | undefined>>();
    const nodeById = async (id: string): Promise<NodeRecord | undefined> => {
      const requestId = parseNodeId(id)?.requestId;
      if (requestId === undefined) return undefined;
      let request = requests.get(requestId);
      if (!request) {
        request = this.store.getRequest(requestId);
        requests.set(requestId, request);
      }
      return (await request)?.nodes.find((n) => n.id === id);
    };
    const live = new Map<string, Record<string, string>>();
    for (const b of await this.store.backingInPhase('active')) {
      if (!b.resourceId || !this.localPools.has(b.backingPoolKey) || b.state !== 'ready') continue;
      const slots: Record<string, string> = {};
      for (const [slot, nodeId] of Object.entries(b.slotMap)) {
        const node = await nodeById(nodeId);
        // A spare in use: the slot is its taker's.
        const user = node?.takenBy ? await nodeById(node.takenBy.node) : node;
        if (user?.state === 'ready') slots[slot] = user.id;
      }
      live.set(b.resourceId, slots);
    }
    for (const resourceId of await this.provider.resourceIds()) {
      await this.provider.setLiveSlots(resourceId, live.get(resourceId) ?? {});
    }
  }
}
