#!/usr/bin/env python3
"""Writes the checked-in seed corpus (seeds/<target>/) of the fuzz targets.

Small on purpose: a few dozen files that each reach one rule or path, from
which the fuzzer grows its own corpus (corpus/, not checked in). The seeds
also replay in `cargo test` (gateway/src/session/fuzzing.rs). Run it from
anywhere after changing a seed here; it rewrites seeds/ whole.
"""

import json
import os
import shutil
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")

FIN, CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x80, 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MASK = bytes([0x37, 0xFA, 0x21, 0x3D])

# frames: the setup byte picks the message limit (low 3 bits, an index into
# MAXES) and the largest read (next 3 bits, into READS); see fuzzing.rs.
MAX_16, MAX_125, MAX_64K, MAX_1M = 2, 3, 6, 7
READS_1, READS_7, READS_64, READS_1000, READS_ALL = 0, 3, 4, 5, 7


def setup(max_index, reads_index, seed=0x5A):
    return bytes([max_index | reads_index << 3, seed])


def frame(first, payload=b"", masked=True, form=None, mask=MASK, top_bit=False):
    """A client frame; `form` forces a length form (7, 16 or 64 bits)."""
    n = len(payload)
    form = form or (7 if n < 126 else 16 if n < 65536 else 64)
    bit = 0x80 if masked else 0
    if form == 7:
        head = bytes([first, bit | n])
    elif form == 16:
        head = bytes([first, bit | 126]) + struct.pack(">H", n)
    else:
        head = bytes([first, bit | 127]) + struct.pack(">Q", n | (1 << 63 if top_bit else 0))
    if not masked:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def close(code, reason=b""):
    return frame(FIN | CLOSE, struct.pack(">H", code) + reason)


def frames_seeds():
    euro = "€".encode()
    session = b"".join(
        frame(FIN | TEXT, c)
        for c in [
            b'{"op":"hello"}',
            b'{"op":"sub","id":1,"topic":"news"}',
            b'{"op":"pub","id":2,"topic":"news","data":{"a":[1,2]}}',
            b'{"op":"ack","topic":"news","seq":1}',
        ]
    ) + close(1000, b"bye")
    return {
        "text_7bit": setup(MAX_64K, READS_7) + frame(FIN | TEXT, b'{"op":"hello"}'),
        "text_16bit": setup(MAX_64K, READS_64) + frame(FIN | TEXT, "é".encode() * 150),
        "text_64bit_form": setup(MAX_64K, READS_7) + frame(FIN | TEXT, b"long form", form=64),
        "text_16bit_form_short": setup(MAX_125, READS_1) + frame(FIN | TEXT, b"x", form=16),
        "text_64bit_declared_cut": setup(MAX_1M, READS_1000)
        + frame(FIN | TEXT, b"y" * 70000)[:2000],
        "text_empty": setup(MAX_16, READS_1) + frame(FIN | TEXT),
        "fragments_with_ping": setup(MAX_125, READS_7)
        + frame(TEXT, b'{"op"')
        + frame(FIN | PING, b"mid")
        + frame(CONT, b"")
        + frame(CONT, b':"hel')
        + frame(FIN | PONG, b"x")
        + frame(FIN | CONT, b'lo"}'),
        "fragments_split_char": setup(MAX_16, READS_1)
        + frame(TEXT, euro[:1])
        + frame(CONT, euro[1:2])
        + frame(FIN | CONT, euro[2:]),
        "fragments_cut_char": setup(MAX_16, READS_7)
        + frame(TEXT, euro[:1])
        + frame(FIN | CONT, euro[1:2]),
        "ping_pong": setup(MAX_16, READS_7)
        + frame(FIN | PING, b"p" * 125)
        + frame(FIN | PONG, b"")
        + frame(FIN | PING, b""),
        "close_code_reason": setup(MAX_16, READS_7) + close(1000, "bye €".encode()),
        "close_empty": setup(MAX_16, READS_1) + frame(FIN | CLOSE),
        "close_4999": setup(MAX_16, READS_7) + close(4999),
        "close_1005": setup(MAX_16, READS_7) + close(1005),
        "close_one_byte": setup(MAX_16, READS_7) + frame(FIN | CLOSE, b"\x03"),
        "close_bad_reason": setup(MAX_16, READS_7) + close(1000, b"\xff"),
        "session": setup(MAX_64K, READS_ALL) + session,
        "session_bytewise": setup(MAX_64K, READS_1, 0x33) + session,
        "unmasked": setup(MAX_16, READS_7) + frame(FIN | TEXT, b"hi", masked=False),
        "binary": setup(MAX_16, READS_7) + frame(FIN | BINARY, b"\x00\x01"),
        "reserved_opcode": setup(MAX_16, READS_7) + frame(FIN | 0x3, b""),
        "reserved_bits": setup(MAX_16, READS_7) + frame(FIN | 0x40 | TEXT, b"x"),
        "control_fragmented": setup(MAX_16, READS_7) + frame(PING, b""),
        "control_long": setup(MAX_1M, READS_1000) + frame(FIN | PING, b"p" * 126),
        "length_top_bit": setup(MAX_1M, READS_7) + frame(FIN | TEXT, b"x", form=64, top_bit=True),
        "too_big": setup(MAX_16, READS_7) + frame(FIN | TEXT, b"0123456789abcdefg"),
        "too_big_reassembled": setup(MAX_16, READS_7)
        + frame(TEXT, b"0123456789")
        + frame(FIN | CONT, b"abcdefg"),
        "invalid_utf8": setup(MAX_16, READS_7) + frame(FIN | TEXT, b"\xff\xfe"),
        "stray_continuation": setup(MAX_16, READS_7) + frame(FIN | CONT, b"x"),
        "interleaved": setup(MAX_16, READS_7) + frame(TEXT, b"a") + frame(FIN | TEXT, b"b"),
        "pipelined_then_error": setup(MAX_125, READS_64)
        + frame(FIN | TEXT, b"one")
        + frame(FIN | TEXT, b"two")
        + frame(FIN | BINARY, b"three"),
    }


