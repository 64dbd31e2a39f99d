//! The headers of a response that may be stored: what the layer and a handler completing in
//! its own transaction both keep.

use http::{header, HeaderMap, HeaderName};

/// Hop-by-hop headers (RFC 9110 §7.6.1) describe one connection, never a stored response.
///
/// NOTE: `Trailer` is not among them: it announces the fields sent in the trailers, which a
/// replay sends too (HTTP/1.1 sends trailers only for fields it names).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// The headers to store: all but hop-by-hop ones, those the `Connection` header names, `Upgrade`
/// and the configured deny-list.
pub(crate) fn storable_headers(headers: &HeaderMap, strip: &[HeaderName]) -> HeaderMap {
    // One lookup of `Connection`, not one per header.
    let connection = headers.get_all(header::CONNECTION);
    let named_by_connection = |name: &HeaderName| {
        connection.iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
            })
        })
    };
    let dropped = |name: &HeaderName| {
        HOP_BY_HOP.contains(name)
            || name == header::UPGRADE
            || strip.contains(name)
            || named_by_connection(name)
    };
    // Usually nothing is dropped: a clone copies the map without hashing each name again.
    if !headers.keys().any(dropped) {
        return headers.clone();
    }
    let mut kept = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !dropped(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    kept
}
