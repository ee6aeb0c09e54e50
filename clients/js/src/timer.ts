/** A one-shot timer that can be set again (replacing what was due) and cleared, whatever its state. */
export class Timer {
  #handle: ReturnType<typeof setTimeout> | undefined;

  /** Runs `fn` in `ms`, instead of what was due. */
  set(ms: number, fn: () => void): void {
    this.clear();
    this.#handle = setTimeout(() => {
      this.#handle = undefined;
      fn();
    }, ms);
  }

  clear(): void {
    clearTimeout(this.#handle);
    this.#handle = undefined;
  }

  /** Whether something is due. */
  get armed(): boolean {
    return this.#handle !== undefined;
  }
}