# frame_script: after the setup, frames of: first byte, flags (0x80 unmasked,
# 0x60 length form, 0x1F payload kind), the payload's description, the mask.
LITERAL, REPEAT, CHARS, CLOSE_KIND = 0, 16, 24, 30
BITS16, BITS64, TOP_BIT, UNMASKED = 0x20, 0x40, 0x60, 0x80


def s_literal(first, payload, flags=0):
    return bytes([first, flags | LITERAL, len(payload)]) + payload + MASK


def s_repeat(first, count, times_index, fill, flags=0):
    return bytes([first, flags | REPEAT | times_index]) + struct.pack("<H", count) + bytes([fill]) + MASK


def s_chars(first, eights, seed, flags=0):
    return bytes([first, flags | CHARS, eights, seed]) + MASK


def s_close(code, reason=b""):
    return bytes([FIN | CLOSE, CLOSE_KIND]) + struct.pack(">H", code) + bytes([len(reason)]) + reason + MASK


def script_seeds():
    return {
        "large_text_64bit": setup(MAX_1M, READS_ALL) + s_repeat(FIN | TEXT, 40000, 2, ord("a")),
        "large_text_small_reads": setup(MAX_1M, READS_1000) + s_repeat(FIN | TEXT, 20000, 0, ord("b")),
        "large_fragments_and_pings": setup(MAX_1M, READS_ALL, 7)
        + s_repeat(TEXT, 30000, 0, ord("c"))
        + s_literal(FIN | PING, b"mid")
        + s_repeat(CONT, 30000, 1, ord("d"))
        + s_literal(FIN | CONT, b"end"),
        "utf8_chars": setup(MAX_64K, READS_7) + s_chars(FIN | TEXT, 200, 3),
        "utf8_chars_fragmented": setup(MAX_64K, READS_64)
        + s_chars(TEXT, 3, 9)
        + s_chars(CONT, 5, 11)
        + s_chars(FIN | CONT, 1, 13),
        "length_forms": setup(MAX_64K, READS_7)
        + s_literal(FIN | TEXT, b"sixteen", BITS16)
        + s_literal(FIN | TEXT, b"sixty-four", BITS64)
        + s_literal(FIN | PING, b"p"),
        "length_top_bit": setup(MAX_64K, READS_7) + s_literal(FIN | TEXT, b"x", TOP_BIT),
        "control_bits16": setup(MAX_64K, READS_7) + s_literal(FIN | PONG, b"x", BITS16),
        "unmasked": setup(MAX_64K, READS_7) + s_literal(FIN | TEXT, b"x", UNMASKED),
        "close_codes": setup(MAX_16, READS_7) + s_close(1000, b"ok") + s_close(3000) + s_close(1016),
        "too_big_repeat": setup(MAX_64K, READS_1000) + s_repeat(FIN | TEXT, 65535, 1, ord("z")),
        "binary_repeat": setup(MAX_64K, READS_1000) + s_repeat(FIN | BINARY, 100, 0, 0),
    }


