//! When the relay claims, purges and wakes: the loop's decisions, without Postgres, so they are
//! unit-tested.

use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::outage::Outage;
use tower_once_core::slots::Slots;
use tower_once_core::time::saturating_add;

/// How often sent rows past `retain_sent` are purged.
pub(super) const PURGE_EVERY: Duration = Duration::from_secs(60);

/// What the relay's loop knows between its steps. Every method takes the time it acts at, so
/// tests drive it with instants of their own.
#[derive(Debug)]
pub(super) struct Schedule {
    slots: Slots,
    poll_interval: Duration,
    /// A claim into any free slot is wanted: the start, a `NOTIFY`, the poll interval, a failed
    /// row due again, a failed claim to try again.
    wanted: bool,
    /// The last claim came back full: more rows are likely due, refill once a quarter of the
    /// slots is free.
    backlog: bool,
    /// After a failed claim, not before this.
    retry_at: Option<Instant>,
    next_poll: Instant,
    next_purge: Instant,
    outage: Outage,
}

impl Schedule {
    pub(super) fn new(slots: Slots, poll_interval: Duration, now: Instant) -> Self {
        Self {
            slots,
            poll_interval,
            wanted: true,
            backlog: false,
            retry_at: None,
            next_poll: now,
            next_purge: now,
            outage: Outage::default(),
        }
    }

    /// How many rows a claim may take now, with `busy` sends in flight; `None` when no claim is
    /// due.
    pub(super) fn claim_now(&self, busy: usize, now: Instant) -> Option<u32> {
        let free = self.slots.free(busy);
        let refill = self.backlog && self.slots.refill(busy);
        let due = free > 0 && (self.wanted || refill) && self.retry_at.is_none_or(|at| at <= now);
        due.then(|| u32::try_from(free).unwrap_or(u32::MAX))
    }

    /// A claim starts: the poll interval counts from here.
    pub(super) fn claiming(&mut self, now: Instant) {
        self.next_poll = saturating_add(now, self.poll_interval);
    }

    /// A claim took `claimed` rows of the `limit` it asked for. Returns whether to claim again
    /// at once (it came back full and slots are still free).
    pub(super) fn claimed(&mut self, claimed: u64, limit: u32, busy: usize) -> bool {
        self.outage.recovered();
        self.retry_at = None;
        self.wanted = false;
        self.backlog = claimed == u64::from(limit);
        self.backlog && self.slots.free(busy) > 0
    }

    /// A claim failed at `now` (Postgres away): the next try waits a backoff. Returns the
    /// failures in a row and whether this one deserves a warning.
    pub(super) fn claim_failed(&mut self, now: Instant) -> (u32, bool) {
        let wait = self.outage.failed();
        self.retry_at = Some(saturating_add(now, wait));
        self.wanted = true;
        (self.outage.failures(), self.outage.should_warn())
    }

    /// Whether to purge sent rows now (never while Postgres is failing).
    pub(super) fn purge_now(&mut self, now: Instant) -> bool {
        if self.outage.is_down() || now < self.next_purge {
            return false;
        }
        self.next_purge = saturating_add(now, PURGE_EVERY);
        true
    }

    /// When to wake if nothing else happens: the next poll, a failed row due again
    /// (`next_retry`), or the end of a claim's backoff when a claim is waiting for it.
    ///
    /// NOTE: every moment returned is in the future, or acted on when it fires (see `woke`),
    /// so the loop never spins.
    pub(super) fn wake_at(&self, busy: usize, next_retry: Option<Instant>) -> Instant {
        let mut wake = self.next_poll;
        if let Some(at) = next_retry {
            wake = wake.min(at);
        }
        let waiting = (self.wanted || self.backlog) && self.slots.free(busy) > 0;
        if let Some(at) = self.retry_at.filter(|_| waiting) {
            wake = wake.min(at);
        }
        wake
    }

    /// The wake-up time came at `now`; `rows_due`: failed rows are due again.
    pub(super) fn woke(&mut self, now: Instant, rows_due: bool) {
        if rows_due {
            self.wanted = true;
        }
        if self.next_poll <= now {
            self.next_poll = saturating_add(now, self.poll_interval);
            self.wanted = true;
        }
        if self.retry_at.is_some_and(|at| at <= now) {
            self.wanted = true;
        }
    }

