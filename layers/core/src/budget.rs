//! The retry budget: how much extra load retries may add, shared by every clone of a layer.
//!
//! Per-request attempt limits do not stop a storm: when a dependency is down, every request
//! retries its maximum and the load multiplies. A budget (Finagle's `RetryBudget`, tower's
//! `TpsBudget`, gRPC's retry throttling, Envoy's retry budgets) caps retries as a fraction of
//! recent requests, plus a small floor so a quiet client can still retry:
//!
//! ```text
//! retries allowed in the window = ratio × requests in the window + min_per_sec × window
//! ```
//!
//! The default — 20 % over a 10 s window plus 10 retries per second — means a total outage adds
//! about 20 % load instead of multiplying it by the attempt limit. The window slides in ten
//! slots on tokio's clock. The allowance is computed in floating point, so fractional ratios
//! (say 0.1 %) are exact rather than truncated to zero or rounded up to one.
//!
//! The counts are kept per thread (in 8 shards, each on its own
//! cache line, without a lock): a deposit, made on every call, touches only its thread's
//! counter, so the budget scales across cores. A withdrawal, made only before a retry, sums the
//! shards. The price is approximation at the edges: two retries decided at the same instant on
//! two threads may both pass the last unit of allowance, and a count made while its slot turns
//! over may land in the new slot or be lost.

use crate::shard::{index, Padded, SHARDS};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const SLOTS: u32 = 10;

/// A retry budget shared by clones. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower_once_core::budget::RetryBudget;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // 10 % of requests, no floor.
/// let budget = RetryBudget::new(0.1, 0, Duration::from_secs(10));
/// for _ in 0..20 {
///     budget.deposit();
/// }
/// assert!(budget.withdraw());
/// assert!(budget.withdraw());
/// assert!(!budget.withdraw(), "2 retries for 20 requests is the 10 %");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RetryBudget {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    ratio: f64,
    floor: f64,
    // 2^64 / a slot's length in nanoseconds (a slot is at least 1 ms): a deposit finds its
    // slot with one multiplication, where dividing two `Duration`s is a 128-bit division (a
    // library call, a tenth of a call's time).
    per_slot: u64,
    origin: Instant,
    shards: [Padded<[Slot; SLOTS as usize]>; SHARDS],
}

/// The counts of one time slot, stamped with the slot's epoch.
#[derive(Debug, Default)]
struct Slot {
    epoch: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl Slot {
    /// Makes this the slot of `epoch`, zeroing the counts of an older one.
    fn turn_to(&self, epoch: u64) {
        let seen = self.epoch.load(Ordering::Acquire);
        if seen != epoch
            && self
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.requests.store(0, Ordering::Relaxed);
            self.retries.store(0, Ordering::Relaxed);
        }
    }

    /// Whether this slot's counts are inside the window that ends with `epoch`.
    fn in_window(&self, epoch: u64) -> bool {
        let slot = self.epoch.load(Ordering::Acquire);
        slot <= epoch && slot + u64::from(SLOTS) > epoch
    }
}

impl Default for RetryBudget {
    /// 20 % of requests over 10 s, plus 10 retries per second.
    fn default() -> Self {
        Self::new(0.2, 10, Duration::from_secs(10))
    }
}

impl RetryBudget {
    /// Retries may be `ratio` of the requests in the last `window`, plus `min_per_sec` per second.
    ///
    /// # Panics
    ///
    /// If `ratio` is negative or not finite, or `window` is shorter than 10 ms.
    pub fn new(ratio: f64, min_per_sec: u32, window: Duration) -> Self {
        assert!(
            ratio.is_finite() && ratio >= 0.0,
            "RetryBudget ratio must be a finite, non-negative number"
        );
        assert!(
            window >= Duration::from_millis(10),
            "RetryBudget window must be at least 10 ms"
        );
        Self {
            shared: Arc::new(Shared {
                ratio,
                floor: f64::from(min_per_sec) * window.as_secs_f64(),
                per_slot: u64::MAX / u64::try_from((window / SLOTS).as_nanos()).unwrap_or(u64::MAX),
                origin: Instant::now(),
                shards: Default::default(),
            }),
        }
    }

