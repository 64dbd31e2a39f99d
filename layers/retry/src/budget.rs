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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

const SLOTS: u32 = 10;

/// A retry budget shared by clones. See the [module docs](self).
///
/// ```
/// use std::time::Duration;
/// use tower_once_retry::budget::RetryBudget;
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
    slot: Duration,
    origin: Instant,
    state: Mutex<[Slot; SLOTS as usize]>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    epoch: u64,
    requests: u64,
    retries: u64,
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
                slot: window / SLOTS,
                origin: Instant::now(),
                state: Mutex::new([Slot::default(); SLOTS as usize]),
            }),
        }
    }

    /// Records a request (the first attempt of an operation).
    pub fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// [`deposit`](Self::deposit) with a clock reading the caller already has.
    pub(crate) fn deposit_at(&self, now: Instant) {
        self.with_current(now, |slot, _, _| slot.requests += 1);
    }

    /// Asks for one retry: `true` (and counted) if the budget allows it.
    pub fn withdraw(&self) -> bool {
        let (ratio, floor) = (self.shared.ratio, self.shared.floor);
        self.with_current(Instant::now(), |slot, requests, retries| {
            let allowed = ratio * requests as f64 + floor;
            if (retries + 1) as f64 <= allowed {
                slot.retries += 1;
                true
            } else {
                false
            }
        })
    }

    /// Runs `f` on the current slot with the window's totals of requests and retries.
    fn with_current<T>(&self, now: Instant, f: impl FnOnce(&mut Slot, u64, u64) -> T) -> T {
        let shared = &self.shared;
        let elapsed = now.saturating_duration_since(shared.origin);
        let epoch =
            u64::try_from(elapsed.as_nanos() / shared.slot.as_nanos().max(1)).unwrap_or(u64::MAX);
        let mut slots = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut requests, mut retries) = (0, 0);
        for slot in slots.iter() {
            if slot.epoch + u64::from(SLOTS) > epoch && slot.epoch <= epoch {
                requests += slot.requests;
                retries += slot.retries;
            }
        }
        let current = &mut slots[(epoch % u64::from(SLOTS)) as usize];
        if current.epoch != epoch {
            // A slot from an earlier lap of the ring (a whole window ago or more): it was not
            // counted above; start it afresh.
            *current = Slot {
                epoch,
                ..Slot::default()
            };
        }
        f(current, requests, retries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