def decoder_seeds():
    def pb_field(tag, value):
        return bytes([tag << 3 | 2, len(value)]) + value

    commands = {
        "hello": b'{"op":"hello"}',
        "hello_token_resume": b'{"op":"hello","token":"eyJ.a.b","resume":"0f1e2d"}',
        "sub": b'{"op":"sub","id":1,"topic":"news"}',
        "sub_since": b'{"op":"sub","id":2,"topic":"chat:room-1","since":41,"epoch":"9f3c"}',
        "unsub": b'{"op":"unsub","id":3,"topic":"news"}',
        "pub_object": b'{"op":"pub","id":4,"topic":"news","data":{"b":1.50,"a":"\\u00e9"}}',
        "pub_array": b'{"op":"pub","id":5,"topic":"news","data":[1,"two",null,true,{"x":[]}]}',
        "pub_null": b'{"op":"pub","id":6,"topic":"news","data":null}',
        "pub_string": b'{"op":"pub","id":7,"topic":"ns:a-b_c.d=e@f/g","data":"\\ud83d\\ude00"}',
        # Found by the fuzzer: JSON's grammar allows it; serde_json reads it
        # as text but not into a Value (see check_delivery).
        "pub_lone_surrogate": b'{"op":"pub","id":7,"topic":"ns:a-b_c.d=e@f/g","data":"83d\\ude00"}',
        "ack": b'{"op":"ack","topic":"news","seq":18446744073709551615}',
        "refresh": b'{"op":"refresh","id":8,"token":"t"}',
        "ping": b'{"op":"ping","id":11}',
        "bad_topic": b'{"op":"unsub","id":12,"topic":"no spaces"}',
        "unknown_op": b'{"op":"nope","id":9}',
        "missing_field": b'{"op":"sub","topic":"news"}',
        "array": b'["sub",1,"news"]',
        "escaped_topic": b' {"op":"sub","id":10,"topic":"n\\u0065ws","extra":{"ignored":1}}',
        "duplicate_key": b'{"op":"ack","topic":"a","seq":1,"seq":2}',
        "wrong_type": b'{"op":"sub","id":-1,"topic":7}',
        "truncated": b'{"op":"pub","id":1,"topic":"news","data":{"a":',
        "http_publish": b'{"topic":"news","data":{"n":1},"idempotency_key":"k-1"}',
        "http_disconnect": b'{"user":"alice"}',
        "grpc_publish": pb_field(1, b"news") + pb_field(2, b'{"n":1}') + pb_field(3, b"k"),
    }
    return commands


# claims: the first byte picks the clock (low 2 bits, an index into NOWS) and
# the leeway (next 2 bits, into LEEWAYS); see gateway/src/auth/fuzzing.rs.
I64_MAX = 2**63 - 1


def claims_seeds():
    def seed(pick, claims):
        text = claims if isinstance(claims, str) else json.dumps(claims, separators=(",", ":"))
        return bytes([pick]) + text.encode()

    far = 4102444800  # 2100-01-01
    return {
        "never_expires": seed(0x01, {"sub": "alice", "exp": I64_MAX}),
        "never_expires_at_max_clock": seed(0x0E, {"sub": "alice", "exp": I64_MAX, "iat": I64_MAX}),
        "u64_max_exp": seed(0x0D, '{"sub":"a","exp":18446744073709551615}'),
        "huge_float_exp": seed(0x05, '{"sub":"a","exp":1e300}'),
        "fractional_exp": seed(0x01, '{"sub":"a","exp":1700000600.5}'),
        "negative_exp": seed(0x01, '{"sub":"a","exp":-1}'),
        "string_exp": seed(0x01, '{"sub":"a","exp":"never"}'),
        "prefix_grants": seed(0x01, {"sub": "a", "exp": far,
                                     "subscribe": ["chat*", "chat:room-*", "*"],
                                     "publish": ["chatops:*", "news"]}),
        "bad_grants": seed(0x01, {"sub": "a", "exp": far, "subscribe": ["pri*es", "**", ""]}),
        # Found by the fuzzer: a pattern naming an empty namespace.
        "empty_namespace_grant": seed(0x01, {"sub": "a", "exp": far, "subscribe": [":*", "news"]}),
        "no_sub": seed(0x01, {"exp": far}),
        "not_json": seed(0x00, "not json at all"),
        "max_leeway": seed(0x0F, {"sub": "a", "exp": 0, "iat": 0}),
    }


