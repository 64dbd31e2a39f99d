//! When a loop with a bounded number of tasks in flight fetches more work.

/// Up to `capacity` tasks in flight, refilled in batches: once a quarter of the slots is free,
/// or at once when nothing is running. A fetch then fills every free slot, so fetches stay
/// amortised when tasks finish at different times, and a slow task holds only its own slot.
///
/// ```
/// use tower_once_core::slots::Slots;
///
/// let slots = Slots::new(16);
/// assert_eq!(slots.free(10), 6);
/// assert!(!slots.refill(13), "3 free: wait for a quarter");
/// assert!(slots.refill(12), "4 free: a quarter");
/// assert!(slots.refill(0), "nothing running");
/// assert!(!slots.refill(16), "full");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Slots {
    capacity: usize,
    refill_at: usize,
}

impl Slots {
    /// `capacity` slots (at least one).
    pub const fn new(capacity: usize) -> Self {
        let capacity = if capacity == 0 { 1 } else { capacity };
        let quarter = capacity / 4;
        Self {
            capacity,
            refill_at: if quarter == 0 { 1 } else { quarter },
        }
    }

    /// How many slots there are.
    pub const fn capacity(&self) -> usize {
        self.capacity
    }

    /// How many are free with `busy` in flight.
    pub const fn free(&self, busy: usize) -> usize {
        self.capacity.saturating_sub(busy)
    }

    /// Whether to fetch more work with `busy` in flight: a quarter of the slots is free, or
    /// nothing runs (and one is free).
    pub const fn refill(&self, busy: usize) -> bool {
        let free = self.free(busy);
        free > 0 && (free >= self.refill_at || busy == 0)
    }
}
