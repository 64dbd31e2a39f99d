//! The one mechanism under every step and every run-once delivery: claim the record (or
//! replay it, or wait for it), mark an unkeyed call sent, call with the lease renewed, then
//! record the result or the unknown outcome.

use crate::call::{derived_key, OnUnknown};
use crate::codec::Codec;
use crate::config::Settings;
use crate::error::StepError;
use crate::handoff::hand_claim;
use crate::held::Held;
use crate::id::StepId;
use crate::metrics;
use crate::output::{Output, StepOutput};
use crate::pending::Pending;
use crate::record;
use crate::settle::{encode, record_result, replay, settled_by_tool, settled_step};
use crate::verify::{Verified, Verify};
use crate::StepRequest;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tower_once_core::classify::{Action, Classify};
use tower_once_core::deadline::Deadline;
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::fingerprint::Fingerprint;
use tower_once_idempotency::store::{
    ClaimOutcome, ClaimToken, IdempotencyStore, RecordState, StoreError, StoreKey, StoredResponse,
};
use tower_once_idempotency::{Claim, JobRecord};
use tower_service::Service;

/// The first pause between two looks at a step running elsewhere; doubled up to a quarter
/// of the lease.
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// What is claimed: a step of a run, or a delivery of a message run once per id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A step: waits for an owner elsewhere; replays its recorded result through the codec;
    /// a tool on a transactional Postgres store gets a `StepClaim`.
    Step,
    /// A delivery: another owner's run is not waited for (the delivery stays pending, and is
    /// delivered again); any record of a done run is a duplicate; the handler gets the
    /// store's `Claim` on any store whose records its transaction can write.
    Delivery,
}

/// One call, as the mechanism sees it: where its record is, what it is called with, and
/// what to do when an earlier attempt's outcome is unknown.
pub(crate) struct Call<Req> {
    pub(crate) kind: Kind,
    pub(crate) id: StepId,
    pub(crate) key: StoreKey,
    pub(crate) scope: Vec<u8>,
    pub(crate) request: Req,
    pub(crate) arguments: Fingerprint,
    pub(crate) policy: OnUnknown,
    pub(crate) keyed: bool,
}

