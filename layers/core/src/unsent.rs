//! Whether a failed call certainly never reached the server, so that sending the request
//! elsewhere cannot repeat its effect.
//!
//! A fallback may send *any* request to its secondary when the primary certainly did not run
//! it: its circuit was open, the connection was refused, nothing was written. A request that
//! may have run (a timeout after it was sent, a reset mid-response, a `5xx` from the handler)
//! goes elsewhere only when that is safe for other reasons (an idempotent method, an operation
//! without side effects, idempotency records the secondary shares). [`Unsent`] is the question
//! the errors answer; every answer errs towards "it may have run".
//!
//! | error | unsent when |
//! |---|---|
//! | `std::io::Error` | its kind is `ConnectionRefused` |
//! | a boxed error (`Box<dyn Error + Send + Sync>`) | an error in its `source()` chain is a refused `io::Error` or a [`Refused`] |
//! | [`Refused`] (an open circuit's refusal) | always |
//! | `tower_once_breaker::BreakerError` | the circuit refused the call, or the inner error is unsent |
//! | `tower_once_timeout::{Elapsed, TimeoutError}` | never for an expiry (the call was under way); the inner error's answer otherwise |
//! | `tower_once_retry::RetryError` | no attempt was sent: each one was refused by a circuit, or failed unsent |
//! | `hyper_util::client::legacy::Error` (feature `hyper-util`) | a connect error |
//! | `reqwest::Error` (feature `reqwest`) | a connect error, or a request that could not be built |
//! | `tonic::Status` (feature `tonic`) | an error in its `source()` chain is unsent, as for a boxed error |
//! | `std::convert::Infallible` | (never happens) |
//!
//! ```
//! use tower_once_core::unsent::Unsent;
//!
//! let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
//! assert!(refused.is_unsent());
//! let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
//! assert!(!reset.is_unsent(), "a reset may come after the request was written");
//!
//! let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(refused);
//! assert!(boxed.is_unsent());
//! ```

use crate::attempt::Refused;
use std::error::Error as StdError;
use std::fmt;

/// Whether a failed call certainly never reached the server. See the [module docs](self).
pub trait Unsent {
    /// `true` only when the request certainly was not sent (so it cannot have run); `false`
    /// when it may have been.
    fn is_unsent(&self) -> bool;
}

impl Unsent for std::io::Error {
    fn is_unsent(&self) -> bool {
        self.kind() == std::io::ErrorKind::ConnectionRefused
    }
}

impl Unsent for std::convert::Infallible {
    fn is_unsent(&self) -> bool {
        match *self {}
    }
}

impl Unsent for Refused {
    fn is_unsent(&self) -> bool {
        true
    }
}

impl Unsent for Box<dyn StdError + Send + Sync> {
    fn is_unsent(&self) -> bool {
        chain_is_unsent(&**self)
    }
}

impl Unsent for Box<dyn StdError> {
    fn is_unsent(&self) -> bool {
        chain_is_unsent(&**self)
    }
}

/// Whether an error in `error`'s `source()` chain (itself included) says the request was never
/// sent: a refused connection, or a [`Refused`] attempt.
pub fn chain_is_unsent(error: &(dyn StdError + 'static)) -> bool {
    crate::chain::any(error, |e| {
        e.downcast_ref::<Refused>().is_some()
            || e.downcast_ref::<std::io::Error>()
                .is_some_and(Unsent::is_unsent)
    })
}

#[cfg(feature = "hyper-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "hyper-util")))]
impl Unsent for hyper_util::client::legacy::Error {
    fn is_unsent(&self) -> bool {
        self.is_connect()
    }
}

#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
impl Unsent for reqwest::Error {
    fn is_unsent(&self) -> bool {
        // A request that could not be built, or a connection (TCP, TLS) that never opened.
        self.is_builder() || self.is_connect()
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl Unsent for tonic::Status {
    fn is_unsent(&self) -> bool {
        StdError::source(self).is_some_and(chain_is_unsent)
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("refused before it was sent (the circuit is open)")?;
        match self.retry_after() {
            Some(after) => write!(f, "; a new try is admitted in {after:?}"),
            None => Ok(()),
        }
    }
}

impl StdError for Refused {}
