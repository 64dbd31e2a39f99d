//! Per-thread shards for what every call updates, so that the request path touches no counter
//! shared by all cores: each thread writes its own cache line; readers sum the shards.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// How many shards: threads beyond this share them (a tokio runtime rarely has more workers on
/// the machines this targets, and sharing only brings back some contention).
pub(crate) const SHARDS: usize = 8;

/// This thread's shard, assigned round-robin on first use.
pub(crate) fn index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
    }
    INDEX.with(|index| match index.get() {
        Some(i) => i,
        None => {
            let i = NEXT.fetch_add(1, Relaxed) % SHARDS;
            index.set(Some(i));
            i
        }
    })
}

/// A value alone on its cache line, so that two shards never share one.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct Padded<T>(pub(crate) T);

/// A counter split over [`SHARDS`] cache lines.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    shards: [Padded<AtomicU64>; SHARDS],
}

impl Counter {
    pub(crate) fn increment(&self) {
        self.shards[index()].0.fetch_add(1, Relaxed);
    }

    pub(crate) fn sum(&self) -> u64 {
        self.shards.iter().map(|s| s.0.load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_from_many_threads_all_count() {
        let counter = std::sync::Arc::new(Counter::default());
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| counter.increment()))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(counter.sum(), 12_000);
    }
}
