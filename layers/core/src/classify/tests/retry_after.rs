//! `retry_after` (the module docs: "after `Retry-After` if sent"): delta-seconds and the three
//! HTTP date formats, past dates as zero, absurd values saturated, anything else ignored, and
//! never a panic.

use super::super::retry_after;
use super::headers;
use http::HeaderMap;
use proptest::prelude::*;
use std::time::{Duration, SystemTime};

#[test]
fn retry_after_dates() {
    let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
    let h = |v| headers(&[("retry-after", v)]);
    assert_eq!(
        retry_after(&h("Sun, 06 Nov 1994 08:49:47 GMT"), now),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        retry_after(&h("Sun, 06 Nov 1994 08:00:00 GMT"), now),
        Some(Duration::ZERO),
        "past"
    );
    assert_eq!(
        retry_after(&h("Sunday, 06-Nov-94 08:49:47 GMT"), now),
        Some(Duration::from_secs(10)),
        "RFC 850"
    );
    assert_eq!(
        retry_after(&h("Sun Nov  6 08:49:47 1994"), now),
        Some(Duration::from_secs(10)),
        "asctime"
    );
    assert_eq!(retry_after(&h("0"), now), Some(Duration::ZERO));
    for bad in ["-5", "1.5", "tomorrow", ""] {
        assert_eq!(retry_after(&h(bad), now), None, "{bad:?}");
    }
    assert_eq!(
        retry_after(&h("99999999999999999999999"), now),
        Some(Duration::from_secs(u64::MAX))
    );
}

proptest! {
    #[test]
    fn delta_seconds_round_trip(secs in 0u64..10_000_000) {
        let h = headers(&[("retry-after", &secs.to_string())]);
        prop_assert_eq!(retry_after(&h, SystemTime::now()), Some(Duration::from_secs(secs)));
    }

    #[test]
    fn http_dates_round_trip(offset in 0u64..1_000_000) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
        let date = httpdate::fmt_http_date(now + Duration::from_secs(offset));
        let h = headers(&[("retry-after", &date)]);
        prop_assert_eq!(retry_after(&h, now), Some(Duration::from_secs(offset)));
    }

    #[test]
    fn arbitrary_values_never_panic(value in "[ -~]{0,40}") {
        if let Ok(v) = value.parse() {
            let mut h = HeaderMap::new();
            h.insert("retry-after", v);
            let _ = retry_after(&h, SystemTime::now());
        }
    }
}
