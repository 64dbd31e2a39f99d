//! Parsing and validation of `Idempotency-Key` header values.
//!
//! The IETF draft (draft-ietf-httpapi-idempotency-key-header) defines the field as an RFC 8941
//! `sf-string` (`"..."`); Stripe and most clients send a bare token. Both are accepted:
//!
//! | header value        | key            |
//! |---------------------|----------------|
//! | `8e03978e-40d5`     | `8e03978e-40d5`|
//! | `"8e03978e-40d5"`   | `8e03978e-40d5`|
//! | `"a\"b"`            | `a"b`          |
//! | `""`, `a b`, `"a`   | rejected (400) |
//!
//! A valid key is 1 to `max_len` (default 255) visible ASCII characters (`0x21..=0x7E`) once
//! the optional quoting is removed. Leading and trailing spaces or tabs around the field value
//! are ignored, as RFC 9110 allows.

use std::borrow::Cow;
use std::fmt;

/// The default maximum key length, in characters.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// Why a header value is not a valid idempotency key.
///
/// ```
/// use tower_once_idempotency::key::{parse, InvalidKey};
///
/// assert_eq!(parse(b"", 255), Err(InvalidKey::Empty));
/// assert_eq!(parse(b"a b", 255), Err(InvalidKey::InvalidCharacter));
/// assert_eq!(parse(b"abcd", 3), Err(InvalidKey::TooLong));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidKey {
    /// The value (or the quoted string) is empty.
    Empty,
    /// The key is longer than the configured maximum.
    TooLong,
    /// The key holds a character outside visible ASCII (`0x21..=0x7E`).
    InvalidCharacter,
    /// The value starts with `"` but is not a well-formed RFC 8941 string.
    MalformedString,
    /// The request carries the header more than once.
    Repeated,
}

impl fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "the idempotency key is empty",
            Self::TooLong => "the idempotency key is too long",
            Self::InvalidCharacter => {
                "the idempotency key must contain only visible ASCII characters"
            }
            Self::MalformedString => "the idempotency key is not a well-formed structured string",
            Self::Repeated => "the idempotency key header is repeated",
        })
    }
}

impl std::error::Error for InvalidKey {}

/// Parses one header value into the key it carries.
///
/// Borrows from `value` unless the value is a quoted string with escapes.
///
/// ```
/// use tower_once_idempotency::key::parse;
///
/// assert_eq!(parse(b"order-42", 255).unwrap(), "order-42");
/// assert_eq!(parse(b"\"order-42\"", 255).unwrap(), "order-42");
/// assert_eq!(parse(b"  \"a\\\\b\"  ", 255).unwrap(), "a\\b");
/// ```
pub fn parse(value: &[u8], max_len: usize) -> Result<Cow<'_, str>, InvalidKey> {
    let value = value.trim_ascii();
    let key: Cow<'_, [u8]> = match value.first() {
        Some(b'"') => unquote(value)?,
        _ => Cow::Borrowed(value),
    };
    if key.is_empty() {
        return Err(InvalidKey::Empty);
    }
    if key.len() > max_len {
        return Err(InvalidKey::TooLong);
    }
    if !key.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(InvalidKey::InvalidCharacter);
    }
    // Every byte is visible ASCII, so both conversions are infallible; map rather than unwrap.
    match key {
        Cow::Borrowed(b) => std::str::from_utf8(b)
            .map(Cow::Borrowed)
            .map_err(|_| InvalidKey::InvalidCharacter),
        Cow::Owned(b) => String::from_utf8(b)
            .map(Cow::Owned)
            .map_err(|_| InvalidKey::InvalidCharacter),
    }
}

/// RFC 8941 §4.2.5 sf-string: `DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE`.
fn unquote(value: &[u8]) -> Result<Cow<'_, [u8]>, InvalidKey> {
    let inner = match value {
        [b'"', inner @ .., b'"'] if value.len() >= 2 => inner,
        _ => return Err(InvalidKey::MalformedString),
    };
    if !inner.contains(&b'\\') {
        return if inner.contains(&b'"') {
            Err(InvalidKey::MalformedString)
        } else {
            Ok(Cow::Borrowed(inner))
        };
    }
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(InvalidKey::MalformedString),
            },
            b'"' => return Err(InvalidKey::MalformedString),
            _ => out.push(b),
        }
    }
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_tokens_and_strings() {
        assert_eq!(parse(b"abc", 255).unwrap(), "abc");
        assert_eq!(parse(b"\"abc\"", 255).unwrap(), "abc");
        assert_eq!(parse(b"\t abc \t", 255).unwrap(), "abc");
        assert_eq!(parse(b"\"a\\\"b\"", 255).unwrap(), "a\"b");
        assert_eq!(parse(&[b'k'; 255], 255).unwrap().len(), 255);
    }

    #[test]
    fn rejects_bad_values() {
        assert_eq!(parse(b"", 255), Err(InvalidKey::Empty));
        assert_eq!(parse(b"   ", 255), Err(InvalidKey::Empty));
        assert_eq!(parse(b"\"\"", 255), Err(InvalidKey::Empty));
        assert_eq!(parse(b"\"", 255), Err(InvalidKey::MalformedString));
        assert_eq!(parse(b"\"abc", 255), Err(InvalidKey::MalformedString));
        assert_eq!(parse(b"\"a\"b\"", 255), Err(InvalidKey::MalformedString));
        assert_eq!(parse(b"\"a\\nb\"", 255), Err(InvalidKey::MalformedString));
        assert_eq!(parse(b"\"a\\\"", 255), Err(InvalidKey::MalformedString));
        assert_eq!(parse(b"a b", 255), Err(InvalidKey::InvalidCharacter));
        assert_eq!(parse(b"\"a b\"", 255), Err(InvalidKey::InvalidCharacter));
        assert_eq!(
            parse("ключ".as_bytes(), 255),
            Err(InvalidKey::InvalidCharacter)
        );
        assert_eq!(parse(&[b'k'; 256], 255), Err(InvalidKey::TooLong));
    }

    proptest! {
        #[test]
        fn never_panics_and_output_is_visible_ascii(value in proptest::collection::vec(any::<u8>(), 0..300), max in 1usize..300) {
            if let Ok(key) = parse(&value, max) {
                prop_assert!(!key.is_empty() && key.len() <= max);
                prop_assert!(key.bytes().all(|b| (0x21..=0x7e).contains(&b)));
            }
        }

        #[test]
        fn every_valid_token_round_trips_bare_and_quoted(key in "[!-~]{1,255}") {
            if !key.starts_with('"') {
                prop_assert_eq!(parse(key.as_bytes(), 255).unwrap(), key.as_str());
            }
            let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
            prop_assert_eq!(parse(quoted.as_bytes(), 255).unwrap(), key.as_str());
        }
    }
}
