//! One logical operation: its deadline, its attempts so far, and the decision after each.

use crate::attempt::is_nested;
use crate::classify::{Action, Classify};
use crate::config::SharedConfig;
use crate::error::{GiveUp, RetryError};
use crate::hook::{OnRetry, RetryEvent};
use std::sync::PoisonError;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_core::attempt::{Attempt, Refused};
use tower_once_core::carrier::Carrier;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Everything one logical operation needs between attempts.
pub(crate) struct Operation<S, Req, C, H> {
    pub(crate) service: S,
    pub(crate) request: Req,
    pub(crate) config: SharedConfig<C, H>,
    /// Known once the operation began (see `deadline()`).
    deadline: Option<Deadline>,
    /// A deadline given with the call (the request's, the scope's), until `begin`.
    outer: Option<Deadline>,
    /// The clock when the operation began (its first poll): the first attempt needs no other
    /// reading. `None` until then.
    started: Option<Instant>,
    /// Whether a deadline in scope while the future was polled moved `deadline` earlier.
    tightened: bool,
    /// Whether the last outcome said the operation is still running elsewhere.
    pub(crate) in_progress: bool,
    /// Whether the last attempt failed at or after the deadline (an inner timeout cut it): it
    /// was sent, so it may still complete.
    cut: bool,
    pub(crate) attempt: u32,
    /// Inside another retry layer's attempt: one attempt, bound by this layer's own deadline
    /// when it is the shorter; the outer layer does the retrying.
    pub(crate) nested: bool,
    pub(crate) previous_delay: Duration,
    /// Made on the first jittered wait: most operations never need one.
    pub(crate) rng: Option<fastrand::Rng>,
    /// Whether a layer below refused the last attempt before sending it (an open circuit).
    pub(crate) refused: Option<Refused>,
    /// How many attempts were refused so: they never reached the dependency.
    refusals: u32,
    /// The last attempt's refusal, when it was one of them.
    last_refusal: Option<Refused>,
}

impl<S, Req, C, H> Operation<S, Req, C, H> {
    /// An operation to start on its first poll: its deadline will be this layer's own or
    /// `outer`, whichever ends first. A `nested` operation (inside another layer's attempt)
    /// makes one attempt: the outer layer counts and retries.
    pub(crate) fn start(
        service: S,
        req: Req,
        config: SharedConfig<C, H>,
        outer: Option<Deadline>,
        nested: bool,
    ) -> Self {
        Self {
            service,
            request: req,
            config,
            deadline: None,
            outer,
            started: None,
            tightened: false,
            in_progress: false,
            cut: false,
            attempt: 0,
            nested,
            previous_delay: Duration::ZERO,
            rng: None,
            refused: None,
            refusals: 0,
            last_refusal: None,
        }
    }

    /// Notes what a layer below said of the attempt just called or polled: refused before it
    /// was sent, or not.
    pub(crate) fn note_refusal(&mut self, refused: Option<Refused>) {
        if refused.is_some() {
            self.refused = refused;
        }
    }

    /// The operation's deadline (once it began; before, the outer one or a far one).
    pub(crate) fn deadline(&self) -> Deadline {
        match (self.deadline, self.outer) {
            (Some(deadline), _) | (None, Some(deadline)) => deadline,
            (None, None) => Deadline::at(far_future()),
        }
    }

    /// Whether [`begin`](Self::begin) ran.
    pub(crate) fn has_begun(&self) -> bool {
        self.started.is_some()
    }

    /// Called on the first poll, before the first attempt. The operation's clock starts now
    /// (a future first polled long after its call, behind a busy `Buffer`, say, still sees
    /// its deadline), and its deadline is the earliest of its own, the outer one and the one
    /// in scope. It is nested if it is polled inside another retry's attempt (a `Buffer`'s
    /// caller polls the future the worker made); otherwise it is counted and deposits in the
    /// budget.
    pub(crate) fn begin(&mut self) {
        // One clock reading serves the deadline and the budget: it is most of the happy path's
        // cost.
        let now = Instant::now();
        self.started = Some(now);
        let own = Deadline::at(tower_once_core::time::saturating_add(
            now,
            self.config.settings.deadline,
        ));
        self.deadline = Some(own.tightened(self.outer).tightened(Deadline::current()));
        self.nested |= is_nested();
        if !self.nested {
            let settings = &self.config.settings;
            settings.stats.operation();
            if let Some(budget) = &settings.budget {
                budget.deposit_at(now);
            }
        }
    }

    /// Moves the deadline earlier when the one in scope (the caller's, while it polls) is
    /// sooner: the enclosing deadline bounds every attempt and every wait. Returns the new one.
    pub(crate) fn tighten(&mut self) -> Option<Deadline> {
        let current = Deadline::current()?;
        (current < self.deadline()).then(|| {
            self.deadline = Some(current);
            self.tightened = true;
            current
        })
    }

    /// Whether the deadline has passed, so that no attempt may start.
    pub(crate) fn is_expired(&self) -> bool {
        match self.started {
            Some(started) if self.attempt == 0 && !self.tightened => {
                self.deadline().instant() <= started
            }
            _ => self.deadline().is_expired(),
        }
    }

