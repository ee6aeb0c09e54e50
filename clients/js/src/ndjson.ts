/**
 * Newline-delimited JSON, split sans I/O: fed a response body's chunks as
 * they come (a chunk may end anywhere, mid-line or mid-UTF-8 character), it
 * gives back the whole lines. A long line that comes in many chunks is kept
 * as its pieces and joined once, when its newline comes (not re-copied per
 * chunk).
 */
export class Lines {
  #decoder = new TextDecoder();
  #parts: string[] = [];

  /** The lines `chunk` completes, without their `\n` (or `\r\n`); an empty one is a heartbeat. */
  push(chunk: Uint8Array): string[] {
    const text = this.#decoder.decode(chunk, { stream: true });
    const lines: string[] = [];
    let start = 0;
    for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n', start)) {
      this.#parts.push(text.slice(start, nl));
      const line = this.#parts.join('');
      this.#parts = [];
      lines.push(line.endsWith('\r') ? line.slice(0, -1) : line);
      start = nl + 1;
    }
    if (start < text.length) this.#parts.push(text.slice(start));
    return lines;
  }
}
