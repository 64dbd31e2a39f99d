//! Handing a tool the step's claim, on a store whose claim is the tool's transaction (a
//! transactional `PostgresStore`, feature `postgres`).

use crate::config::Settings;
use std::sync::Arc;
use tower_once_idempotency::store::{ClaimToken, StoreKey};
use tower_once_idempotency::JobRecord;
#[cfg(feature = "postgres")]
use {
    crate::codec::Codec,
    crate::record,
    crate::settle::encode,
    tower_once_core::classify::{Action, Classify},
    tower_once_idempotency::store::IdempotencyStore,
};

/// Hands the tool the step's claim on a transactional Postgres store (a
/// [`StepClaim`](crate::postgres::StepClaim) that commits by the layer's rules), and returns
/// where the tool's commit is noted; `None` on any other store.
#[cfg(feature = "postgres")]
pub(crate) fn hand_claim<St, C, K, V, T, E>(
    settings: &Arc<Settings<St, C, K, V>>,
    key: StoreKey,
    token: ClaimToken,
    extensions: &mut http::Extensions,
) -> Option<JobRecord>
where
    St: IdempotencyStore,
    C: Codec<T> + Send + Sync + 'static,
    K: Classify<T, E> + Send + Sync + 'static,
    V: Send + Sync + 'static,
    T: Send + 'static,
    E: 'static,
{
    use tower_once_idempotency::store::postgres::PostgresStore;
    let store = (&settings.store as &dyn std::any::Any).downcast_ref::<PostgresStore>()?;
    let written = JobRecord::default();
    let claim = tower_once_idempotency::Claim::for_job(
        store.clone(),
        key,
        token,
        settings.retention,
        written.clone(),
    );
    let rules = Arc::clone(settings);
    let record: crate::postgres::Recorder<T> = Arc::new(move |value: T| {
        let outcome: Result<T, E> = Ok(value);
        let action = rules.classifier.classify(&outcome);
        let Ok(value) = outcome else {
            unreachable!("built as Ok")
        };
        if action != Action::Success {
            return Err((value, "not a success by the layer's classifier".to_owned()));
        }
        match encode(&rules.codec, &value, rules.result_limit) {
            Ok(stored) => Ok((value, record::done(stored))),
            Err(why) => Err((value, why)),
        }
    });
    extensions.insert(crate::postgres::StepClaim::new(claim, record));
    Some(written)
}

#[cfg(not(feature = "postgres"))]
// NOTE: the same type parameters as the `postgres` one, which its callers name.
#[allow(clippy::extra_unused_type_parameters)]
pub(crate) fn hand_claim<St, C, K, V, T, E>(
    _: &Arc<Settings<St, C, K, V>>,
    _: StoreKey,
    _: ClaimToken,
    _: &mut http::Extensions,
) -> Option<JobRecord> {
    None
}