# compressed_script: the setup byte picks the limit (bits 0-1, into MAXES),
# the cap (2-3, into CAPS), context takeover (0x10), binary taken (0x20) and
# the reads (6-7, into READS); see fuzzing/compressed_script.rs. Then each
# message: a kind byte, a window byte (9 + b % 7), a length, the data, and a
# repeat byte (the data 1 + b times).
MAXES_C = {"16": 0, "1000": 1, "64k": 2, "1m": 3}
CAPS_C = {"1": 0, "200": 1, "4096": 2, "1m": 3}
COMPRESSED, BIN, PING_AFTER, LEVEL9 = 0x01, 0x02, 0x10, 0x80
SYNC, TAIL_KEPT, FINAL, TWO_FLUSHES = 0, 0x20, 0x40, 0x60
TAKEOVER, TAKES_BINARY = 0x10, 0x20


def c_setup(max_key, cap_key, reads=0, flags=0):
    return bytes([MAXES_C[max_key] | CAPS_C[cap_key] << 2 | flags | reads << 6])


def c_message(kind, data, window=6, fragments=1, times=0):
    return bytes([kind | (fragments - 1) << 2, window, len(data)]) + data + bytes([times])


def compressed_script_seeds():
    state = json.dumps({"score": [3, 1], "clock": "12:04", "players": ["ann", "bo"]}).encode()
    chat = b'{"op":"pub","id":1,"topic":"chat:lobby","data":{"text":"hello"}}'
    return {
        "every_window": c_setup("64k", "1m", 0)
        + b"".join(c_message(COMPRESSED, state, window) for window in range(7)),
        "fragmented_with_pings": c_setup("64k", "1m", 1)
        + c_message(COMPRESSED | PING_AFTER, state, 3, fragments=4, times=3)
        + c_message(PING_AFTER, chat, 5, fragments=3),
        "endings": c_setup("64k", "1m", 0)
        + b"".join(c_message(COMPRESSED | e, chat, 6, fragments=2) for e in (SYNC, TAIL_KEPT, FINAL, TWO_FLUSHES)),
        "takeover": c_setup("64k", "1m", 1, TAKEOVER)
        + c_message(COMPRESSED, state, 6)
        + c_message(COMPRESSED | LEVEL9, state, 6)
        + c_message(COMPRESSED | FINAL, chat, 6)
        + c_message(COMPRESSED, chat, 6),
        # Found by the fuzzer: an empty message of a client that keeps its
        # window (its sync flush writes nothing, not even the tail).
        "takeover_empty": c_setup("64k", "1m", 0, TAKEOVER)
        + c_message(COMPRESSED, chat, 6)
        + c_message(COMPRESSED, b"", 6),
        "binary_taken": c_setup("64k", "1m", 2, TAKES_BINARY)
        + c_message(COMPRESSED | BIN, bytes(range(256))[:255], 2, times=2)
        + c_message(BIN, b"\x00\xff", 2),
        "binary_refused": c_setup("64k", "1m", 2) + c_message(COMPRESSED | BIN, b"\x00", 2),
        "bomb_one_frame": c_setup("64k", "4096", 3) + c_message(COMPRESSED | LEVEL9, b"a" * 255, 6, times=255),
        "bomb_fragmented": c_setup("64k", "4096", 0)
        + c_message(COMPRESSED | PING_AFTER, b"{}" * 100, 1, fragments=4, times=200),
        "bomb_many_small": c_setup("1000", "200", 0)
        + c_message(COMPRESSED, b" " * 199, 4) * 5
        + c_message(COMPRESSED, b" " * 201, 4),
        "too_big_on_the_wire": c_setup("16", "1m", 0) + c_message(COMPRESSED, bytes(range(40)), 0),
        "utf8_bad_compressed": c_setup("64k", "1m", 0) + c_message(COMPRESSED, b"ok \xc3\x28", 0),
        "at_the_cap": c_setup("64k", "200", 1) + c_message(COMPRESSED, b"x" * 40, 6, times=1),
    }


# inflate: the first byte picks the cap (bits 0-2, into INFLATE_CAPS: 1, 2,
# 63, 64, 65, 1000, 64 KiB, 1 MiB); the rest is a message's payload.
def deflated(data, wbits=15, level=6, end=zlib.Z_SYNC_FLUSH, strip=True):
    c = zlib.compressobj(level, zlib.DEFLATED, -wbits)
    out = c.compress(data) + c.flush(end)
    if strip and out.endswith(b"\x00\x00\xff\xff"):
        out = out[:-4]
    return out


