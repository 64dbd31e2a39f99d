//! A step's result: recorded (encoded, bounded, completed under the claim), read back from a
//! record, or settled by the tool's own transaction.

use crate::codec::Codec;
use crate::error::StepError;
use crate::held::Held;
use crate::output::{Output, StepOutput};
use crate::record;
use crate::record::Recorded;
use std::time::Duration;
use tower_once_idempotency::store::{
    Completion, IdempotencyStore, Settled, StoreError, StoredResponse,
};
use tower_once_idempotency::JobRecord;

/// `value` encoded by `codec`, if it fits `limit`; why not otherwise.
pub(crate) fn encode<T, C: Codec<T>>(
    codec: &C,
    value: &T,
    limit: usize,
) -> Result<StoredResponse, String> {
    let stored = codec.encode(value).map_err(|e| e.to_string())?;
    let size = stored.approximate_size();
    if size > limit {
        return Err(format!("{size} bytes, over the limit of {limit}"));
    }
    Ok(stored)
}

/// Records `value` as the step's result. `made` says how the output was had (called now,
/// or verified downstream). A result that cannot be kept leaves the step not done: released
/// (an unkeyed call's sent mark stays, so its next attempt does not send it blindly).
pub(crate) async fn record_result<T, St: IdempotencyStore>(
    held: &mut Held<St>,
    encoded: Result<StoredResponse, String>,
    retention: Duration,
    value: T,
    made: impl FnOnce(T) -> StepOutput<T>,
) -> StepOutput<T> {
    let stored = match encoded {
        Ok(stored) => stored,
        Err(why) => {
            tracing::warn!(%why, "step: the result cannot be stored; the step is not done");
            held.marker = None;
            held.release().await;
            return StepOutput::not_recorded(value);
        }
    };
    let completion = Completion::Response(stored);
    let completed = held.complete(completion, retention).await;
    match completed {
        Ok(true) => made(value),
        Ok(false) => {
            tracing::warn!(
                "step: its claim was lost before the result was stored (a lease too short?)"
            );
            StepOutput::not_recorded(value)
        }
        Err(error) => {
            tracing::warn!(%error, "step: the result could not be stored; the step is not done");
            StepOutput::not_recorded(value)
        }
    }
}

/// What became of the result a tool committed in its own transaction, if it wrote one. A
/// transaction still open (handed to a task, its rollback not sent yet) is looked at again,
/// 5 ms apart and doubling, for up to `patience`.
pub(crate) async fn settled_by_tool(
    written: &JobRecord,
    patience: Duration,
) -> Option<Result<Settled, StoreError>> {
    let now = tokio::time::Instant::now();
    // A lease of centuries (a configuration) must not overflow the clock.
    let until = now
        .checked_add(patience)
        .unwrap_or_else(|| now + Duration::from_secs(3600));
    let mut pause = Duration::from_millis(5);
    loop {
        let settled = written.check()?.await;
        let now = tokio::time::Instant::now();
        if !matches!(settled, Ok(Settled::Open)) || now >= until {
            return Some(settled);
        }
        tokio::time::sleep_until((now + pause).min(until)).await;
        pause *= 2;
    }
}

/// A step whose tool wrote its result in its own transaction: committed (done), rolled back
/// (not done, released), or its transaction committed without it (`Err`: the layer records
/// the result as usual).
pub(crate) async fn settled_step<T, St: IdempotencyStore>(
    held: &mut Held<St>,
    settled: Result<Settled, StoreError>,
    value: T,
    waited: bool,
) -> Result<StepOutput<T>, T> {
    match settled {
        Ok(Settled::Done) => {
            held.armed = false;
            Ok(StepOutput::called(value, waited))
        }
        Ok(Settled::Store) => Err(value),
        Ok(Settled::Release) => {
            tracing::warn!(
                "step: the tool answered, but its transaction rolled back; the step is not done"
            );
            held.release().await;
            Ok(StepOutput::rolled_back(value))
        }
        // Not known yet: the claim stays until its lease ends, and the record (committed or
        // not) decides the next attempt.
        Ok(Settled::Open) => {
            tracing::warn!("step: the tool answered, but its transaction is still open; the step is not done until it ends");
            held.armed = false;
            Ok(StepOutput::unsettled(value))
        }
        Err(error) => {
            tracing::warn!(%error, "step: could not read whether the tool's transaction committed; the step is not done");
            held.armed = false;
            Ok(StepOutput::unsettled(value))
        }
    }
}

pub(crate) fn replay<T, E, C: Codec<T>>(
    codec: &C,
    stored: &StoredResponse,
    key: impl FnOnce() -> String,
    waited: bool,
) -> Output<T, E> {
    match record::read(stored) {
        Some(Recorded::Done(stored)) => codec
            .decode(stored)
            .map(|value| StepOutput::replayed(value, waited))
            .map_err(StepError::codec),
        Some(Recorded::Unknown {
            sent_at,
            key: recorded,
        }) => Err(StepError::unknown(
            recorded.unwrap_or_else(key),
            sent_at,
            None,
        )),
        None => Err(StepError::codec(
            "the record carries a step mark this version does not know".into(),
        )),
    }
}
