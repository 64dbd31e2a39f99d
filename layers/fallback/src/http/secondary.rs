//! The secondary as the HTTP fallback calls it: its answers are marked [`FromSecondary`].

use http::Response;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// A response extension on the secondary's answers: the primary failed and the request went
/// to the secondary.
///
/// ```
/// # let response = http::Response::new(());
/// use tower_once_fallback::http::FromSecondary;
///
/// let provider = match response.extensions().get::<FromSecondary>() {
///     Some(_) => "secondary",
///     None => "primary",
/// };
/// # assert_eq!(provider, "primary");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FromSecondary;

/// The secondary service as the HTTP fallback calls it: its responses carry [`FromSecondary`].
#[derive(Debug, Clone)]
pub struct Secondary<T>(pub(crate) T);

/// A response the fallback can mark as the secondary's ([`FromSecondary`]).
pub trait Markable {
    /// Marks it as the secondary's answer.
    fn mark_from_secondary(&mut self);
}

impl<B> Markable for Response<B> {
    fn mark_from_secondary(&mut self) {
        self.extensions_mut().insert(FromSecondary);
    }
}

impl<T, Req> Service<Req> for Secondary<T>
where
    T: Service<Req>,
    T::Response: Markable,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = MarkFuture<T::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), T::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        MarkFuture {
            inner: self.0.call(req),
        }
    }
}

pin_project! {
    /// Response future of [`Secondary`].
    #[derive(Debug)]
    pub struct MarkFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, Res, E> Future for MarkFuture<F>
where
    F: Future<Output = Result<Res, E>>,
    Res: Markable,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = ready!(self.project().inner.poll(cx))?;
        response.mark_from_secondary();
        Poll::Ready(Ok(response))
    }
}
