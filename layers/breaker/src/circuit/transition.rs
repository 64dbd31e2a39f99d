//! A circuit's transitions: on its own (trip, half-open, close) or by hand (isolate, close),
//! one at a time under the circuit's mutex, each announced to the hook, the log and the
//! metrics.

use super::word::Word;
use super::{nanos, Circuit};
use crate::hook::{Cause, StateChange};
use crate::CircuitState;
use std::sync::atomic::Ordering::*;
use std::sync::PoisonError;
use std::time::Duration;

impl Circuit {
    /// Moves the circuit from `from`'s period to `to`, unless another transition got there
    /// first. Returns the new word.
    pub(super) fn transition(
        &self,
        from: Word,
        to: CircuitState,
        reason: Cause,
        now: u64,
    ) -> Option<Word> {
        let shared = &self.shared;
        let guard = shared
            .transitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut current = self.word();
        if !current.same_period(from) {
            return None;
        }
        let mut open_for = None;
        match to {
            CircuitState::Open => {
                let trips = shared.trips.load(Relaxed).saturating_add(1);
                shared.trips.store(trips, Relaxed);
                let length = self.break_length(trips);
                open_for = Some(length);
                shared
                    .open_until
                    .store(now.saturating_add(nanos(length)), Release);
            }
            CircuitState::HalfOpen => shared.half_open_since.store(now, Release),
            CircuitState::Closed => {
                shared.consecutive.store(0, Relaxed);
                if let Some(window) = &shared.window {
                    window.reset(window.epoch(now));
                }
                if reason == Cause::ProbesSucceeded {
                    shared.trips.store(0, Relaxed);
                }
            }
            CircuitState::Isolated => {}
        }
        // The first probe is the call that found the break over.
        let next = match to {
            CircuitState::HalfOpen => current.next(to).with_counts(1, 0),
            _ => current.next(to),
        };
        // NOTE: only probe counts change the word outside this lock: retry until it holds.
        while let Err(actual) = shared
            .word
            .compare_exchange(current.0, next.0, AcqRel, Acquire)
        {
            current = Word(actual);
        }
        drop(guard);
        self.announce(from.state(), to, reason, open_for);
        Some(next)
    }

    /// The `trips`th break in a row: the policy's backoff, jittered.
    pub(super) fn break_length(&self, trips: u32) -> Duration {
        let shared = &self.shared;
        let previous = Duration::from_nanos(shared.last_break.load(Relaxed));
        let length = match &shared.policy.rng {
            Some(rng) => {
                let mut rng = rng.lock().unwrap_or_else(PoisonError::into_inner);
                shared.policy.breaks.delay(trips, previous, &mut rng)
            }
            None => shared
                .policy
                .breaks
                .delay(trips, previous, &mut fastrand::Rng::new()),
        };
        shared.last_break.store(nanos(length), Relaxed);
        length
    }

    pub(super) fn announce(
        &self,
        from: CircuitState,
        to: CircuitState,
        reason: Cause,
        open_for: Option<Duration>,
    ) {
        let circuit = &*self.shared.name;
        crate::metrics::transition(circuit, to);
        match to {
            CircuitState::Open | CircuitState::Isolated => tracing::warn!(
                circuit,
                from = from.as_str(),
                to = to.as_str(),
                reason = reason.as_str(),
                open_ms = open_for.map(|d| d.as_millis() as u64),
                "circuit opened"
            ),
            _ => tracing::info!(
                circuit,
                from = from.as_str(),
                to = to.as_str(),
                reason = reason.as_str(),
                "circuit state changed"
            ),
        }
        if let Some(hook) = &self.shared.policy.on_change {
            let change = StateChange {
                circuit,
                from,
                to,
                cause: reason,
                open_for,
            };
            tower_once_core::hook::call("breaker", || hook.on_state_change(&change));
        }
    }

    /// Opens it by hand, until [`close`](Self::close).
    pub(crate) fn isolate(&self) {
        loop {
            let word = self.word();
            if word.state() == CircuitState::Isolated
                || self
                    .transition(word, CircuitState::Isolated, Cause::Manual, self.now())
                    .is_some()
            {
                return;
            }
        }
    }

    /// Closes it by hand with an empty window (also when it is closed already);
    /// `forget_trips` also restarts the break backoff.
    pub(crate) fn close(&self, forget_trips: bool) {
        loop {
            let word = self.word();
            if word.state() == CircuitState::Closed {
                // A new period of the same state: calls under way no longer count.
                let _guard = self
                    .shared
                    .transitions
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if self
                    .shared
                    .word
                    .compare_exchange(word.0, word.next(CircuitState::Closed).0, AcqRel, Acquire)
                    .is_err()
                {
                    continue;
                }
                self.shared.consecutive.store(0, Relaxed);
                if let Some(window) = &self.shared.window {
                    window.reset(window.epoch(self.now()));
                }
                break;
            }
            if self
                .transition(word, CircuitState::Closed, Cause::Manual, self.now())
                .is_some()
            {
                break;
            }
        }
        if forget_trips {
            let _guard = self
                .shared
                .transitions
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.shared.trips.store(0, Relaxed);
        }
    }
}
