//! The bench's settings, from the environment.

use crate::env;
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Settings {
    /// How long each row runs per round (`LOAD_SECS`).
    pub(crate) round: Duration,
    /// `LOAD_ROUNDS`.
    pub(crate) rounds: usize,
    /// Concurrent connections, and concurrent script callers on the raw row (`LOAD_CONNS`).
    pub(crate) connections: usize,
    /// Load generator threads (`LOAD_CLIENT_THREADS`).
    pub(crate) client_threads: usize,
}

impl Settings {
    /// Reads the settings.
    ///
    /// # Panics
    ///
    /// If one is set to something out of its range.
    pub(crate) fn from_env() -> Self {
        Self {
            round: env::seconds("LOAD_SECS", 3.0),
            rounds: env::var("LOAD_ROUNDS", 3, 1..=100),
            connections: env::var("LOAD_CONNS", 32, 1..=4096),
            client_threads: env::var("LOAD_CLIENT_THREADS", 2, 1..=64),
        }
    }
}
