//! Watching fallbacks: a hook called before each request goes to the secondary.

use crate::rule::Reason;

/// What the [`OnFallback`] hook is told.
#[derive(Debug)]
#[non_exhaustive]
pub struct FallbackEvent<'a, Res, E> {
    /// Why the request may go to the secondary.
    pub reason: Reason,
    /// The primary's outcome.
    pub primary: &'a Result<Res, E>,
}

/// Called before a request goes to the secondary. Implemented for closures
/// `Fn(&FallbackEvent<'_, Res, E>)` and, as a no-op, for `()`.
///
/// A hook is an observer: one that panics is caught and logged (`error`), and the layer goes
/// on as if it had returned, so a bug in it never leaks what the layer holds at that moment.
///
/// ```
/// use tower_once_fallback::hook::FallbackEvent;
///
/// let log = |event: &FallbackEvent<'_, u16, std::io::Error>| {
///     eprintln!("to the secondary ({}): primary said {:?}", event.reason, event.primary);
/// };
/// # let _ = log;
/// ```
pub trait OnFallback<Res, E> {
    /// Called before the request goes to the secondary.
    fn on_fallback(&self, event: &FallbackEvent<'_, Res, E>);
}

impl<Res, E> OnFallback<Res, E> for () {
    fn on_fallback(&self, _: &FallbackEvent<'_, Res, E>) {}
}

impl<F, Res, E> OnFallback<Res, E> for F
where
    F: Fn(&FallbackEvent<'_, Res, E>),
{
    fn on_fallback(&self, event: &FallbackEvent<'_, Res, E>) {
        self(event)
    }
}
