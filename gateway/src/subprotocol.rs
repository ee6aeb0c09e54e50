//! The upgrade's `Sec-WebSocket-Protocol` (RFC 6455 4.1, 4.2.2, 11.3.4):
//! which of Herald's two encodings a `/ws` connection speaks.
//!
//! - `herald.v1.protobuf`: every message one protobuf message in one binary
//!   WebSocket message (`herald.v1.ClientCommand` in, `ServerMessage` out).
//! - `herald.v1.json`: the JSON protocol, named. The same as offering
//!   nothing, except that the answer names it.
//!
//! A client offers tokens, comma-separated, in one header or several, in
//! its order of preference: the first one this server speaks is selected
//! and named in the 101. A client that offers neither (or none at all)
//! speaks JSON and gets no header back, as before subprotocols existed:
//! answering a token the client did not offer would fail its handshake.
//! Tokens are compared exactly (RFC 6455 gives them no case folding, and
//! browsers check the answer byte for byte).

use hyper::header::{HeaderMap, HeaderValue, SEC_WEBSOCKET_PROTOCOL};

use crate::deflate::Deflate;
use crate::frame::Format;
use crate::metrics::PROTOCOLS;

/// The binary subprotocol's token.
pub const PROTOBUF: &str = "herald.v1.protobuf";
/// The JSON subprotocol's token.
pub const JSON: &str = "herald.v1.json";

/// What a `/ws` connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subprotocol {
    /// Text messages of JSON: `herald.v1.json`, or nothing offered.
    Json,
    /// Binary messages of protobuf: `herald.v1.protobuf`.
    Protobuf,
}

impl Subprotocol {
    /// The `protocol` label of `herald_connections_protocol_total`
    /// ([`PROTOCOLS`]).
    pub fn label(self) -> &'static str {
        match self {
            Subprotocol::Json => PROTOCOLS[0],
            Subprotocol::Protobuf => PROTOCOLS[1],
        }
    }

    /// How the connection's server frames are written, with the
    /// permessage-deflate parameters the upgrade agreed to, if any.
    pub fn format(self, deflate: Option<Deflate>) -> Format {
        match (self, deflate) {
            (Subprotocol::Protobuf, deflate) => Format::Protobuf(deflate),
            (Subprotocol::Json, Some(deflate)) => Format::WebSocketDeflate(deflate),
            (Subprotocol::Json, None) => Format::WebSocket,
        }
    }
}

/// The subprotocol of an upgrade whose request headers are `request`; the
/// token selected, if one was, added to `response`.
pub fn answer(request: &HeaderMap, response: &mut HeaderMap) -> Subprotocol {
    let offers = request
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok());
    let Some((protocol, token)) = select(offers) else {
        return Subprotocol::Json;
    };
    response.insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(token));
    protocol
}

/// The first token among `headers` (each a `Sec-WebSocket-Protocol` value,
/// in order) that this server speaks, and its name as answered.
pub fn select<'a>(
    headers: impl IntoIterator<Item = &'a str>,
) -> Option<(Subprotocol, &'static str)> {
    headers
        .into_iter()
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .find_map(|token| match token {
            PROTOBUF => Some((Subprotocol::Protobuf, PROTOBUF)),
            JSON => Some((Subprotocol::Json, JSON)),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selected(headers: &[&str]) -> Option<Subprotocol> {
        select(headers.iter().copied()).map(|(protocol, _)| protocol)
    }

    #[test]
    fn the_first_token_spoken_here_is_selected() {
        use Subprotocol::*;
        for (headers, want) in [
            (&[][..], None),
            (&["herald.v1.protobuf"][..], Some(Protobuf)),
            (&["herald.v1.json"], Some(Json)),
            (&["chat, herald.v1.protobuf"], Some(Protobuf)),
            (&[" mqtt ,herald.v1.protobuf , x"], Some(Protobuf)),
            // Several headers are one list (RFC 6455 4.1, RFC 9110 5.3).
            (&["chat", "herald.v1.protobuf"], Some(Protobuf)),
            // The client's order is its preference.
            (&["herald.v1.json, herald.v1.protobuf"], Some(Json)),
            (&["herald.v1.protobuf", "herald.v1.json"], Some(Protobuf)),
            // Neither: JSON, unanswered.
            (&["chat, superchat"], None),
            (&[""], None),
            (&[","], None),
            // Exact tokens only.
            (&["Herald.V1.Protobuf"], None),
            (&["herald.v1.protobuf2"], None),
            (&["herald.v1.protobuf;q=1"], None),
        ] {
            assert_eq!(selected(headers), want, "{headers:?}");
        }
    }

    #[test]
    fn the_answer_names_the_selected_token_only() {
        let mut request = HeaderMap::new();
        request.append(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("chat"));
        request.append(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("herald.v1.protobuf, herald.v1.json"),
        );
        let mut response = HeaderMap::new();
        assert_eq!(answer(&request, &mut response), Subprotocol::Protobuf);
        assert_eq!(
            response
                .get(SEC_WEBSOCKET_PROTOCOL)
                .map(HeaderValue::as_bytes),
            Some(&b"herald.v1.protobuf"[..])
        );

        let mut response = HeaderMap::new();
        let mut chat = HeaderMap::new();
        chat.insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("chat"));
        assert_eq!(answer(&chat, &mut response), Subprotocol::Json);
        assert!(response.is_empty(), "{response:?}");
        assert_eq!(answer(&HeaderMap::new(), &mut response), Subprotocol::Json);
        assert!(response.is_empty());
    }

    #[test]
    fn the_format_follows_the_subprotocol_and_the_compression() {
        let deflate = Deflate {
            window_bits: 15,
            level: 1,
            min_bytes: 256,
        };
        assert_eq!(Subprotocol::Json.format(None), Format::WebSocket);
        assert_eq!(
            Subprotocol::Json.format(Some(deflate)),
            Format::WebSocketDeflate(deflate)
        );
        assert_eq!(Subprotocol::Protobuf.format(None), Format::Protobuf(None));
        assert_eq!(
            Subprotocol::Protobuf.format(Some(deflate)),
            Format::Protobuf(Some(deflate))
        );
    }
}
