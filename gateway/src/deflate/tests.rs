use flate2::{Compress, Compression, FlushCompress};
use proptest::prelude::*;

use super::inflate::{InflateError, inflate};
use super::negotiation::{Settings, negotiate};
use super::*;

const SETTINGS: Settings = Settings {
    level: 1,
    min_bytes: 0,
};

fn deflate(window_bits: u8) -> Deflate {
    Deflate {
        window_bits,
        level: 6,
        min_bytes: 0,
    }
}

/// A JSON-like message that compresses.
fn json(len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(format!("{{\"id\":{i},\"name\":\"player {}\"}},", i % 7).as_bytes());
        i += 1;
    }
    out.truncate(len);
    out
}

/// What a client compressing with `window_bits` sends: raw deflate, sync
/// flush, tail removed.
fn client_compress(data: &[u8], window_bits: u8) -> Vec<u8> {
    let mut c = Compress::new_with_window_bits(Compression::default(), false, window_bits);
    let mut out = Vec::with_capacity(data.len() + 1024);
    c.compress_vec(data, &mut out, FlushCompress::Sync)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.ends_with(&TAIL));
    out.truncate(out.len() - 4);
    out
}

#[test]
fn every_window_round_trips_in_several_parts() {
    let data = json(20_000);
    for bits in MIN_WINDOW_BITS..=MAX_WINDOW_BITS {
        let (a, b) = data.split_at(7_000);
        let (out, len) = deflate(bits)
            .compress(&[a, b], 3)
            .unwrap_or_else(|| panic!("{bits}: not compressed"));
        assert_eq!(out.len(), 3 + len);
        assert!(len < data.len() / 3, "{bits}: {len}");
        assert_eq!(inflate(&out[3..], 1 << 20), Ok(data.clone()), "{bits}");
        // And what a client sends with that window inflates too.
        assert_eq!(
            inflate(&client_compress(&data, bits), 1 << 20),
            Ok(data.clone())
        );
    }
}

#[test]
fn small_or_incompressible_messages_stay_as_they_are() {
    let mut d = deflate(15);
    d.min_bytes = 256;
    assert_eq!(d.compress(&[&json(255)], 0), None);
    assert!(d.compress(&[&json(256)], 0).is_some());
    // Random bytes do not shrink.
    let mut x = 0x2545_f491_u32;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    let mut d = deflate(15);
    d.min_bytes = 1;
    assert_eq!(d.compress(&[&noise], 0), None);
    // With no threshold at all, every message is compressed.
    assert!(deflate(15).compress(&[&noise], 0).is_some());
}

#[test]
fn each_message_stands_alone() {
    // server_no_context_takeover: the same message compresses to the same
    // bytes whatever came before, and inflates with a fresh inflater.
    let one = deflate(15).compress(&[&json(3000)], 0);
    let _ = deflate(15).compress(&[&json(5000)], 0);
    let again = deflate(15).compress(&[&json(3000)], 0);
    assert_eq!(one, again);
}

#[test]
fn a_bomb_stops_at_the_cap() {
    // 64 MiB of zeros, about 64 KiB compressed.
    let zeros = vec![0u8; 64 << 20];
    let bomb = client_compress(&zeros, 15);
    assert!(bomb.len() < 100 << 10, "{}", bomb.len());
    let started = std::time::Instant::now();
    assert_eq!(inflate(&bomb, 1 << 16), Err(InflateError::TooBig));
    println!("a 64 MiB bomb refused at 64 KiB in {:?}", started.elapsed());
    // At the cap exactly is fine; one byte over is not.
    let data = json(10_000);
    let wire = client_compress(&data, 15);
    assert_eq!(inflate(&wire, 10_000), Ok(data));
    assert_eq!(inflate(&wire, 9_999), Err(InflateError::TooBig));
}

#[test]
fn garbage_is_corrupt_not_a_panic() {
    assert_eq!(inflate(&[0xff; 16], 1000), Err(InflateError::Corrupt));
    // An empty message (a lone stored block's worth) inflates to nothing.
    assert_eq!(inflate(&[0x00], 1000), Ok(Vec::new()));
    assert_eq!(inflate(&[], 1000), Ok(Vec::new()));
}

#[test]
fn a_final_block_ends_the_message() {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(1000);
    c.compress_vec(b"hello hello hello", &mut out, FlushCompress::Finish)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(inflate(&out, 100), Ok(b"hello hello hello".to_vec()));
}

