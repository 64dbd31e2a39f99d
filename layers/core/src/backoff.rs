//! How long to wait before the next attempt: exponential backoff with jitter.
//!
//! The un-jittered delay before retry `n` (the first retry is `n = 1`) is
//! `min(cap, base × multiplier^(n-1))`. Jitter spreads clients that failed together so they do
//! not retry together (see AWS's "Exponential Backoff and Jitter"):
//!
//! | [`Jitter`] | delay before retry `n` |
//! |---|---|
//! | `Full` (default) | uniform in `[0, exp]` |
//! | `Equal` | `exp/2 +` uniform in `[0, exp/2]` |
//! | `Decorrelated` | uniform in `[base, 3 × previous delay]`, at most `cap` |
//! | `None` | `exp` |
//!
//! No delay ever exceeds `cap`. A server's `Retry-After` replaces the backoff for one wait.

use std::fmt;
use std::time::Duration;

/// Jitter applied to the exponential delay. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Jitter {
    /// Uniform in `[0, exp]`: the fewest collisions (the default).
    #[default]
    Full,
    /// Half fixed, half random: never retries immediately.
    Equal,
    /// Grows from the previous delay rather than the attempt number.
    Decorrelated,
    /// No jitter: every client waits exactly the same (for tests and single clients).
    None,
}

/// Exponential backoff settings, checked when built.
///
/// ```
/// use std::time::Duration;
/// use tower_once_core::backoff::{Backoff, Jitter};
///
/// let backoff = Backoff::new(Duration::from_millis(100), 2.0, Duration::from_secs(1))
///     .unwrap()
///     .jitter(Jitter::None);
/// let mut rng = fastrand::Rng::with_seed(7);
/// let delays: Vec<_> = (1..=5).map(|n| backoff.delay(n, Duration::ZERO, &mut rng)).collect();
/// assert_eq!(delays, [100, 200, 400, 800, 1000].map(Duration::from_millis));
///
/// assert!(Backoff::new(Duration::ZERO, 2.0, Duration::from_secs(1)).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    base: Duration,
    multiplier: f64,
    cap: Duration,
    jitter: Jitter,
}

/// [`Backoff::new`] was given settings that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidBackoff(&'static str);

impl fmt::Display for InvalidBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid backoff: {}", self.0)
    }
}

impl std::error::Error for InvalidBackoff {}

impl Default for Backoff {
    /// 500 ms, doubling, capped at 8 s, full jitter.
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            multiplier: 2.0,
            cap: Duration::from_secs(8),
            jitter: Jitter::Full,
        }
    }
}

impl Backoff {
    /// Starts at `base`, grows by `multiplier` per retry, never exceeds `cap`; full jitter.
    ///
    /// Fails if `base` is zero, `multiplier` is not a finite number of at least 1, or `cap` is
    /// below `base`.
    pub fn new(base: Duration, multiplier: f64, cap: Duration) -> Result<Self, InvalidBackoff> {
        if base.is_zero() {
            return Err(InvalidBackoff("base must be positive"));
        }
        if !multiplier.is_finite() || multiplier < 1.0 {
            return Err(InvalidBackoff("multiplier must be finite and at least 1"));
        }
        if cap < base {
            return Err(InvalidBackoff("cap must be at least base"));
        }
        Ok(Self {
            base,
            multiplier,
            cap,
            jitter: Jitter::Full,
        })
    }

    /// Doubling from `base` to at most `cap`, without jitter: the backoff of the loops that
    /// wait out a dependency (an outage, a write sent again), where one process's waits need
    /// no spreading. [`exponential`](Self::exponential) gives the `n`th wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_once_core::backoff::Backoff;
    ///
    /// const AGAIN: Backoff = Backoff::doubling(Duration::from_millis(200), Duration::from_secs(2));
    /// let waits: Vec<_> = (1..=5).map(|n| AGAIN.exponential(n).as_millis()).collect();
    /// assert_eq!(waits, [200, 400, 800, 1600, 2000]);
    /// ```
    ///
    /// # Panics
    ///
    /// If `base` is zero or `cap` is below it (at compile time in a `const`).
    pub const fn doubling(base: Duration, cap: Duration) -> Self {
        assert!(!base.is_zero(), "Backoff::doubling: base must be positive");
        assert!(
            cap.as_nanos() >= base.as_nanos(),
            "Backoff::doubling: cap must be at least base"
        );
        Self {
            base,
            multiplier: 2.0,
            cap,
            jitter: Jitter::None,
        }
    }

