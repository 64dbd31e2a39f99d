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
//! | a boxed error (`Box<dyn Error + Send + Sync>`, what a `tower::buffer::Buffer` returns) | the boxed error itself is a refused `io::Error`, a [`Refused`], or (with the features) a hyper-util connect error or a reqwest error that could not be built; never for what its `source()` chain holds: a wrapper there (a retry layer's error over several attempts) may hide an attempt that was sent |
//! | [`Refused`] (an open circuit's refusal) | always |
//! | `tower_once_breaker::BreakerError` | the circuit refused the call, or the inner error is unsent |
//! | `tower_once_timeout::{Elapsed, TimeoutError}` | never for an expiry (the call was under way); the inner error's answer otherwise |
//! | `tower_once_retry::RetryError` | no attempt was sent: each one was refused by a circuit, or failed unsent |
//! | `hyper_util::client::legacy::Error` (feature `hyper-util`) | a connect error |
//! | `reqwest::Error` (feature `reqwest`) | a request that could not be built (not a connect error: reqwest follows redirects, and a redirect's connect error comes after the request ran) |
//! | `tonic::Status` (feature `tonic`) | its source is unsent, as for a boxed error |
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
        erased_is_unsent(&**self)
    }
}

impl Unsent for Box<dyn StdError> {
    fn is_unsent(&self) -> bool {
        erased_is_unsent(&**self)
    }
}

/// Whether a type-erased error says the request was never sent: it is a refused connection, a
/// [`Refused`] attempt, or (with the features) a hyper-util connect error or a reqwest error
/// that could not be built. Only the error itself is asked, never its sources: a wrapper in the
/// chain may hide an attempt that was sent.
pub fn erased_is_unsent(error: &(dyn StdError + 'static)) -> bool {
    if error.downcast_ref::<Refused>().is_some() {
        return true;
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        return io.is_unsent();
    }
    #[cfg(feature = "hyper-util")]
    if let Some(e) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
        return e.is_unsent();
    }
    #[cfg(feature = "reqwest")]
    if let Some(e) = error.downcast_ref::<reqwest::Error>() {
        return e.is_unsent();
    }
    false
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
        // NOTE: not `is_connect`: reqwest follows redirects, and the connect error of a
        // redirect's target comes after the request ran on the server that redirected it.
        self.is_builder()
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl Unsent for tonic::Status {
    fn is_unsent(&self) -> bool {
        StdError::source(self).is_some_and(erased_is_unsent)
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
