//! Recording a step's successful result: encoded, bounded, completed under the claim.

use crate::codec::Codec;
use crate::held::Held;
use crate::output::StepOutput;
use crate::record;
use std::time::Duration;
use tower_once_idempotency::store::{Completion, IdempotencyStore, StoredResponse};

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
    let completion = Completion::Response(record::done(stored));
    let completed = held.complete(completion, retention).await;
    match completed {
        Ok(true) => {
            held.release_marker().await;
            made(value)
        }
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
