//! The sampling window of a circuit in ratio mode: successes and failures over the last
//! `window`, in ten buckets, kept per thread.
//!
//! A call's outcome touches only its thread's shard (its own cache line): a success is one
//! relaxed increment there, so the happy path shares no written memory between cores. A
//! failure then sums every shard's buckets to decide whether to trip (80 reads, only on
//! failures). The price is approximation at the edges, as for the retry budget: a count made
//! while its bucket turns over may land in the new bucket or be lost.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;
use tower_once_core::shard::{index, Padded, SHARDS};

pub(crate) const BUCKETS: u32 = 10;

#[derive(Debug)]
pub(crate) struct Window {
    // 2^64 / a bucket's length in nanoseconds: a bucket is found with one multiplication.
    per_bucket: u64,
    // Buckets before this one are ignored: the window is emptied when the circuit closes.
    floor: AtomicU32,
    shards: [Padded<[Bucket; BUCKETS as usize]>; SHARDS],
}

#[derive(Debug, Default)]
struct Bucket {
    epoch: AtomicU32,
    successes: AtomicU32,
    failures: AtomicU32,
}

/// What the window holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sums {
    pub(crate) failures: u64,
    pub(crate) total: u64,
}

impl Window {
    /// A window of `length` (at least 10 ms: checked by the layer).
    pub(crate) fn new(length: Duration) -> Self {
        let bucket = u64::try_from((length / BUCKETS).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        Self {
            per_bucket: u64::MAX / bucket,
            floor: AtomicU32::new(0),
            shards: Default::default(),
        }
    }

    /// The bucket `nanos` (since the circuit's origin) falls in.
    pub(crate) fn epoch(&self, nanos: u64) -> u32 {
        // Truncated: 2^32 buckets of at least a millisecond is 49 days, and every comparison
        // below is wrapping.
        ((u128::from(nanos) * u128::from(self.per_bucket)) >> 64) as u32
    }

    /// Counts one outcome in this thread's shard.
    pub(crate) fn record(&self, epoch: u32, failure: bool) {
        let bucket = &self.shards[index()].0[(epoch % BUCKETS) as usize];
        let seen = bucket.epoch.load(Relaxed);
        if seen != epoch {
            // A new bucket: this shard's old counts there are out of the window. Only this
            // thread (or the few that share its shard) writes here, so the turn-over is a
            // plain store, not a compare-and-swap.
            bucket.successes.store(0, Relaxed);
            bucket.failures.store(0, Relaxed);
            bucket.epoch.store(epoch, Relaxed);
        }
        let counter = if failure {
            &bucket.failures
        } else {
            &bucket.successes
        };
        counter.fetch_add(1, Relaxed);
    }

    /// The counts of the buckets in the window that ends with `epoch`.
    pub(crate) fn sums(&self, epoch: u32) -> Sums {
        let floor = self.floor.load(Relaxed);
        let mut sums = Sums::default();
        for shard in &self.shards {
            for bucket in &shard.0 {
                let at = bucket.epoch.load(Relaxed);
                let age = epoch.wrapping_sub(at);
                // In the window, and not before the floor (both wrapping).
                if age < BUCKETS && (at.wrapping_sub(floor) as i32) >= 0 {
                    let failures = u64::from(bucket.failures.load(Relaxed));
                    sums.failures += failures;
                    sums.total += failures + u64::from(bucket.successes.load(Relaxed));
                }
            }
        }
        sums
    }

    /// Forgets everything counted before `epoch`'s bucket, and that bucket's counts too.
    pub(crate) fn reset(&self, epoch: u32) {
        self.floor.store(epoch, Relaxed);
        for shard in &self.shards {
            let bucket = &shard.0[(epoch % BUCKETS) as usize];
            bucket.successes.store(0, Relaxed);
            bucket.failures.store(0, Relaxed);
            bucket.epoch.store(epoch, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_age_out_and_a_reset_forgets_them() {
        let w = Window::new(Duration::from_secs(10));
        let at = |secs: f64| w.epoch((secs * 1e9) as u64);
        w.record(at(0.5), true);
        w.record(at(1.5), false);
        w.record(at(9.5), true);
        assert_eq!(
            w.sums(at(9.5)),
            Sums {
                failures: 2,
                total: 3
            }
        );
        assert_eq!(
            w.sums(at(10.5)),
            Sums {
                failures: 1,
                total: 2
            },
            "the first second left the window"
        );
        w.reset(at(10.5));
        assert_eq!(w.sums(at(10.5)), Sums::default());
        w.record(at(10.6), true);
        assert_eq!(w.sums(at(11.0)).failures, 1, "counts after the reset stay");
    }

    #[test]
    fn counts_from_many_threads_all_land() {
        let w = std::sync::Arc::new(Window::new(Duration::from_secs(3600)));
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || (0..100).for_each(|i| w.record(0, i % 4 == 0)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(
            w.sums(0),
            Sums {
                failures: 300,
                total: 1200
            }
        );
    }
}
