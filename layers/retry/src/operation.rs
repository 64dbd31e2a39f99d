//! One logical operation: its deadline, its attempts so far, and the decision after each.

use crate::classify::{Action, Classify};
use crate::config::SharedConfig;
use crate::error::GiveUp;
use crate::hook::{OnRetry, RetryEvent};
use std::sync::PoisonError;
use std::time::Duration;
use tokio::time::Instant;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// Everything one logical operation needs between attempts.
pub(crate) struct Operation<S, Req, C, H> {
    pub(crate) service: S,
    pub(crate) request: Req,
    pub(crate) config: SharedConfig<C, H>,
    pub(crate) deadline: Deadline,
    pub(crate) attempt: u32,
    /// Inside another retry layer's attempt: one attempt, bound by this layer's own deadline
    /// when it is the shorter; the outer layer does the retrying.
    pub(crate) nested: bool,
    pub(crate) previous_delay: Duration,
    /// Made on the first jittered wait: most operations never need one.
    pub(crate) rng: Option<fastrand::Rng>,
}

impl<S, Req, C, H> Operation<S, Req, C, H> {
    /// Starts an operation: its deadline is this layer's own or `outer`, whichever ends first. A
    /// `nested` operation (inside another layer's attempt) makes one attempt and is not counted:
    /// the outer layer counts and retries.
    pub(crate) fn start(
        service: S,
        req: Req,
        config: SharedConfig<C, H>,
        outer: Option<Deadline>,
        nested: bool,
    ) -> Self {
        let settings = &config.settings;
        // One clock reading serves the deadline and the budget: it is most of the happy path's cost.
        let now = tokio::time::Instant::now();
        if !nested {
            settings.stats.operation();
            if let Some(budget) = &settings.budget {
                budget.deposit_at(now);
            }
        }
        let own = Deadline::at(tower_once_core::time::saturating_add(
            now,
            settings.deadline,
        ));
        let deadline = match outer {
            Some(outer) if outer < own => outer,
            _ => own,
        };
        Self {
            service,
            request: req,
            config,
            deadline,
            attempt: 0,
            nested,
            previous_delay: Duration::ZERO,
            rng: None,
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
        if self.nested {
            return Err(GiveUp::NotRetryable);
        }
        let after = match self.config.classifier.classify(outcome) {
            Action::Success | Action::Stop => return Err(GiveUp::NotRetryable),
            Action::Retry { after } => after,
        };
        let give_up = |reason: GiveUp| {
            settings.stats.give_up(reason);
            tracing::debug!(
                attempts = self.attempt,
                reason = reason.as_str(),
                "giving up"
            );
            Err(reason)
        };
        if self.attempt >= settings.max_attempts {
            return give_up(GiveUp::Exhausted);
        }
        let (delay, from_server) = match after {
            Some(after) => (after.min(settings.retry_after_cap), true),
            None => {
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
        if Instant::now()
            .checked_add(delay)
            .is_none_or(|end| end >= self.deadline.instant())
        {
            return give_up(GiveUp::Deadline);
        }
        if let Some(budget) = &settings.budget {
            if !budget.withdraw() {
                settings.stats.budget_refusal();
                return give_up(GiveUp::Budget);
            }
        }
        settings.stats.retry(delay);
        self.config.hook.on_retry(&RetryEvent {
            attempt: self.attempt,
            delay,
            from_server,
            outcome,
        });
        tracing::info!(
            attempt = self.attempt,
            delay_ms = delay.as_millis() as u64,
            from_server,
            "retrying"
        );
        self.previous_delay = delay;
        Ok(delay)
    }
}
