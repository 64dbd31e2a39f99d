//! From a handler's outcome to a Redis action, in the retry crate's vocabulary.
//!
//! The worker classifies every outcome with a
//! [`Classify`] and acts on the [`Action`]:
//!
//! | action | the worker |
//! |---|---|
//! | `Success` | `XACK` |
//! | `Retry { .. }` | leaves the entry pending: redelivered (by `XAUTOCLAIM`) once idle for `claim_idle` |
//! | `Stop` | dead-letters it (`XADD <dead>` + `XACK` in one `MULTI`) |
//!
//! A `Retry { after: Some(d) }` ([`JobError::redeliver_after`]) makes the entry claimable
//! again after `d` instead of `claim_idle` (its idle time is set to `claim_idle - d`); a stream
//! cannot hold one entry back longer than `claim_idle`, so longer delays are cut to it. The default, [`JobClassifier`], retries every error except those marked
//! permanent ([`Permanence`]). The same classifier suits a `RetryLayer` *inside* the handler,
//! so in-process retries stop on the same permanent errors.

use crate::error::{BoxError, JobError};
use crate::run_once::RunOnceError;
use std::convert::Infallible;
use std::time::Duration;
use tower_once_breaker::BreakerError;
use tower_once_core::attempt::Refused;
use tower_once_retry::classify::{Action, Classify};
use tower_once_retry::RetryError;
use tower_once_timeout::TimeoutError;

/// Whether an error says no further delivery can help.
///
/// Implemented for [`JobError`] and for the wrappers it travels in; a `Box<dyn Error>` is
/// searched (itself and its `source()` chain) for a [`JobError`].
///
/// ```
/// use tower_once_worker::classify::Permanence;
/// use tower_once_worker::{BoxError, JobError};
///
/// let boxed: BoxError = Box::new(JobError::permanent("bad payload"));
/// assert!(boxed.is_permanent());
/// let plain: BoxError = "timeout".into();
/// assert!(!plain.is_permanent());
/// ```
#[diagnostic::on_unimplemented(
    message = "the worker cannot tell whether `{Self}` is permanent",
    label = "`{Self}` does not implement `Permanence`",
    note = "`impl tower_once_worker::classify::Permanence for {Self}` (which errors no delivery can fix), or return `JobError` from the handler"
)]
pub trait Permanence {
    /// `true`: dead-letter now; `false`: leave pending for redelivery.
    fn is_permanent(&self) -> bool;

    /// How long to hold back the next delivery of a transient failure
    /// ([`JobError::redeliver_after`]); `None`: `claim_idle`.
    fn redelivery_delay(&self) -> Option<Duration> {
        None
    }
}

impl Permanence for JobError {
    fn is_permanent(&self) -> bool {
        JobError::is_permanent(self)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        JobError::redelivery_delay(self)
    }
}

impl Permanence for Infallible {
    fn is_permanent(&self) -> bool {
        match *self {}
    }
}

impl Permanence for BoxError {
    fn is_permanent(&self) -> bool {
        job_error(self).is_some_and(|(permanent, _)| permanent)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        job_error(self).and_then(|(_, delay)| delay)
    }
}

/// The first [`JobError`] mark in a boxed error's `source()` chain: its permanence and delay.
/// A circuit breaker's refusal is transient, redelivered when the circuit admits a probe.
fn job_error(error: &BoxError) -> Option<(bool, Option<Duration>)> {
    tower_once_core::chain::find_map(&**error, |err| {
        if let Some(job) = err.downcast_ref::<JobError>() {
            return Some((job.is_permanent(), job.redelivery_delay()));
        }
        if let Some(refused) = err.downcast_ref::<Refused>() {
            return Some((false, refused.retry_after()));
        }
        let job = err.downcast_ref::<RunOnceError<JobError>>()?;
        Some((job.is_permanent(), job.redelivery_delay()))
    })
}

impl<E: Permanence> Permanence for RetryError<E> {
    /// The last attempt's error decides; an operation cut by its deadline is transient.
    fn is_permanent(&self) -> bool {
        self.get_inner().is_some_and(Permanence::is_permanent)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        self.get_inner().and_then(Permanence::redelivery_delay)
    }
}

impl<E: Permanence> Permanence for TimeoutError<E> {
    /// An attempt cut by its timeout is transient (the next delivery may be faster); the inner
    /// error decides otherwise.
    fn is_permanent(&self) -> bool {
        self.get_inner().is_some_and(Permanence::is_permanent)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        self.get_inner().and_then(Permanence::redelivery_delay)
    }
}

