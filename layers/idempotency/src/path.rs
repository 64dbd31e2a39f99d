//! The resource a request addresses, as records and fingerprints name it.

/// The path the client addressed (axum's `OriginalUri` behind `Router::nest`), normalized
/// (RFC 3986 §6.2.2): what both the record key and the fingerprint hash, so that a retry that
/// escapes a character differently names the same record and the same request.
pub(crate) fn addressed(parts: &http::request::Parts) -> std::borrow::Cow<'_, str> {
    normalize(addressed_raw(parts))
}

/// The path the client addressed: axum's `OriginalUri` when a nesting router stripped a prefix.
fn addressed_raw(parts: &http::request::Parts) -> &str {
    if let Some(original) = parts.extensions.get::<axum::extract::OriginalUri>() {
        return original.0.path();
    }
    parts.uri.path()
}

/// RFC 3986 §6.2.2 percent-encoding normalization: an escaped unreserved character
/// (`%61` for `a`) is the same resource as the character itself, and routers such as axum
/// route both to one handler, so both name one record. Other escapes keep their meaning
/// (`%2F` is not `/`) and only have their hex digits uppercased.
pub(crate) fn normalize(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.contains('%') {
        return std::borrow::Cow::Borrowed(path);
    }
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&hi), Some(&lo)) => hex(hi).zip(hex(lo)).map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match escaped {
            Some(c) if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') => {
                out.push(c);
                i += 3;
            }
            Some(_) => {
                out.push(b'%');
                out.push(bytes[i + 1].to_ascii_uppercase());
                out.push(bytes[i + 2].to_ascii_uppercase());
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    // Only ASCII was replaced by ASCII, so this is UTF-8 whenever `path` was.
    match String::from_utf8(out) {
        Ok(normalized) => std::borrow::Cow::Owned(normalized),
        Err(_) => std::borrow::Cow::Borrowed(path),
    }
}

fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::normalize as normalize_path;

    #[test]
    fn escaped_unreserved_characters_are_the_characters_themselves() {
        assert_eq!(
            normalize_path("/accounts/%61/charges"),
            "/accounts/a/charges"
        );
        assert_eq!(
            normalize_path("/a%2fb"),
            "/a%2Fb",
            "an escaped slash stays escaped"
        );
        assert_eq!(normalize_path("/%7e%2D%5F"), "/~-_");
        assert_eq!(normalize_path("/100%"), "/100%", "a stray % is kept");
        assert_eq!(normalize_path("/%zz"), "/%zz");
        assert_eq!(normalize_path("/plain"), "/plain");
    }
}
