import type { Base, DeltaDecoder, MsgBytes, MsgFrame, Opened } from './frame.js';

/** The published bytes of a binary payload in a JSON frame (base64, standard alphabet, padded). */
export const fromBase64 = (text: string): Uint8Array => Uint8Array.from(atob(text), (c) => c.charCodeAt(0));

/**
 * The full data of `m`: a JSON value, or a `Uint8Array` for binary data, in
 * either protocol. A delta is applied to `base` (which must be the data of
 * the seq before, else this throws: the app is never given data made from
 * the wrong base); a plain `data` message (a replay, say) leaves no base.
 * Throws where the data cannot be made (a delta that does not apply).
 * Not in the core: the codec and the decoder bring it (their `open`), as
 * only their messages need it; the core reads a plain `data` itself.
 */
export function openMsg(m: MsgFrame | MsgBytes, base: Base | undefined, decoder: DeltaDecoder | undefined): Opened {
  let bytes: Uint8Array;
  const apply = (delta: Uint8Array): Uint8Array => {
    if (!decoder || base?.seq !== m.seq - 1) throw new Error(`no base for the delta of seq ${m.seq}`);
    return decoder.apply(base.bytes, delta);
  };
  if ('bytes' in m) {
    // Protobuf: every full payload is the exact bytes, a base as it comes.
    bytes = m.delta ? apply(m.bytes) : m.bytes;
    if (m.binary) return { data: bytes, base: { seq: m.seq, bytes } };
  } else if (m.delta !== undefined) {
    // One char per byte: every code is below 256, or this is not a delta.
    bytes = apply(Uint8Array.from(m.delta, (c) => c.charCodeAt(0)));
  } else if (m.full !== undefined) {
    bytes = new TextEncoder().encode(m.full);
  } else {
    return { data: m.binary && typeof m.data === 'string' ? fromBase64(m.data) : m.data, base: undefined };
  }
  return { data: JSON.parse(new TextDecoder().decode(bytes)), base: { seq: m.seq, bytes } };
}
