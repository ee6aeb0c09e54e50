/**
 * The client's subscriptions: each by its topic, and those whose `sub` is
 * in flight by that command's id (its `ok` or `err` names only the id).
 * @module
 */
import type { Subscription } from './subscription.js';

export class Subscriptions {
  #byTopic = new Map<string, Subscription>();
  /** `sub`s in flight, by id. */
  #sent = new Map<number, Subscription>();

  /** Whether the app has a subscription of `topic`, named as it named it. */
  has(topic: string): boolean {
    return this.#byTopic.has(topic);
  }

  add(sub: Subscription): void {
    this.#byTopic.set(sub.topic, sub);
  }

  /** Forgets `sub`, if it is still its topic's; whether it was. */
  remove(sub: Subscription): boolean {
    if (this.#byTopic.get(sub.topic) !== sub) return false;
    this.#byTopic.delete(sub.topic);
    return true;
  }

  /**
   * The subscription a frame names: the server may write the `default:`
   * namespace the app left out, or leave out the one the app wrote.
   */
  find(topic: string | undefined): Subscription | undefined {
    if (topic === undefined) return undefined;
    return (
      this.#byTopic.get(topic) ??
      (topic.startsWith('default:') ? this.#byTopic.get(topic.slice(8)) : this.#byTopic.get(`default:${topic}`))
    );
  }

  /** Every subscription, as a list (a listener may subscribe or unsubscribe while the caller goes through it). */
  all(): Subscription[] {
    return [...this.#byTopic.values()];
  }

  /** `sub`'s `sub` command went out with `id`. */
  sent(id: number, sub: Subscription): void {
    this.#sent.set(id, sub);
  }

  /** The subscription whose `sub` the `ok` or `err` of `id` answers; no longer in flight. */
  answered(id: number): Subscription | undefined {
    const sub = this.#sent.get(id);
    this.#sent.delete(id);
    return sub;
  }

  /** The connection ended: no `sub` is in flight any more, and every subscription is told. */
  disconnected(): void {
    this.#sent.clear();
    for (const sub of this.#byTopic.values()) sub._disconnected();
  }
}
