//! When a circuit's answer may change, and whether a keyed circuit is idle enough to evict.

use super::{nanos, Circuit};
use crate::config::Trip;
use crate::CircuitState;
use std::sync::atomic::Ordering::*;
use std::time::Duration;
use tokio::time::Instant;

/// How long a keyed circuit must go without a call before it may be evicted.
const IDLE: Duration = Duration::from_secs(60);

impl Circuit {
    /// How long until its answer to a call may change (the break's end, a half-open circuit's
    /// probes); `None` when closed (it admits now) or isolated (only a person changes it).
    pub(crate) fn next_change(&self) -> Option<Duration> {
        let word = self.word();
        let now = self.now();
        match word.state() {
            CircuitState::Closed | CircuitState::Isolated => None,
            CircuitState::Open => Some(Duration::from_nanos(
                self.shared.open_until.load(Acquire).saturating_sub(now),
            )),
            CircuitState::HalfOpen => {
                let ends = self
                    .shared
                    .half_open_since
                    .load(Acquire)
                    .saturating_add(nanos(self.shared.policy.max_half_open_wait));
                Some(Duration::from_nanos(ends.saturating_sub(now)))
            }
        }
    }

    /// Notes that a call goes through it now. Written at most once a second, so a hot keyed
    /// circuit does not make every call write a line that every core shares.
    #[inline]
    pub(crate) fn touch(&self, now: Instant) {
        let secs = self.secs(now);
        if self.shared.last_used.load(Relaxed) != secs {
            self.shared.last_used.store(secs, Relaxed);
        }
    }

    fn secs(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.shared.policy.origin)
            .as_secs()
    }

    /// Whether forgetting it loses nothing: closed, no failure counted, and no call through it
    /// for [`IDLE`] (or its window, when longer): calls still under way would count in a
    /// circuit nobody looks at any more.
    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        let shared = &self.shared;
        if self.state() != CircuitState::Closed || shared.consecutive.load(Relaxed) != 0 {
            return false;
        }
        let quiet = match shared.policy.trip {
            Trip::Ratio { window, .. } => window.max(IDLE),
            Trip::Consecutive(_) => IDLE,
        };
        if self
            .secs(now)
            .saturating_sub(shared.last_used.load(Relaxed))
            < quiet.as_secs()
        {
            return false;
        }
        match &shared.window {
            Some(window) => window.sums(window.epoch(self.now())).failures == 0,
            None => true,
        }
    }
}