    /// Records a request (the first attempt of an operation).
    pub fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// [`deposit`](Self::deposit) with a clock reading the caller already has (the retry
    /// layer's hot path reads the clock once).
    #[doc(hidden)]
    pub fn deposit_at(&self, now: Instant) {
        let epoch = self.epoch(now);
        let slot = self.slot_of(epoch);
        slot.turn_to(epoch);
        slot.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget, if the window allows it.
    pub fn withdraw(&self) -> bool {
        let epoch = self.epoch(Instant::now());
        let (mut requests, mut retries) = (0u64, 0u64);
        for shard in &self.shared.shards {
            for slot in shard.0.iter().filter(|slot| slot.in_window(epoch)) {
                requests += slot.requests.load(Ordering::Relaxed);
                retries += slot.retries.load(Ordering::Relaxed);
            }
        }
        let allowed = self.shared.ratio * requests as f64 + self.shared.floor;
        if (retries + 1) as f64 > allowed {
            return false;
        }
        let slot = self.slot_of(epoch);
        slot.turn_to(epoch);
        slot.retries.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.shared.origin);
        let nanos = elapsed
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(elapsed.subsec_nanos()));
        // `nanos / slot`, or one less just after a slot begins (for microseconds in a
        // process up for a day, a couple of milliseconds after a year): harmless where counts
        // are already approximate at the slots' edges.
        ((u128::from(nanos) * u128::from(self.shared.per_slot)) >> 64) as u64
    }

    /// This thread's slot for `epoch`.
    fn slot_of(&self, epoch: u64) -> &Slot {
        &self.shared.shards[index()].0[(epoch % u64::from(SLOTS)) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slot_is_found_by_multiplication_as_by_division() {
        let budget = RetryBudget::new(0.2, 10, Duration::from_secs(10));
        let origin = budget.shared.origin;
        let slot = Duration::from_secs(1);
        // Up to a year, at and around slot boundaries.
        for secs in [0, 1, 9, 10, 59, 3_600, 86_400, 31_536_000] {
            for offset in [Duration::ZERO, Duration::from_millis(5), slot / 2] {
                let at = Duration::from_secs(secs) + offset;
                let exact = at.as_nanos() / slot.as_nanos();
                let found = u128::from(budget.epoch(origin + at));
                assert!(
                    found == exact || (found + 1 == exact && offset.is_zero()),
                    "{at:?}: slot {found}, exactly {exact}"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_allows_retries_without_requests() {
        let budget = RetryBudget::new(0.0, 2, Duration::from_secs(1));
        assert!(budget.withdraw());
        assert!(budget.withdraw());
        assert!(!budget.withdraw());
        tokio::time::advance(Duration::from_millis(1100)).await;
        assert!(budget.withdraw(), "the window slid past the old retries");
    }

    #[tokio::test(start_paused = true)]
    async fn fractional_ratios_are_exact() {
        // 0.1 %: one retry per thousand requests, not one per request (rounding up) nor none.
        let budget = RetryBudget::new(0.001, 0, Duration::from_secs(10));
        for _ in 0..999 {
            budget.deposit();
        }
        assert!(!budget.withdraw(), "999 requests earn 0.999 retries");
        budget.deposit();
        assert!(budget.withdraw());
        assert!(!budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_age_out_of_the_window() {
        let budget = RetryBudget::new(0.5, 0, Duration::from_secs(10));
        for _ in 0..10 {
            budget.deposit();
        }
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!budget.withdraw(), "old requests no longer earn retries");
        budget.deposit();
        budget.deposit();
        assert!(budget.withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn clones_share_one_budget() {
        let budget = RetryBudget::new(1.0, 0, Duration::from_secs(10));
        let clone = budget.clone();
        budget.deposit();
        assert!(clone.withdraw());
        assert!(!budget.withdraw());
    }

    #[test]
    fn deposits_from_many_threads_all_count() {
        let budget = RetryBudget::new(0.5, 0, Duration::from_secs(3600));
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || (0..100).for_each(|_| budget.deposit()))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        // 1 200 requests at 50 %: exactly 600 retries, counted over every thread's shard.
        let allowed = (0..700).filter(|_| budget.withdraw()).count();
        assert_eq!(allowed, 600);
    }
}
