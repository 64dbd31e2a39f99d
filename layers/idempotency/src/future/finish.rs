//! What the handler's answer becomes: stored, released, or already settled by the handler in
//! its own transaction (checked against the record, never taken on trust).

use super::state::{State, StateOf};
use super::steps::Ctx;
use crate::body::{RequestBody, ResponseBody};
use crate::claim::{Refused as ClaimRefused, StoredBy};
use crate::fingerprint::Fingerprinter;
use crate::metrics::Outcome;
use crate::predicate::StorePredicate;
use crate::store::Settled;
use crate::store::{IdempotencyStore, StoreError, StoreFuture};
use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_once_core::body::Collector;
use tower_service::Service;
use tracing::Span;

impl<S, St, F, P> Ctx<S, St, F, P>
where
    St: IdempotencyStore,
    F: Fingerprinter + Send + Sync + 'static,
    P: StorePredicate + Send + Sync + 'static,
{
    /// Acts on the handler's answer: read a response to store, or release the key.
    pub(super) fn ran<ReqB, ResB>(
        &mut self,
        span: &Span,
        result: Result<Response<ResB>, S::Error>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        match result {
            Ok(mut response) => {
                if response.extensions_mut().remove::<ClaimRefused>().is_some() {
                    // NOTE: a `ClaimError`'s answer is never a key's answer, whatever the
                    // predicate: the release is fenced, so it changes nothing if the record is
                    // completed (a second completion after the first committed) or another's.
                    self.release(span, "the handler's claim was refused");
                    let response = response.map(ResponseBody::streaming);
                    return State::Finish {
                        result: Some(Ok(response)),
                    };
                }
                if St::COMPLETES_IN_TRANSACTION {
                    if let Some(check) = self.stored_by_handler(&mut response) {
                        return State::Check {
                            check,
                            response: Some(response),
                        };
                    }
                }
                self.store_or_release(span, response)
            }
            Err(error) => {
                self.release(span, "inner service error");
                State::Finish {
                    result: Some(Err(error)),
                }
            }
        }
    }

    /// Reads a response the predicate stores, or releases the key for one it does not.
    fn store_or_release<ReqB, ResB>(
        &mut self,
        span: &Span,
        response: Response<ResB>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        let (parts, body) = response.into_parts();
        if self.config.predicate.should_store(&parts) {
            return State::ReadResponse {
                body: Some(Box::pin(body)),
                parts: Some(parts),
                collected: Collector::default(),
                trailers: None,
            };
        }
        self.release(span, "response not stored");
        let response = Response::from_parts(parts, ResponseBody::streaming(body));
        State::Finish {
            result: Some(Ok(response)),
        }
    }

    /// Acts on what became of the record the handler wrote in its own transaction.
    pub(super) fn checked<ReqB, ResB>(
        &mut self,
        span: &Span,
        settled: Result<Settled, StoreError>,
        response: &mut Option<Response<ResB>>,
    ) -> StateOf<S, ReqB, ResB, St>
    where
        S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body<Data = Bytes>,
        ResB: Body,
    {
        let Some(response) = response.take() else {
            tower_once_core::polled_after_completion("ResponseFuture")
        };
        match settled {
            // Still open: its own end decides, and the lease frees the key if it never commits.
            Ok(Settled::Done | Settled::Open) => {
                Outcome::Stored.record(span);
                tracing::debug!("the handler's own transaction settled its record");
                if let Some(claim) = self.claim.take() {
                    drop(claim.disarm());
                }
                State::Finish {
                    result: Some(Ok(response.map(ResponseBody::streaming))),
                }
            }
            Ok(Settled::Store) => {
                tracing::debug!(
                    "the handler's transaction committed without its record; storing the response"
                );
                self.store_or_release(span, response)
            }
            Ok(Settled::Release) => {
                self.release(span, "the handler's transaction rolled back");
                State::Finish {
                    result: Some(Ok(response.map(ResponseBody::streaming))),
                }
            }
            Err(error) => {
                // NOTE: the release is fenced: a no-op if the record committed, and otherwise
                // the key is free at once instead of after the lease.
                tracing::warn!(
                    %error,
                    "could not read the handler's record; releasing the claim if still in progress"
                );
                self.release(span, "the handler's record could not be read");
                State::Finish {
                    result: Some(Ok(response.map(ResponseBody::streaming))),
                }
            }
        }
    }

    /// If the handler wrote this very response as this claim's record (`Claim::respond_in`),
    /// the read that says whether that record committed: the mark alone does not say so (a
    /// savepoint or the whole transaction may have rolled back after it).
    fn stored_by_handler<B>(&mut self, response: &mut Response<B>) -> Option<StoreFuture<Settled>> {
        match response.extensions_mut().remove::<StoredBy>() {
            Some(StoredBy { token, check }) if token == self.token => Some(check()),
            _ => None,
        }
    }
}
