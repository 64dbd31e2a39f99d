//! The observed latency of first attempts, and the percentile the hedging delay follows.
//!
//! Latencies go into a histogram of 128 log-spaced buckets (a quarter octave each, from 1 µs to
//! about an hour) per period, kept per thread: a recording is one relaxed increment on the
//! thread's own shard. The delay is computed once per period, from the period before (as
//! tower's hedge does, with a rotating histogram), by the first call that sees the new period,
//! and read by every call with one load. Until a period with at least `min_data_points`
//! latencies has passed, there is no delay, and no hedge.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::shard::{index, Padded, SHARDS};

const BUCKETS: usize = 128;
/// No delay known yet.
const NONE: u64 = u64::MAX;

#[derive(Debug)]
pub(crate) struct Latency {
    percentile: f64,
    min_points: u64,
    period: u64,
    origin: Instant,
    /// The period the delay was computed for, and the delay (nanoseconds).
    computed: AtomicU64,
    delay: AtomicU64,
    shards: [Padded<[Window; 2]>; SHARDS],
}

#[derive(Debug)]
struct Window {
    period: AtomicU64,
    buckets: [AtomicU32; BUCKETS],
}

impl Default for Window {
    fn default() -> Self {
        Self {
            period: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }
}

impl Latency {
    /// `percentile` in `(0, 1)`, over periods of `period` (at least 1 ms: checked by the layer).
    pub(crate) fn new(percentile: f64, min_points: u64, period: Duration) -> Self {
        Self {
            percentile,
            min_points,
            period: u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1),
            origin: Instant::now(),
            computed: AtomicU64::new(0),
            delay: AtomicU64::new(NONE),
            shards: Default::default(),
        }
    }

    fn period_at(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX) / self.period
    }

    /// Counts one latency in this thread's shard.
    pub(crate) fn record(&self, now: Instant, latency: Duration) {
        let period = self.period_at(now);
        let window = &self.shards[index()].0[(period % 2) as usize];
        if window.period.load(Relaxed) != period {
            // A new period for this shard: its counts from two periods ago go. Only this
            // thread (or the few sharing its shard) writes here.
            for bucket in &window.buckets {
                bucket.store(0, Relaxed);
            }
            window.period.store(period, Relaxed);
        }
        window.buckets[bucket_of(latency)].fetch_add(1, Relaxed);
    }

    /// The delay before a hedge: the percentile of the last full period's latencies, or
    /// `None` while it had too few.
    pub(crate) fn delay(&self, now: Instant) -> Option<Duration> {
        let period = self.period_at(now);
        let computed = self.computed.load(Acquire);
        if computed != period
            && self
                .computed
                .compare_exchange(computed, period, AcqRel, Acquire)
                .is_ok()
        {
            // NOTE: one call per period computes it; the others read the last value meanwhile.
            let delay = self.percentile_of(period.wrapping_sub(1));
            self.delay
                .store(delay.map_or(NONE, |d| d.as_nanos() as u64), Release);
        }
        match self.delay.load(Acquire) {
            NONE => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    fn percentile_of(&self, period: u64) -> Option<Duration> {
        let mut counts = [0u64; BUCKETS];
        for shard in &self.shards {
            let window = &shard.0[(period % 2) as usize];
            if window.period.load(Relaxed) == period {
                for (count, bucket) in counts.iter_mut().zip(&window.buckets) {
                    *count += u64::from(bucket.load(Relaxed));
                }
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 || total < self.min_points {
            return None;
        }
        let rank = ((self.percentile * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(upper_bound(i));
            }
        }
        Some(upper_bound(BUCKETS - 1))
    }
}

/// The bucket of a latency: its microseconds below 4, else a quarter octave of them.
fn bucket_of(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    if us < 4 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize;
    let quarter = ((us >> (octave - 2)) & 0b11) as usize;
    (4 + (octave - 2) * 4 + quarter).min(BUCKETS - 1)
}

/// The largest latency of a bucket.
fn upper_bound(bucket: usize) -> Duration {
    if bucket < 4 {
        return Duration::from_micros(bucket as u64);
    }
    let (octave, quarter) = ((bucket - 4) / 4 + 2, ((bucket - 4) % 4) as u64);
    Duration::from_micros(((4 + quarter + 1) << (octave - 2)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_bound_their_latencies() {
        let mut last = 0;
        for us in [
            1u64, 2, 3, 5, 8, 100, 999, 1_000, 1_500, 65_000, 1_000_000, 60_000_000,
        ] {
            let b = bucket_of(Duration::from_micros(us));
            assert!(b >= last, "{us}");
            last = b;
            if b < BUCKETS - 1 {
                assert!(upper_bound(b) >= Duration::from_micros(us), "{us} in {b}");
                // A quarter octave: within 25 % of the latency.
                assert!(
                    upper_bound(b).as_micros() as f64 <= us as f64 * 1.25 + 1.0,
                    "{us}"
                );
            }
        }
        assert_eq!(bucket_of(Duration::MAX), BUCKETS - 1);
        assert_eq!(bucket_of(Duration::ZERO), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_follows_the_last_periods_percentile() {
        let latency = Latency::new(0.9, 10, Duration::from_secs(1));
        let now = Instant::now();
        assert_eq!(latency.delay(now), None, "nothing observed");
        for i in 1..=100u64 {
            latency.record(now, Duration::from_millis(i));
        }
        assert_eq!(latency.delay(now), None, "the period is not over");
        tokio::time::advance(Duration::from_secs(1)).await;
        let delay = latency.delay(Instant::now()).unwrap();
        assert!(
            delay >= Duration::from_millis(90) && delay <= Duration::from_millis(113),
            "{delay:?}"
        );
        // A period with too few latencies: no delay.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(latency.delay(Instant::now()), None);
    }
}
