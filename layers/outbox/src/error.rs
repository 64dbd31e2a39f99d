//! The outbox's error type.

use std::fmt;

/// What went wrong talking to the outbox. Query with the `is_*` methods.
#[derive(Debug)]
pub struct OutboxError {
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// A message that cannot be enqueued (empty or oversized key, topic or payload).
    Invalid(&'static str),
    /// The dedupe key is already in the outbox with another topic or payload.
    KeyReused,
    /// The table name or a relay setting cannot work.
    Config(&'static str),
    /// Postgres failed or could not be reached.
    Database(sqlx::Error),
}

impl OutboxError {
    pub(crate) const fn invalid(why: &'static str) -> Self {
        Self {
            kind: Kind::Invalid(why),
        }
    }

    pub(crate) const fn key_reused() -> Self {
        Self {
            kind: Kind::KeyReused,
        }
    }

    pub(crate) const fn config(why: &'static str) -> Self {
        Self {
            kind: Kind::Config(why),
        }
    }

    /// The message was refused before reaching Postgres: see the error text for why.
    pub fn is_invalid(&self) -> bool {
        matches!(self.kind, Kind::Invalid(_))
    }

    /// The dedupe key already names a message with another topic or payload. Nothing was
    /// written: the key was reused for something else (the outbox's 422).
    pub fn is_key_reused(&self) -> bool {
        matches!(self.kind, Kind::KeyReused)
    }

    /// A table name or relay setting that cannot work.
    pub fn is_config(&self) -> bool {
        matches!(self.kind, Kind::Config(_))
    }

    /// Postgres answered with an error or could not be reached.
    pub fn is_database(&self) -> bool {
        matches!(self.kind, Kind::Database(_))
    }
}

impl fmt::Display for OutboxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Invalid(why) => write!(f, "invalid outbox message: {why}"),
            Kind::KeyReused => f.write_str("dedupe key already used for another topic or payload"),
            Kind::Config(why) => write!(f, "invalid outbox configuration: {why}"),
            // The cause is the useful part ("schema app does not exist"): said here, not only
            // through `source()`.
            Kind::Database(e) => write!(f, "outbox database error: {e}"),
        }
    }
}

impl std::error::Error for OutboxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            Kind::Database(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sqlx::Error> for OutboxError {
    fn from(e: sqlx::Error) -> Self {
        Self {
            kind: Kind::Database(e),
        }
    }
}