impl<E: Permanence> Permanence for BreakerError<E> {
    /// A refusal by an open circuit is transient: the job was not run, and is redelivered when
    /// the circuit admits a probe (or after `claim_idle`). The inner error decides otherwise.
    fn is_permanent(&self) -> bool {
        self.get_inner().is_some_and(Permanence::is_permanent)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        match self.get_inner() {
            Some(inner) => inner.redelivery_delay(),
            None => self.circuit_retry_after(),
        }
    }
}

impl<E: Permanence> Permanence for RunOnceError<E> {
    fn is_permanent(&self) -> bool {
        // Store trouble and a concurrent delivery are transient by nature.
        self.get_inner().is_some_and(Permanence::is_permanent)
    }

    fn redelivery_delay(&self) -> Option<Duration> {
        self.get_inner().and_then(Permanence::redelivery_delay)
    }
}

/// The default classifier: `Ok` succeeds, a [permanent](Permanence) error stops, any other
/// error retries.
///
/// ```
/// use tower_once_retry::classify::{Action, Classify};
/// use tower_once_worker::{classify::JobClassifier, JobError};
///
/// let c = JobClassifier;
/// assert_eq!(c.classify(&Ok::<_, JobError>(())), Action::Success);
/// assert_eq!(c.classify(&Err::<(), _>(JobError::transient("busy"))), Action::Retry { after: None });
/// assert_eq!(c.classify(&Err::<(), _>(JobError::permanent("bad"))), Action::Stop);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct JobClassifier;

impl<R, E: Permanence> Classify<R, E> for JobClassifier {
    fn classify(&self, outcome: &Result<R, E>) -> Action {
        match outcome {
            Ok(_) => Action::Success,
            Err(e) if e.is_permanent() => Action::Stop,
            Err(e) => Action::Retry {
                after: e.redelivery_delay(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_once_retry::GiveUp;

    #[derive(Debug)]
    struct Wrapper(JobError);
    impl std::fmt::Display for Wrapper {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl std::error::Error for Wrapper {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn the_mark_is_found_through_wrappers() {
        let boxed: BoxError = Box::new(Wrapper(JobError::permanent("x")));
        assert!(boxed.is_permanent());
        let retry = RetryError::new(GiveUp::NotRetryable, 1, JobError::permanent("x"));
        assert!(retry.is_permanent());
        let retry = RetryError::new(GiveUp::Exhausted, 4, JobError::transient("x"));
        assert!(!retry.is_permanent());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_mark_is_found_through_run_once() {
        use crate::{Job, JobId, RunOnceLayer};
        use tower::{Layer, ServiceExt};
        let store = tower_once_idempotency::store::MemoryStore::new();
        let layer = RunOnceLayer::new(store);
        let job = |entry: &str| Job::new(entry, JobId::new("job-1").unwrap(), "{}", 1);
        let failing = tower::service_fn(|_: Job| async { Err::<(), _>(JobError::permanent("x")) });
        let Err(error) = layer.layer(failing).oneshot(job("1-0")).await else {
            panic!("the handler failed")
        };
        let boxed: BoxError = Box::new(error);
        assert!(boxed.is_permanent());

        // A delivery of the same entry while it runs.
        let (started, release) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
        let (started, release) = (std::sync::Arc::new(started), std::sync::Arc::new(release));
        let (s, r) = (started.clone(), release.clone());
        let slow = tower::service_fn(move |_: Job| {
            let (s, r) = (s.clone(), r.clone());
            async move {
                s.notify_one();
                r.notified().await;
                Ok::<_, JobError>(())
            }
        });
        let running = tokio::spawn(layer.layer(slow.clone()).oneshot(job("1-0")));
        started.notified().await;
        let Err(in_progress) = layer.layer(slow).oneshot(job("1-0")).await else {
            panic!("the same entry is running")
        };
        assert!(in_progress.is_in_progress());
        assert!(!in_progress.is_permanent());
        release.notify_one();
        assert!(running.await.unwrap().is_ok());
    }

    #[test]
    fn a_redelivery_delay_is_found_through_wrappers_and_becomes_the_retry_after() {
        let delay = Duration::from_millis(1500);
        let boxed: BoxError = Box::new(Wrapper(JobError::transient("429").redeliver_after(delay)));
        assert_eq!(boxed.redelivery_delay(), Some(delay));
        let retry = RetryError::new(
            GiveUp::Exhausted,
            4,
            JobError::transient("429").redeliver_after(delay),
        );
        assert_eq!(retry.redelivery_delay(), Some(delay));
        let outcome: Result<(), BoxError> = Err(boxed);
        assert_eq!(
            JobClassifier.classify(&outcome),
            Action::Retry { after: Some(delay) }
        );
        let plain: BoxError = "timeout".into();
        assert_eq!(plain.redelivery_delay(), None);
    }
}