fn agree(offer: &str) -> Option<(Deflate, String)> {
    negotiate([offer], SETTINGS).map(|a| (a.deflate, a.answer))
}

#[test]
fn offers_are_read_as_rfc_7692_says() {
    let plain = "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
    // What browsers send.
    let (d, answer) = agree("permessage-deflate; client_max_window_bits").unwrap_or_default_none();
    assert_eq!((d.window_bits, answer.as_str()), (15, plain));
    assert_eq!(
        agree("permessage-deflate").map(|a| a.1).as_deref(),
        Some(plain)
    );
    // A server window asked for is honoured and named.
    let (d, answer) =
        agree("permessage-deflate; server_max_window_bits=10").unwrap_or_default_none();
    assert_eq!(d.window_bits, 10);
    assert!(answer.ends_with("; server_max_window_bits=10"), "{answer}");
    let (d, _) =
        agree("permessage-deflate; server_max_window_bits=\"12\"").unwrap_or_default_none();
    assert_eq!(d.window_bits, 12);
    // Invalid offers are declined: the next acceptable one is taken.
    for bad in [
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits=8",
        "permessage-deflate; server_max_window_bits=09",
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; unknown",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; client_no_context_takeover=1",
        "x-webkit-deflate-frame",
    ] {
        assert_eq!(agree(bad), None, "{bad}");
    }
    let two = "permessage-deflate; server_max_window_bits=8, permessage-deflate; client_max_window_bits=10";
    assert_eq!(agree(two).map(|a| a.0.window_bits), Some(15));
    // Across header lines, after another extension.
    let agreed = negotiate(["foo, bar; x=1", "permessage-deflate"], SETTINGS);
    assert!(agreed.is_some());
    assert!(super::negotiation::offered(["foo", "Permessage-Deflate"]));
    assert!(!super::negotiation::offered(["foo"]));
}

trait OrNone {
    fn unwrap_or_default_none(self) -> (Deflate, String);
}

impl OrNone for Option<(Deflate, String)> {
    fn unwrap_or_default_none(self) -> (Deflate, String) {
        self.unwrap_or_else(|| panic!("declined"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn anything_round_trips(
        data in proptest::collection::vec(any::<u8>(), 0..5000),
        text in "[a-z{}\":,0-9 ]{0,3000}",
        bits in MIN_WINDOW_BITS..=MAX_WINDOW_BITS,
        level in 1u8..=9,
        cut in 0usize..5000,
    ) {
        let d = Deflate { window_bits: bits, level, min_bytes: 0 };
        for message in [data.as_slice(), text.as_bytes()] {
            let (a, b) = message.split_at(cut.min(message.len()));
            if let Some((out, _)) = d.compress(&[a, b], 0) {
                prop_assert_eq!(inflate(&out, 1 << 20), Ok(message.to_vec()));
            }
        }
    }

    #[test]
    fn any_bytes_inflate_or_fail_within_the_cap(
        data in proptest::collection::vec(any::<u8>(), 0..2000),
        cap in 1usize..10_000,
    ) {
        if let Ok(out) = inflate(&data, cap) {
            prop_assert!(out.len() <= cap);
        }
    }
}

/// The figures behind the default level (`config::compression`): size and
/// time per message at levels 1, 6 and 9 on a chat message and a state
/// (printed with `--nocapture`; the codec is optimised in test builds too).
#[test]
fn level_figures() {
    let chat = br#"{"op":"msg","topic":"chat:lobby","seq":1234,"data":{"user":"alice","text":"hello everyone, the match starts in five minutes, bring snacks","ts":1733580000}}"#.to_vec();
    let state = json(3000);
    for (name, message) in [("chat", chat), ("state 3 KiB", state)] {
        for level in [1u8, 6, 9] {
            let d = Deflate {
                window_bits: 15,
                level,
                min_bytes: 0,
            };
            let rounds = 2000;
            let started = std::time::Instant::now();
            let mut size = 0;
            for _ in 0..rounds {
                size = d.compress(&[&message], 0).map_or(message.len(), |(_, n)| n);
            }
            let each = started.elapsed() / rounds;
            println!(
                "{name}: {} bytes -> level {level}: {size} bytes ({:.0}%), {each:?} per message",
                message.len(),
                100.0 * size as f64 / message.len() as f64
            );
        }
    }
}
