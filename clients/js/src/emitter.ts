/** A listener that threw: reported instead of breaking the delivery loop. */
export type Fault = (error: unknown) => void;

/**
 * A tiny typed event emitter (no dependency, works the same in browsers and
 * Node). Each event carries one argument.
 */
export class Emitter<Events extends object> {
  #listeners = new Map<keyof Events, Set<(arg: never) => void>>();
  #fault: Fault;

  /** @internal */
  constructor(fault: Fault) {
    this.#fault = fault;
  }

  /** Calls `listener` on each `event`; returns a function that removes it. */
  on<K extends keyof Events>(event: K, listener: (arg: Events[K]) => void): () => void {
    let set = this.#listeners.get(event);
    if (!set) this.#listeners.set(event, (set = new Set()));
    set.add(listener as (arg: never) => void);
    return () => this.off(event, listener);
  }

  /** Removes a listener added with {@link Emitter.on}. */
  off<K extends keyof Events>(event: K, listener: (arg: Events[K]) => void): void {
    this.#listeners.get(event)?.delete(listener as (arg: never) => void);
  }

  /** @internal Calls the listeners in order; one that throws is reported and the others still run. */
  emit<K extends keyof Events>(event: K, arg: Events[K]): void {
    for (const listener of [...(this.#listeners.get(event) ?? [])]) {
      try {
        (listener as (arg: Events[K]) => void)(arg);
      } catch (e) {
        this.#fault(e);
      }
    }
  }
}