    /// Sets the jitter.
    pub const fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The longest any delay can be.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The un-jittered delay before retry `n` (1-based).
    pub fn exponential(&self, n: u32) -> Duration {
        let factor = self.multiplier.powi(n.saturating_sub(1).min(1024) as i32);
        let secs = self.base.as_secs_f64() * factor;
        if !secs.is_finite() || secs >= self.cap.as_secs_f64() {
            self.cap
        } else {
            Duration::from_secs_f64(secs).min(self.cap)
        }
    }

    /// The delay before retry `n` (1-based), given the previous delay (for `Decorrelated`).
    pub fn delay(&self, n: u32, previous: Duration, rng: &mut fastrand::Rng) -> Duration {
        let exp = self.exponential(n);
        let delay = match self.jitter {
            Jitter::None => exp,
            Jitter::Full => uniform(rng, Duration::ZERO, exp),
            Jitter::Equal => exp / 2 + uniform(rng, Duration::ZERO, exp - exp / 2),
            Jitter::Decorrelated => {
                let high = previous.max(self.base).saturating_mul(3).min(self.cap);
                uniform(rng, self.base.min(high), high)
            }
        };
        delay.min(self.cap)
    }
}

/// Uniform in `[low, high]`, at nanosecond resolution.
fn uniform(rng: &mut fastrand::Rng, low: Duration, high: Duration) -> Duration {
    let span = u64::try_from((high - low).as_nanos()).unwrap_or(u64::MAX);
    low + Duration::from_nanos(rng.u64(0..=span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![
            Just(Jitter::Full),
            Just(Jitter::Equal),
            Just(Jitter::Decorrelated),
            Just(Jitter::None)
        ]
    }

    proptest! {
        #[test]
        fn delays_stay_within_their_bounds(
            base_ms in 1u64..5_000,
            multiplier in 1.0f64..10.0,
            extra_cap_ms in 0u64..120_000,
            n in 1u32..200,
            previous_ms in 0u64..200_000,
            jitter in jitter(),
            seed in any::<u64>(),
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = base + Duration::from_millis(extra_cap_ms);
            let backoff = Backoff::new(base, multiplier, cap).unwrap().jitter(jitter);
            let mut rng = fastrand::Rng::with_seed(seed);
            let previous = Duration::from_millis(previous_ms);
            let delay = backoff.delay(n, previous, &mut rng);
            let exp = backoff.exponential(n);
            prop_assert!(delay <= cap, "never above the cap");
            prop_assert!(exp <= cap);
            match jitter {
                Jitter::None => prop_assert_eq!(delay, exp),
                Jitter::Full => prop_assert!(delay <= exp),
                Jitter::Equal => prop_assert!(delay >= exp / 2 && delay <= exp),
                Jitter::Decorrelated => prop_assert!(delay >= base.min(cap)),
            }
        }

        #[test]
        fn the_exponential_never_shrinks(base_ms in 1u64..1000, multiplier in 1.0f64..4.0, n in 1u32..100) {
            let backoff = Backoff::new(Duration::from_millis(base_ms), multiplier, Duration::from_secs(30)).unwrap();
            prop_assert!(backoff.exponential(n + 1) >= backoff.exponential(n));
        }
    }

    #[test]
    fn invalid_settings_are_refused_at_build_time() {
        let s = Duration::from_secs(1);
        assert!(Backoff::new(Duration::ZERO, 2.0, s).is_err());
        assert!(Backoff::new(s, 0.5, s).is_err());
        assert!(Backoff::new(s, f64::NAN, s).is_err());
        assert!(Backoff::new(s, f64::INFINITY, s).is_err());
        assert!(Backoff::new(s, 2.0, s / 2).is_err());
        assert!(Backoff::new(s, 1.0, s).is_ok());
    }

    #[test]
    fn the_default_is_500ms_doubling_capped_at_8s() {
        let b = Backoff::default();
        let exps: Vec<_> = (1..=6).map(|n| b.exponential(n).as_millis()).collect();
        assert_eq!(exps, [500, 1000, 2000, 4000, 8000, 8000]);
        assert_eq!(b.exponential(u32::MAX), Duration::from_secs(8));
    }
}
