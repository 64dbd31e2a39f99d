//! The inner service the happy-path benches wrap, and the error it never returns: one
//! definition for every bench that compares layers on it.
#![allow(dead_code)] // each bench uses part of this module

use std::future::{ready, Ready};
use std::task::{Context, Poll};
use tower::Service;

/// The inner service's error type (never returned).
#[derive(Debug, Clone)]
pub(crate) struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed")
    }
}

impl std::error::Error for Failed {}

/// Answers its request back at once (a ready future).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Echo;

impl<R> Service<R> for Echo {
    type Response = R;
    type Error = Failed;
    type Future = Ready<Result<R, Failed>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: R) -> Self::Future {
        ready(Ok(req))
    }
}
