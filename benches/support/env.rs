//! A bench's settings from the environment: one reader, with the same message for a bad value
//! and a value out of its range.
//!
//! Included by each bench that uses it (`#[path = "support/env.rs"] mod env;`).

use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

/// `name` parsed, or `default` when unset, within `range`.
///
/// # Panics
///
/// If it is set to something that does not parse, or out of `range` (a bench's settings are
/// its operator's: a clear message, not a silent default).
pub(crate) fn var<T>(name: &str, default: T, range: RangeInclusive<T>) -> T
where
    T: FromStr + PartialOrd + std::fmt::Debug,
{
    let value = match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a valid value")),
        Err(_) => default,
    };
    assert!(range.contains(&value), "{name} must be in {range:?}");
    value
}

/// Seconds from `name` (fractions allowed), more than 0 and at most 600.
pub(crate) fn seconds(name: &str, default: f64) -> Duration {
    let secs: f64 = var(name, default, f64::NEG_INFINITY..=f64::INFINITY);
    assert!(secs > 0.0 && secs <= 600.0, "{name} must be in (0, 600]");
    Duration::from_secs_f64(secs)
}
