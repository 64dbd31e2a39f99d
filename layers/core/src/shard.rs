//! Per-thread shards for what every call updates, so that the request path touches no counter
//! shared by all cores: each thread writes its own cache line; readers sum the shards. The
//! retry budget, the retry layer's counters and the circuit breaker's windows are built on it.

use std::cell::Cell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// How many shards: threads beyond this share them (a tokio runtime rarely has more workers on
/// the machines this targets, and sharing only brings back some contention).
pub const SHARDS: usize = 8;

/// This thread's shard, assigned round-robin on first use.
pub fn index() -> usize {
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
pub struct Padded<T>(pub T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A value copied once per shard, each copy in an allocation of its own (cache-line aligned).
/// A response future holds its thread's copy: taking and dropping that reference changes a
/// count only that thread uses, where one `Arc` shared by every call would move its count's
/// cache line between the cores on every call. The copies must behave as one: whatever they
/// change, they share (behind `Arc`s of their own).
#[derive(Debug)]
pub struct PerThread<T> {
    copies: Arc<[Arc<Padded<T>>; SHARDS]>,
}

impl<T: Clone> PerThread<T> {
    /// One copy of `value` per shard.
    pub fn new(value: T) -> Self {
        Self {
            copies: Arc::new(std::array::from_fn(|_| Arc::new(Padded(value.clone())))),
        }
    }
}

impl<T> PerThread<T> {
    /// This thread's copy, to keep.
    pub fn local(&self) -> Arc<Padded<T>> {
        Arc::clone(&self.copies[index()])
    }

    /// This thread's copy, to read now.
    pub fn get(&self) -> &T {
        &self.copies[index()]
    }
}

impl<T> Clone for PerThread<T> {
    fn clone(&self) -> Self {
        Self {
            copies: Arc::clone(&self.copies),
        }
    }
}

/// A counter split over [`SHARDS`] cache lines.
#[derive(Debug, Default)]
pub struct Counter {
    shards: [Padded<AtomicU64>; SHARDS],
}

impl Counter {
    /// Adds one, on this thread's shard.
    pub fn increment(&self) {
        self.shards[index()].0.fetch_add(1, Relaxed);
    }

    /// The sum over every shard.
    pub fn sum(&self) -> u64 {
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