    /// The error that ends the operation for `reason`, with the last attempt's error `inner`
    /// (`None` when the layer itself ended it, or the server said the operation is still
    /// running): it says how long the operation ran.
    pub(crate) fn error<E>(&self, reason: GiveUp, inner: Option<E>) -> RetryError<E> {
        let error = match inner {
            Some(inner) if self.cut => {
                RetryError::new(reason, self.attempt, inner).cut_at_deadline()
            }
            Some(inner) => RetryError::new(reason, self.attempt, inner),
            None if self.in_progress => RetryError::in_progress(reason, self.attempt),
            None => RetryError::deadline(self.attempt),
        };
        error
            .with_elapsed(self.started.map_or(Duration::ZERO, |s| s.elapsed()))
            .with_refusals(
                self.refusals,
                self.refusals - u32::from(self.last_refusal.is_some()) + 1 >= self.attempt,
                self.last_refusal,
            )
    }

    /// Ends the operation for `reason`: counted (unless nested, where the outer layer counts)
    /// and traced.
    pub(crate) fn give_up(&self, reason: GiveUp) -> GiveUp {
        if !self.nested {
            self.config.settings.stats.give_up(reason);
        }
        tracing::debug!(
            attempts = self.attempt,
            reason = reason.as_str(),
            "giving up"
        );
        reason
    }
}

impl<S, Req: Carrier, C, H> Operation<S, Req, C, H> {
    /// The mark of the current attempt: its number, or the outer operation's attempt when
    /// this one is nested in it (so the layers below count the outer operation's attempts).
    pub(crate) fn mark(&self) -> Attempt {
        match (self.nested, Attempt::of(&self.request)) {
            (true, Some(outer)) => outer,
            (true, None) => Attempt::current().unwrap_or(Attempt::FIRST),
            (false, _) => Attempt::new(self.attempt),
        }
    }
}

impl<S, Req, C, H> Operation<S, Req, C, H>
where
    S: Service<Req>,
    C: Classify<S::Response, S::Error>,
    H: OnRetry<S::Response, S::Error>,
{
    /// The wait before the next attempt, or why there is none.
    pub(crate) fn next_delay(
        &mut self,
        outcome: &Result<S::Response, S::Error>,
    ) -> Result<Duration, GiveUp> {
        let settings = &self.config.settings;
        let refused = self.refused.take();
        self.last_refusal = refused;
        if refused.is_some() {
            self.refusals += 1;
        }
        if self.nested {
            return Err(GiveUp::NotRetryable);
        }
        let (after, in_progress) = match self.config.classifier.classify(outcome) {
            Action::Retry { after } => (after, false),
            Action::InProgress { after } => (after, true),
            _ => return Err(GiveUp::NotRetryable),
        };
        self.in_progress = in_progress;
        let now = Instant::now();
        // NOTE: a failure at or after the deadline (an inner timeout that the deadline cut
        // short, say) is never retried, whatever the classifier says: no time is left.
        if now >= self.deadline().instant() {
            self.cut = outcome.is_err() && refused.is_none();
            return Err(self.give_up(GiveUp::Deadline));
        }
        if self.attempt >= settings.max_attempts {
            return Err(self.give_up(GiveUp::Exhausted));
        }
        // NOTE: an attempt refused by an open circuit below was never sent: wait until the
        // circuit admits a probe rather than the backoff (never past the deadline), and draw
        // nothing from the budget, for the dependency saw no load.
        let circuit_wait = refused.and_then(Refused::retry_after);
        let (delay, from_server) = match (circuit_wait, after) {
            (Some(wait), _) => (wait, false),
            (None, Some(after)) => (after.min(settings.retry_after_cap), true),
            (None, None) => {
                let rng = self.rng.get_or_insert_with(|| match &settings.rng {
                    Some(seeded) => seeded.lock().unwrap_or_else(PoisonError::into_inner).fork(),
                    None => fastrand::Rng::new(),
                });
                let delay = settings
                    .backoff
                    .delay(self.attempt, self.previous_delay, rng);
                (delay, false)
            }
        };
        // NOTE: never sleep in vain: a wait that ends at or past the deadline leaves no time
        // for the attempt after it, so stop now with what we have.
        if now
            .checked_add(delay)
            .is_none_or(|end| end >= self.deadline().instant())
        {
            let reason = match refused {
                Some(_) => GiveUp::CircuitOpen,
                None => GiveUp::Deadline,
            };
            return Err(self.give_up(reason));
        }
        if let (Some(budget), None) = (&settings.budget, refused) {
            if !budget.withdraw() {
                settings.stats.budget_refusal();
                return Err(self.give_up(GiveUp::Budget));
            }
        }
        settings.stats.retry(delay);
        let event = RetryEvent {
            attempt: self.attempt,
            delay,
            from_server,
            refused: refused.is_some(),
            outcome,
        };
        let hook = &self.config.hook;
        tower_once_core::hook::call("retry", || hook.on_retry(&event));
        tracing::info!(
            attempt = self.attempt,
            delay_ms = delay.as_millis() as u64,
            from_server,
            refused = refused.is_some(),
            "retrying"
        );
        self.previous_delay = delay;
        Ok(delay)
    }
}

/// A deadline no operation reaches (about 100 years away), before the real one is known.
fn far_future() -> Instant {
    tower_once_core::time::saturating_add(Instant::now(), tower_once_core::time::MAX_DURATION)
}
