//! Requests that carry an operation's context with them.
//!
//! A retry layer tells the layers below it two things: the operation's deadline, and that a
//! call is one of its attempts (so that a retry layer below makes one attempt instead of
//! multiplying them). Both are put in scope on the thread while an attempt is called and
//! polled, which reaches every layer in the same task, `tower::buffer::Buffer` included (its
//! worker hands the inner future back to the caller, who polls it). A request that is moved
//! to another task (`tokio::spawn`, a channel, a queue) leaves that scope behind; a request
//! type that implements [`Carrier`] with its extensions takes the context along.
//!
//! | request type | carries the context |
//! |---|---|
//! | `http::Request<B>` | yes, in its extensions |
//! | `tonic::Request<T>` (feature `tonic`) | yes, in its extensions |
//! | the worker's `Job`, the outbox's `OutboxMessage` | yes |
//! | `Box<T>`, `Arc<T>` of a `Carrier` | as `T` (an `Arc` reads, but cannot add, the context) |
//! | `String`, `&str`, numbers, `Vec<T>`, `Bytes`, tuples, ... | no: the scope only |
//! | a type of your own | as you implement it: `impl Carrier for MyJob {}` carries nothing |
//!
//! ```
//! use tower_once_core::carrier::Carrier;
//!
//! #[derive(Clone)]
//! struct Resize {
//!     image: String,
//!     extensions: http::Extensions,
//! }
//!
//! impl Carrier for Resize {
//!     fn extensions(&self) -> Option<&http::Extensions> {
//!         Some(&self.extensions)
//!     }
//!
//!     fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
//!         Some(&mut self.extensions)
//!     }
//! }
//!
//! // A value that only lives in the thread's scope:
//! #[derive(Clone)]
//! struct Ping;
//! impl Carrier for Ping {}
//! ```

/// A request type that can carry an operation's context (its deadline, the mark of a retry
/// attempt) to wherever it is handled. See the [module docs](self).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not say whether it can carry an operation's deadline",
    label = "this request type does not implement `Carrier`",
    note = "`impl tower_once_core::carrier::Carrier for {Self} {{}}` carries nothing (the deadline then reaches inner layers only in scope); return the type's `http::Extensions` from its methods to carry it across tasks"
)]
pub trait Carrier {
    /// The extensions that travel with the request, if it has any.
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// The extensions that travel with the request, mutably, if it has any.
    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        None
    }

    /// Whether a copy of this request may be sent while an earlier one may still run (a hedge):
    /// its effect happens once however many copies arrive. The generic hedging layer sends no
    /// copy of a request that answers `false`.
    ///
    /// `true` by default: a request type of yours is the caller's to judge, as with
    /// `tower::hedge`. An `http::Request` answers with the crate's one rule
    /// ([`may_resend`](crate::resend::may_resend)): an idempotent method, an `Idempotency-Key`,
    /// or a [`SafeToRetry`](crate::resend::SafeToRetry) mark; an unkeyed `POST` is never
    /// hedged, whichever of the hedging layers it meets.
    fn may_send_twice(&self) -> bool {
        true
    }
}

impl<B> Carrier for http::Request<B> {
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(http::Request::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(http::Request::extensions_mut(self))
    }

    fn may_send_twice(&self) -> bool {
        crate::resend::may_resend(self)
    }
}

#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl<T> Carrier for tonic::Request<T> {
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(tonic::Request::extensions(self))
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(tonic::Request::extensions_mut(self))
    }
}

/// Types that carry nothing: the context reaches inner layers in scope only.
macro_rules! carries_nothing {
    ($($ty:ty),* $(,)?) => {
        $(impl Carrier for $ty {})*
    };
}

carries_nothing!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
    Box<str>,
    bytes::Bytes,
    std::time::Duration,
);

impl Carrier for &str {}
impl<T> Carrier for &[T] {}
impl<T> Carrier for Vec<T> {}
impl<T, const N: usize> Carrier for [T; N] {}
impl<T> Carrier for Option<T> {}
/// A shared request says what the request inside it says: an `Arc<http::Request>` of an
/// unkeyed `POST` may not be sent twice either. It cannot carry new context (it is shared).
impl<T: Carrier + ?Sized> Carrier for std::sync::Arc<T> {
    fn extensions(&self) -> Option<&http::Extensions> {
        (**self).extensions()
    }

    fn may_send_twice(&self) -> bool {
        (**self).may_send_twice()
    }
}

/// A boxed request is the request inside it.
impl<T: Carrier + ?Sized> Carrier for Box<T> {
    fn extensions(&self) -> Option<&http::Extensions> {
        (**self).extensions()
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        (**self).extensions_mut()
    }

    fn may_send_twice(&self) -> bool {
        (**self).may_send_twice()
    }
}
impl<A, B> Carrier for (A, B) {}
impl<A, B, C> Carrier for (A, B, C) {}
impl<A, B, C, D> Carrier for (A, B, C, D) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Mark(u8);

    #[test]
    fn http_requests_carry_their_extensions_and_plain_values_nothing() {
        let mut req = http::Request::new(());
        if let Some(ext) = Carrier::extensions_mut(&mut req) {
            ext.insert(Mark(7));
        }
        let carried = Carrier::extensions(&req).and_then(|e| e.get::<Mark>());
        assert_eq!(carried, Some(&Mark(7)));
        assert!(Carrier::extensions(&"job").is_none());
        assert!(Carrier::extensions_mut(&mut String::new()).is_none());
    }
}
