//! The answer to a request a [`Client`](super::Client) sends.

use super::error::Error;
use super::stack::Stack;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower::util::Oneshot;

pin_project! {
    /// The answer to a request sent by a [`Client`](super::Client): a `reqwest::Response` or an [`Error`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Pending {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Sending { #[pin] oneshot: Oneshot<Stack, http::Request<reqwest::Body>> },
        Failed { error: Option<Error> },
    }
}

impl Pending {
    pub(super) fn sending(oneshot: Oneshot<Stack, http::Request<reqwest::Body>>) -> Self {
        Self {
            state: State::Sending { oneshot },
        }
    }

    pub(super) fn failed(error: Error) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
        }
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl Future for Pending {
    type Output = Result<reqwest::Response, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Sending { oneshot } => {
                let response = ready!(oneshot.poll(cx)).map_err(Error::stack)?;
                Poll::Ready(Ok(reqwest::Response::from(
                    response.map(reqwest::Body::wrap),
                )))
            }
            StateProj::Failed { error } => match error.take() {
                Some(error) => Poll::Ready(Err(error)),
                None => tower_once_core::polled_after_completion("Pending"),
            },
        }
    }
}
