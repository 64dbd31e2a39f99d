//! The gRPC `grpc-timeout` header: at most 8 ASCII digits and a unit (`H`, `M`, `S`, `m`, `u`,
//! `n`), per the gRPC over HTTP/2 specification.
//!
//! ```
//! use std::time::Duration;
//! use tower_once_timeout::grpc::{decode, encode};
//!
//! assert_eq!(encode(Duration::from_millis(1500)), "1500000u");
//! assert_eq!(decode(b"1500m"), Some(Duration::from_millis(1500)));
//! assert_eq!(decode(b"123456789S"), None, "nine digits is malformed");
//! ```

use http::HeaderValue;
use std::time::Duration;

/// The header name, `grpc-timeout`.
pub const GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

const MAX: u64 = 99_999_999;

/// Encodes `timeout` in the finest unit whose value fits in 8 digits, rounding up so that a
/// positive time left never encodes as zero. Beyond 99 999 999 hours it is clamped.
pub fn encode(timeout: Duration) -> HeaderValue {
    let nanos = timeout.as_nanos().max(1);
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per, unit) in units {
        let value = nanos.div_ceil(per);
        if value <= u128::from(MAX) {
            return header(value, unit);
        }
    }
    header(u128::from(MAX), 'H')
}

fn header(value: u128, unit: char) -> HeaderValue {
    // Digits and a unit letter are always a valid header value.
    HeaderValue::from_str(&format!("{value}{unit}"))
        .unwrap_or_else(|_| HeaderValue::from_static("99999999H"))
}

/// Decodes a `grpc-timeout` value; `None` when malformed (empty, more than 8 digits, a sign, or
/// an unknown unit).
pub fn decode(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = std::str::from_utf8(digits).ok()?.parse::<u64>().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn edges_of_the_format() {
        assert_eq!(encode(Duration::ZERO), "1n");
        assert_eq!(encode(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(encode(Duration::from_nanos(100_000_000)), "100000u");
        assert_eq!(encode(Duration::from_secs(1)), "1000000u");
        assert_eq!(encode(Duration::from_secs(100_000)), "100000S");
        assert_eq!(encode(Duration::from_millis(99_999_999)), "99999999m");
        assert_eq!(encode(Duration::from_secs(u64::MAX)), "99999999H");
        assert_eq!(
            decode(b"99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
        for bad in [
            &b""[..],
            b"S",
            b"1",
            b"1x",
            b"-1S",
            b"+1S",
            b"123456789n",
            b"1.5S",
            b" 1S",
        ] {
            assert_eq!(decode(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    proptest! {
        #[test]
        fn encoded_values_decode_to_at_least_the_time_left(nanos in 0u64..u64::MAX / 4) {
            let left = Duration::from_nanos(nanos);
            let value = encode(left);
            prop_assert!(value.len() <= 9, "8 digits and a unit: {:?}", value);
            let back = decode(value.as_bytes()).unwrap();
            prop_assert!(back >= left, "never shorter than the time left");
            // Rounded up by less than one unit; a coarser unit is only chosen once the value in
            // it is at least 10^5, so the excess is within 1 part in 10^5 (+1 ns).
            prop_assert!(back - left <= left / 100_000 + Duration::from_nanos(1));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            let _ = decode(&bytes);
        }
    }
}