def inflate_seeds():
    state = json.dumps({"score": [3, 1], "clock": "12:04", "players": ["ann", "bo"] * 20}).encode()
    seeds = {f"window_{w}": bytes([6]) + deflated(state, w) for w in range(9, 16)}
    seeds.update({
        "final_block": bytes([5]) + deflated(state, end=zlib.Z_FINISH),
        "final_block_then_garbage": bytes([5]) + deflated(b"hi", end=zlib.Z_FINISH) + b"\xff\xff",
        "stored": bytes([5]) + deflated(bytes(range(200)), level=0),
        "bomb": bytes([6]) + deflated(b"\x00" * (4 << 20), level=9),
        "at_the_cap": bytes([4]) + deflated(b"a" * 64),
        "one_over_the_cap": bytes([3]) + deflated(b"a" * 64),
        "corrupt": bytes([5]) + b"\xff" * 8,
        "truncated": bytes([5]) + deflated(state)[:20],
        "empty": bytes([0]),
    })
    return seeds


# proto_command: one herald.v1.ClientCommand as protobuf bytes (the op's
# field number in the oneof, then the op's own fields).
def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def pb_bytes(tag, value):
    return varint(tag << 3 | 2) + varint(len(value)) + value


def pb_int(tag, value):
    return varint(tag << 3) + varint(value)


def proto_command_seeds():
    def op(tag, body):
        return pb_bytes(tag, body)

    HELLO, SUB, UNSUB, PUB, ACK, REFRESH, PING, PRESENCE, HISTORY, RPC = range(1, 11)
    return {
        "hello": op(HELLO, pb_bytes(1, b"eyJ.a.b") + pb_bytes(2, b"0f1e") + pb_bytes(3, b'{"device":"phone"}')),
        "hello_empty": op(HELLO, b""),
        "sub": op(SUB, pb_int(1, 1) + pb_bytes(2, b"chat:room-1") + pb_int(3, 41) + pb_bytes(4, b"9f3c")
                  + pb_bytes(5, b'[1,"x"]') + pb_int(6, 1)),
        "unsub": op(UNSUB, pb_int(1, 2) + pb_bytes(2, b"news")),
        "pub": op(PUB, pb_int(1, 3) + pb_bytes(2, b"news") + pb_bytes(3, b' {"a": 1.50, "b": "\\u00e9"}\n')),
        "pub_bad_data": op(PUB, pb_int(1, 3) + pb_bytes(2, b"news") + pb_bytes(3, b'{"a":')),
        "pub_no_topic": op(PUB, pb_int(1, 3) + pb_bytes(3, b"1")),
        "pub_lone_surrogate": op(PUB, pb_int(1, 4) + pb_bytes(2, b"news") + pb_bytes(3, b'"\\ude00"')),
        "ack": op(ACK, pb_bytes(1, b"news") + pb_int(2, 2**64 - 1) + pb_bytes(3, b"e")),
        "refresh": op(REFRESH, pb_int(1, 6) + pb_bytes(2, b"t2")),
        "ping": op(PING, pb_int(1, 7)),
        "presence": op(PRESENCE, pb_int(1, 9) + pb_bytes(2, b"room") + pb_bytes(3, b"c") + pb_int(4, 5)),
        "history": op(HISTORY, pb_int(1, 8) + pb_bytes(2, b"news") + pb_int(3, 1) + pb_bytes(4, b"e")
                      + pb_int(5, 10) + pb_int(6, 1)),
        "rpc": op(RPC, pb_int(1, 10) + pb_bytes(2, b"rooms/create") + pb_bytes(3, b'{"n":1}')),
        "rpc_bad_method": op(RPC, pb_int(1, 11) + pb_bytes(2, b"no spaces")),
        "no_op": b"",
        "unknown_op": pb_bytes(15, pb_int(1, 1)),
        "two_ops": op(PING, pb_int(1, 1)) + op(UNSUB, pb_int(1, 2) + pb_bytes(2, b"n")),
        "truncated": op(SUB, pb_int(1, 1) + pb_bytes(2, b"news"))[:-2],
        "topic_not_utf8": op(SUB, pb_int(1, 1) + pb_bytes(2, b"\xff")),
    }


def write(target, seeds):
    folder = os.path.join(SEEDS, target)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    for name, data in seeds.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("frames", frames_seeds())
    write("frame_script", script_seeds())
    write("decoders", decoder_seeds())
    write("claims", claims_seeds())
    write("compressed_script", compressed_script_seeds())
    write("inflate", inflate_seeds())
    write("proto_command", proto_command_seeds())