    /// A `NOTIFY` came (or the listener broke, which may have lost one): claim.
    pub(super) fn notified(&mut self) {
        self.wanted = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLL: Duration = Duration::from_secs(5);

    fn schedule(slots: usize) -> (Schedule, Instant) {
        let now = Instant::now();
        (Schedule::new(Slots::new(slots), POLL, now), now)
    }

    #[tokio::test(start_paused = true)]
    async fn it_claims_at_start_and_again_at_once_while_claims_come_back_full() {
        let (mut s, now) = schedule(8);
        assert_eq!(s.claim_now(0, now), Some(8));
        s.claiming(now);
        assert!(
            s.claimed(8, 8, 0),
            "full, and the sends already ended: claim again"
        );
        assert!(!s.claimed(8, 8, 8), "full, and no slot free: wait");
        assert!(!s.claimed(3, 8, 3), "not full: the backlog is drained");
        assert_eq!(
            s.claim_now(3, now),
            None,
            "nothing wanted until a NOTIFY or the poll"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_refills_once_a_quarter_of_the_slots_is_free() {
        let (mut s, now) = schedule(16);
        s.claiming(now);
        s.claimed(16, 16, 16);
        assert_eq!(s.claim_now(13, now), None, "3 free: less than a quarter");
        assert_eq!(s.claim_now(12, now), Some(4), "a quarter free");
        assert_eq!(s.claim_now(0, now), Some(16));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_claim_backs_off_and_is_tried_again_when_the_backoff_ends() {
        let (mut s, now) = schedule(4);
        s.claiming(now);
        assert_eq!(s.claim_failed(now), (1, true));
        let retry = now + Outage::FIRST;
        assert_eq!(s.claim_now(0, now), None, "not before the backoff");
        assert_eq!(
            s.wake_at(0, None),
            retry,
            "wakes at its end, not at the next poll"
        );
        assert!(
            !s.purge_now(now + PURGE_EVERY),
            "no purge while Postgres fails"
        );
        s.woke(retry, false);
        assert_eq!(s.claim_now(0, retry), Some(4));
        assert_eq!(s.claim_failed(retry).0, 2);
        assert!(
            !s.claim_failed(retry).1,
            "the 3rd failure in a row: no warning"
        );
        s.claimed(0, 4, 0);
        assert!(s.purge_now(retry + PURGE_EVERY), "back up: purges again");
    }

    #[tokio::test(start_paused = true)]
    async fn notifications_failed_rows_and_the_poll_each_want_a_claim() {
        let (mut s, now) = schedule(4);
        s.claiming(now);
        s.claimed(0, 4, 0);
        assert_eq!(s.claim_now(0, now), None);
        s.notified();
        assert_eq!(s.claim_now(0, now), Some(4));
        s.claimed(0, 4, 0);

        let row_due = now + Duration::from_secs(1);
        assert_eq!(s.wake_at(0, Some(row_due)), row_due);
        s.woke(row_due, true);
        assert_eq!(s.claim_now(0, row_due), Some(4));
        s.claiming(row_due);
        s.claimed(0, 4, 0);

        let poll = row_due + POLL;
        assert_eq!(
            s.wake_at(0, None),
            poll,
            "the poll interval counts from the last claim"
        );
        s.woke(poll, false);
        assert_eq!(s.claim_now(0, poll), Some(4));
    }

    #[tokio::test(start_paused = true)]
    async fn the_loop_never_spins() {
        // As the loop drives it: claim when one is due, else sleep until the wake-up time,
        // which is always in the future.
        let (mut s, mut now) = schedule(2);
        for step in 0..500u32 {
            let busy = (step % 3) as usize;
            if let Some(limit) = s.claim_now(busy, now) {
                s.claiming(now);
                match step % 3 {
                    0 => drop(s.claim_failed(now)),
                    1 => drop(s.claimed(u64::from(limit), limit, busy)),
                    _ => drop(s.claimed(0, limit, busy)),
                }
                continue;
            }
            let wake = s.wake_at(
                busy,
                (step % 7 == 0).then(|| now + Duration::from_millis(30)),
            );
            assert!(wake > now, "step {step}: wakes at {wake:?}, now is {now:?}");
            now = wake;
            s.woke(now, step % 7 == 0);
            if step % 11 == 0 {
                s.notified();
            }
        }
    }
}
