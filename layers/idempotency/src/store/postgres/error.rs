//! Postgres failures as [`StoreError`]s.

use crate::store::StoreError;

/// A failed statement: a pool with no free connection in time is a timeout, an undecodable
/// row is corrupt, everything else (refused, reset, a dropped table, a killed backend) is
/// unavailable; each keeps sqlx's error as its cause, so the log says which.
pub(crate) fn from_sqlx(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::PoolTimedOut => StoreError::timeout(),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::TypeNotFound { .. } => StoreError::corrupt(error),
        other => StoreError::unavailable(other),
    }
}
