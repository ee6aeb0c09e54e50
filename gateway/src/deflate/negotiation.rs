//! The upgrade's `Sec-WebSocket-Extensions` (RFC 7692 section 7.1): the
//! first acceptable permessage-deflate offer is taken, and the answer names
//! what was agreed.
//!
//! An offer is acceptable when every parameter is one RFC 7692 defines,
//! none is repeated, and each value is valid; `server_max_window_bits=8` is
//! declined too (zlib compresses with 9 bits at least). The answer always
//! says `server_no_context_takeover` (each server message compressed on its
//! own, so that one frame serves every subscriber) and
//! `client_no_context_takeover` (which a server may ask whatever the offer
//! says, RFC 7692 7.1.1.2: each client message inflates on its own, so that
//! no connection keeps an inflater), and `server_max_window_bits` where the
//! client asked for one. `client_max_window_bits` is left out: the inflater
//! takes any window up to 15 bits, and a client that offered the parameter
//! uses the largest unless told otherwise.

use hyper::header::{HeaderMap, HeaderValue, SEC_WEBSOCKET_EXTENSIONS};

use super::{Deflate, MAX_WINDOW_BITS, METRICS, MIN_WINDOW_BITS};

/// The extension's name, as offered and answered.
pub const NAME: &str = "permessage-deflate";

/// What the server's compression may be: `websocket.compression`'s level
/// and threshold.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub level: u8,
    pub min_bytes: u32,
}

/// What an upgrade agreed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub deflate: Deflate,
    /// The `Sec-WebSocket-Extensions` value of the answer.
    pub answer: String,
}

/// An upgrade's compression: permessage-deflate where `request` offers it
/// acceptably and `settings` allow it (`None`: compression is off), with
/// the answer added to `response`; `None` otherwise. Counted by outcome.
pub fn answer(
    request: &HeaderMap,
    response: &mut HeaderMap,
    settings: Option<Settings>,
) -> Option<Deflate> {
    let offers = || {
        request
            .get_all(SEC_WEBSOCKET_EXTENSIONS)
            .iter()
            .filter_map(|v| v.to_str().ok())
    };
    if !offered(offers()) {
        return None;
    }
    let outcome = |o: &str| METRICS.negotiated.with_label_values(&[o]).inc();
    let Some(settings) = settings else {
        outcome("disabled");
        return None;
    };
    let agreed = negotiate(offers(), settings).and_then(|agreed| {
        let answer = HeaderValue::from_str(&agreed.answer).ok()?;
        response.insert(SEC_WEBSOCKET_EXTENSIONS, answer);
        Some(agreed.deflate)
    });
    outcome(if agreed.is_some() {
        "accepted"
    } else {
        "declined"
    });
    agreed
}

/// The first acceptable permessage-deflate offer among `headers` (each a
/// `Sec-WebSocket-Extensions` value, in order), or `None`: no compression.
pub fn negotiate<'a>(
    headers: impl IntoIterator<Item = &'a str>,
    settings: Settings,
) -> Option<Agreed> {
    headers
        .into_iter()
        .flat_map(split_elements)
        .find_map(|offer| accept(offer, settings))
}

/// Whether any of `headers` offers permessage-deflate at all.
pub fn offered<'a>(headers: impl IntoIterator<Item = &'a str>) -> bool {
    headers
        .into_iter()
        .flat_map(split_elements)
        .any(|offer| name_of(offer).eq_ignore_ascii_case(NAME))
}

/// The elements of a header value: split at commas outside quoted strings.
fn split_elements(value: &str) -> Vec<&str> {
    let mut elements = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                elements.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    elements.push(&value[start..]);
    elements
        .into_iter()
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect()
}

fn name_of(element: &str) -> &str {
    element.split(';').next().unwrap_or("").trim()
}

/// The parameters an offer makes, as RFC 7692 defines them.
#[derive(Debug, Default)]
struct Offer {
    server_no_context_takeover: bool,
    client_no_context_takeover: bool,
    server_max_window_bits: Option<u8>,
    /// `Some(None)`: offered without a value.
    client_max_window_bits: Option<Option<u8>>,
}

fn accept(element: &str, settings: Settings) -> Option<Agreed> {
    let mut parts = element.split(';');
    if !parts.next()?.trim().eq_ignore_ascii_case(NAME) {
        return None;
    }
    let mut offer = Offer::default();
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((name, value)) => (name.trim(), Some(unquote(value.trim())?)),
            None => (param.trim(), None),
        };
        match (name.to_ascii_lowercase().as_str(), value) {
            ("server_no_context_takeover", None) if !offer.server_no_context_takeover => {
                offer.server_no_context_takeover = true;
            }
            ("client_no_context_takeover", None) if !offer.client_no_context_takeover => {
                offer.client_no_context_takeover = true;
            }
            ("server_max_window_bits", Some(bits)) if offer.server_max_window_bits.is_none() => {
                offer.server_max_window_bits = Some(window_bits(bits)?);
            }
            ("client_max_window_bits", bits) if offer.client_max_window_bits.is_none() => {
                let bits = match bits {
                    Some(value) => Some(window_bits(value)?),
                    None => None,
                };
                offer.client_max_window_bits = Some(bits);
            }
            // Unknown, repeated, or with a value where none belongs (or none
            // where one must be): RFC 7692 7.1 says decline the offer.
            _ => return None,
        }
    }
    let window = offer.server_max_window_bits.unwrap_or(MAX_WINDOW_BITS);
    if window < MIN_WINDOW_BITS {
        return None;
    }
    let mut answer = format!("{NAME}; server_no_context_takeover; client_no_context_takeover");
    if let Some(bits) = offer.server_max_window_bits {
        answer.push_str(&format!("; server_max_window_bits={bits}"));
    }
    Some(Agreed {
        deflate: Deflate {
            window_bits: window,
            level: settings.level,
            min_bytes: settings.min_bytes,
        },
        answer,
    })
}

/// A parameter's value: a token, or a quoted string (RFC 7692 7.1: its
/// unquoted text must be a token too).
fn unquote(value: &str) -> Option<&str> {
    let inner = match value.strip_prefix('"') {
        Some(rest) => rest.strip_suffix('"')?,
        None => value,
    };
    (!inner.is_empty() && inner.bytes().all(|b| b.is_ascii_digit())).then_some(inner)
}

/// A window size: 8 to 15, in decimal without a leading zero.
fn window_bits(value: &str) -> Option<u8> {
    if value.starts_with('0') {
        return None;
    }
    value.parse().ok().filter(|bits| (8..=15).contains(bits))
}