pub(crate) async fn once<S, St, C, K, V, Req>(
    mut inner: S,
    settings: &Arc<Settings<St, C, K, V>>,
    call: Call<Req>,
    deadline: Option<Deadline>,
) -> Output<S::Response, S::Error>
where
    S: Service<Req>,
    S::Response: Send + 'static,
    S::Error: Unsent + 'static,
    Req: StepRequest,
    St: IdempotencyStore,
    C: Codec<S::Response> + Send + Sync + 'static,
    K: Classify<S::Response, S::Error> + Send + Sync + 'static,
    V: Verify<S::Response> + Send + Sync + 'static,
{
    let Call {
        kind,
        id,
        key,
        scope,
        mut request,
        arguments,
        policy,
        keyed,
    } = call;
    // The key the call carries downstream (its own, or the step's), named by an unknown
    // outcome: derived (a hash) only when needed.
    let own_key = request.carried_key();
    let step_key = || own_key.clone().unwrap_or_else(|| derived_key(&id, &scope));
    let store = &settings.store;
    if policy == OnUnknown::Refuse && store.claims_are_transactions() {
        return Err(StepError::misused(
            "a call that may not be sent twice needs a sent mark that outlives a crash, and a claim on a transactional PostgresStore is an open transaction: key the step, mark it OnUnknown::RunAgain when its effect commits in the step's transaction, or keep the steps in a store that writes its claims",
        ));
    }
    let token = ClaimToken::new();
    let wait_until = deadline.map_or_else(
        || {
            let now = Instant::now();
            // A `max_wait` of centuries (a configuration) must not overflow the clock.
            now.checked_add(settings.max_wait)
                .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
        },
        |deadline| deadline.instant(),
    );

    // Claim the step, or replay it, or wait for whoever runs it.
    let mut pause = FIRST_PAUSE;
    let mut waited = false;
    loop {
        let claim = Pending::claim(
            store,
            key,
            token,
            store.claim(key, token, arguments, settings.lease),
        );
        let claimed = match kind {
            Kind::Step => tokio::time::timeout_at(wait_until, claim).await,
            // A delivery's claim is bounded by its store's own timeouts, not by its deadline:
            // a deadline that passes meanwhile is its handler's to meet (a `TimeoutLayer`).
            Kind::Delivery => Ok(claim.await),
        };
        let outcome = match claimed {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(error)) => return Err(StepError::store(error)),
            Err(_) => return Err(StepError::store(StoreError::timeout())),
        };
        let record = match outcome {
            ClaimOutcome::Claimed => break,
            ClaimOutcome::Existing(record) => record,
        };
        if record.fingerprint != arguments {
            return Err(StepError::mismatch());
        }
        match (record.state, kind) {
            // A delivery's record says its run is done; what it holds is the codec's to read.
            (RecordState::Completed(stored), Kind::Delivery) => {
                return decoded(&settings.codec, &stored);
            }
            (RecordState::NotReplayable, Kind::Delivery) => {
                let none = StoredResponse::new(
                    http::StatusCode::OK,
                    http::HeaderMap::new(),
                    bytes::Bytes::new(),
                );
                return decoded(&settings.codec, &none);
            }
            (RecordState::InProgress { .. }, Kind::Delivery) => {
                return Err(StepError::in_progress());
            }
            (RecordState::Completed(stored), Kind::Step) => {
                return replay(&settings.codec, &stored, step_key, waited);
            }
            (RecordState::NotReplayable, Kind::Step) => {
                return Err(StepError::codec("the step's record holds no result".into()));
            }
            (RecordState::InProgress { lease_remaining }, Kind::Step) => {
                if !waited {
                    waited = true;
                    metrics::waited();
                    tracing::debug!("step: running elsewhere, waiting for its result");
                }
                let now = Instant::now();
                if now >= wait_until {
                    return Err(StepError::in_progress());
                }
                // Look again soon, and at the latest just after the owner's lease ends.
                let next = pause.min(lease_remaining + Duration::from_millis(1));
                tokio::time::sleep_until((now + next).min(wait_until)).await;
                pause = (pause * 2).min((settings.lease / 4).max(FIRST_PAUSE));
            }
        }
    }

    let mut held = Held::new(store.clone(), key, token, settings.retention);
    if keyed && request.can_carry_key() {
        request.carry_key(&step_key());
    }

    // A call that may not be sent twice is marked sent before it is: a process that dies
    // after sending leaves the mark, and the step's next owner settles it as unknown.
    // When the call is sent: named by an unknown outcome, which only a `Refuse` policy has.
    let sent_at = match policy {
        OnUnknown::Refuse => record::to_millis(SystemTime::now()),
        OnUnknown::RunAgain => SystemTime::UNIX_EPOCH,
    };
    if policy == OnUnknown::Refuse {
        let marker = id.marker_key(&scope);
        let mark = store.claim(
            marker,
            token,
            record::sent_marker(sent_at),
            settings.retention,
        );
        match Pending::claim(store, marker, token, mark).await {
            Ok(ClaimOutcome::Claimed) => {
                held.marker = Some(marker);
            }
            Ok(ClaimOutcome::Existing(earlier)) => {
                // An earlier attempt was sent and never recorded: ask the downstream.
                let earlier = record::marker_sent_at(&earlier.fingerprint);
                let lookup = settings.verify.verify(&id, earlier);
                match held.renewed(settings.lease, lookup).await {
                    Verified::Happened(value) => {
                        let encoded = encoded(kind, &settings.codec, &value, settings.result_limit);
                        let out =
                            record_result(&mut held, encoded, settings.retention, value, |value| {
                                StepOutput::verified(value, waited)
                            })
                            .await;
                        return Ok(out);
                    }
                    // Sent under the earlier attempt's mark, which stays: a crash now leaves
                    // it, and the next owner asks again.
                    Verified::NotHappened => {}
                    Verified::Unknown => {
                        tracing::warn!(
                            key = %step_key(),
                            "step: an earlier attempt was sent and never recorded; not sending it again"
                        );
                        held.settle_unknown(earlier, &step_key()).await;
                        return Err(StepError::unknown(step_key(), earlier, None));
                    }
                }
            }
            Err(error) => {
                held.release().await;
                return Err(StepError::store(error));
            }
        }
    }

    // A store whose claim is the tool's transaction (a transactional PostgresStore): hand the
    // tool the step's claim, so that its effect and the step's result commit together. (A
    // plain PostgresStore's claim would let the tool write a record of the HTTP layer's kind,
    // which a step cannot replay: it gets none.)
    let in_transaction = match kind {
        Kind::Step if St::COMPLETES_IN_TRANSACTION && store.claims_are_transactions() => {
            request.extensions_mut().and_then(|extensions| {
                hand_claim::<_, _, _, _, S::Response, S::Error>(settings, key, token, extensions)
            })
        }
        // A delivery's handler gets the store's own claim, on any store whose records its
        // transaction can write (Postgres, plain or transactional): it records the run done
        // in the transaction of its effects.
        Kind::Delivery if St::COMPLETES_IN_TRANSACTION => {
            request.extensions_mut().map(|extensions| {
                let written = JobRecord::default();
                extensions.insert(Claim::for_job(
                    store.clone(),
                    key,
                    token,
                    settings.retention,
                    written.clone(),
                ));
                written
            })
        }
        _ => None,
    };

    // Call, the claim renewed a third of its lease apart (the store's `Lease`, as the
    // idempotency layer's handlers and the worker's jobs), and the sent mark with it.
    let result = held.renewed(settings.lease, inner.call(request)).await;

    // A tool that committed its result in the step's transaction has done the step, whatever
    // the classifier says of its answer (it decided by committing): that is its result.
    let result = match (result, in_transaction.as_ref()) {
        (Ok(value), Some(written)) => match settled_by_tool(written, settings.lease / 3).await {
            Some(settled) => match settled_step(&mut held, settled, value, waited).await {
                Ok(out) => return Ok(out),
                Err(value) => Ok(value),
            },
            None => Ok(value),
        },
        (result, _) => result,
    };

    let action = settings.classifier.classify(&result);
    match result {
        Ok(value) if action == Action::Success => {
            let encoded = encoded(kind, &settings.codec, &value, settings.result_limit);
            Ok(
                record_result(&mut held, encoded, settings.retention, value, |value| {
                    StepOutput::called(value, waited)
                })
                .await,
            )
        }
        // A refusal (a 4xx: `Action::Stop`), or any failed answer of a call that may be sent
        // again: the step is not done, and nothing of it is kept.
        Ok(value) if action == Action::Stop || policy == OnUnknown::RunAgain => {
            held.release().await;
            Ok(StepOutput::not_recorded(value))
        }
        // A failure that may have had its effect (a 5xx from a gateway, a timeout answered by
        // a proxy) on a call that may not be sent twice: as unknown as a timeout.
        Ok(value) => match held
            .renewed(settings.lease, settings.verify.verify(&id, sent_at))
            .await
        {
            Verified::Happened(found) => {
                let encoded = encoded(kind, &settings.codec, &found, settings.result_limit);
                let made = |found| StepOutput::verified(found, waited);
                Ok(record_result(&mut held, encoded, settings.retention, found, made).await)
            }
            Verified::NotHappened => {
                held.release().await;
                Ok(StepOutput::not_recorded(value))
            }
            Verified::Unknown => {
                let key = step_key();
                tracing::warn!(key = %key, "step: the call failed in a way that may have had its effect; not sending it again");
                held.settle_unknown(sent_at, &key).await;
                Err(StepError::unknown(key, sent_at, None))
            }
        },
        // Unsent, or safe to send again, or its effect rolled back with the step's transaction.
        Err(error)
            if error.is_unsent()
                || policy == OnUnknown::RunAgain
                || in_transaction.as_ref().is_some_and(JobRecord::is_written) =>
        {
            held.release().await;
            Err(StepError::inner(error))
        }
        Err(error) => match held
            .renewed(settings.lease, settings.verify.verify(&id, sent_at))
            .await
        {
            Verified::Happened(value) => {
                let encoded = encoded(kind, &settings.codec, &value, settings.result_limit);
                let made = |value| StepOutput::verified(value, waited);
                Ok(record_result(&mut held, encoded, settings.retention, value, made).await)
            }
            Verified::NotHappened => {
                held.release().await;
                Err(StepError::inner(error))
            }
            Verified::Unknown => {
                let key = step_key();
                held.settle_unknown(sent_at, &key).await;
                Err(StepError::unknown(key, sent_at, Some(error)))
            }
        },
    }
}

/// `value` encoded for the record, if it fits the limit: a step's marked as a done step's
/// (its replay tells a result from an unknown outcome); a delivery's as its codec wrote it.
fn encoded<T, C: Codec<T>>(
    kind: Kind,
    codec: &C,
    value: &T,
    limit: usize,
) -> Result<StoredResponse, String> {
    let stored = encode(codec, value, limit)?;
    Ok(match kind {
        Kind::Step => record::done(stored),
        Kind::Delivery => stored,
    })
}

/// A delivery's done record, read by its codec.
fn decoded<T, E, C: Codec<T>>(codec: &C, stored: &StoredResponse) -> Output<T, E> {
    codec
        .decode(stored)
        .map(|value| StepOutput::replayed(value, false))
        .map_err(StepError::codec)
}
