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
//! A stream cannot delay one entry, so a `Retry`'s `after` is not honoured: redelivery waits
//! `claim_idle`. The default, [`JobClassifier`], retries every error except those marked
//! permanent ([`Permanence`]). The same classifier suits a `RetryLayer` *inside* the handler,
//! so in-process retries stop on the same permanent errors.

use crate::error::{BoxError, JobError};
use crate::run_once::RunOnceError;
use std::convert::Infallible;
use tower_once_retry::classify::{Action, Classify};
use tower_once_retry::RetryError;

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
pub trait Permanence {
    /// `true`: dead-letter now; `false`: leave pending for redelivery.
    fn is_permanent(&self) -> bool;
}

impl Permanence for JobError {
    fn is_permanent(&self) -> bool {
        JobError::is_permanent(self)
    }
}

impl Permanence for Infallible {
    fn is_permanent(&self) -> bool {
        match *self {}
    }
}

impl Permanence for BoxError {
    fn is_permanent(&self) -> bool {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(&**self);
        // Error chains are short; the bound guards against a cyclic `source()`.
        for _ in 0..32 {
            let Some(err) = current else { return false };
            if let Some(job) = err.downcast_ref::<JobError>() {
                return job.is_permanent();
            }
            if let Some(job) = err.downcast_ref::<RunOnceError<JobError>>() {
                return job.is_permanent();
            }
            current = err.source();
        }
        false
    }
}

impl<E: Permanence> Permanence for RetryError<E> {
    /// The last attempt's error decides; an operation cut by its deadline is transient.
    fn is_permanent(&self) -> bool {
        self.get_inner().is_some_and(Permanence::is_permanent)
    }
}

impl<E: Permanence> Permanence for RunOnceError<E> {
    fn is_permanent(&self) -> bool {
        // Store trouble and a concurrent delivery are transient by nature.
        self.get_inner().is_some_and(Permanence::is_permanent)
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
            Err(_) => Action::Retry { after: None },
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
        let boxed: BoxError = Box::new(RunOnceError::inner(JobError::permanent("x")));
        assert!(boxed.is_permanent());
        let in_progress: RunOnceError<JobError> = RunOnceError::in_progress();
        assert!(!in_progress.is_permanent());
    }
}
