//! The scopes of a shard ranked by what they hold, kept as they change, so that a full shard
//! finds who pays (and what expired) without visiting every scope.

use std::collections::BinaryHeap;

/// A max-heap of `(rank, scope)` pairs, kept lazily: a scope's rank is pushed each time it
/// changes, and a pair that no longer matches its scope's rank is dropped when it reaches the
/// top. Every scope's current rank is always in the heap, so the top valid pair is the true
/// maximum.
///
/// NOTE: the heap is rebuilt from the scopes once it holds more than twice as many pairs as
/// there are scopes (plus a little), so it stays within a constant factor of the scopes, and the
/// rebuild, a visit of every scope, is paid for by the pushes since the last one.
pub(super) struct Ranking<R> {
    heap: BinaryHeap<(R, u64)>,
}

impl<R> Default for Ranking<R>
where
    R: Ord,
{
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
        }
    }
}

impl<R: Ord + Copy> Ranking<R> {
    /// Records that `scope` now ranks `rank`. `scopes` counts the shard's scopes, and
    /// `current` gives each one's rank, both for a rebuild.
    pub(super) fn push<I>(
        &mut self,
        rank: R,
        scope: u64,
        scopes: usize,
        current: impl FnOnce() -> I,
    ) where
        I: Iterator<Item = (R, u64)>,
    {
        // The top pair is this scope's (a one-scope shard, or the scope holding the most, as
        // it grows): replaced in place, no pair added.
        if let Some(mut top) = self.heap.peek_mut() {
            if top.1 == scope {
                *top = (rank, scope);
                return;
            }
        }
        self.heap.push((rank, scope));
        if self.heap.len() > 2 * scopes + 32 {
            self.heap.clear();
            self.heap.extend(current());
            visited(scopes);
        }
    }

    /// The highest-ranked scope and its rank; `rank_of` gives a scope's current rank (`None`
    /// once it ranks nowhere). Stale pairs met on the way are dropped.
    pub(super) fn top(&mut self, rank_of: impl Fn(u64) -> Option<R>) -> Option<(R, u64)> {
        while let Some(&(rank, scope)) = self.heap.peek() {
            if rank_of(scope) == Some(rank) {
                return Some((rank, scope));
            }
            self.heap.pop();
        }
        None
    }

    /// The pairs the heap holds, stale ones included (test-only).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether `scope`'s rank `rank` is in the heap (test-only).
    #[cfg(test)]
    pub(super) fn holds(&self, rank: R, scope: u64) -> bool {
        self.heap.iter().any(|pair| *pair == (rank, scope))
    }
}

#[cfg(test)]
thread_local! {
    /// Counts the scopes this thread's operations visited one by one (test-only): what an
    /// operation costs beyond its own key's records and scope.
    pub(super) static SCOPE_VISITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[inline(always)]
pub(super) fn visited(_scopes: usize) {
    #[cfg(test)]
    SCOPE_VISITS.with(|visits| visits.set(visits.get() + _scopes));
}
