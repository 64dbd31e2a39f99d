//! The bench's settings, from the environment.

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
        fn var<T: std::str::FromStr>(name: &str, default: T) -> T {
            match std::env::var(name) {
                Ok(value) => value
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={value} is not a valid value")),
                Err(_) => default,
            }
        }
        let secs: f64 = var("LOAD_SECS", 3.0);
        assert!(secs > 0.0 && secs <= 600.0, "LOAD_SECS must be in (0, 600]");
        let settings = Self {
            round: Duration::from_secs_f64(secs),
            rounds: var("LOAD_ROUNDS", 3),
            connections: var("LOAD_CONNS", 32),
            client_threads: var("LOAD_CLIENT_THREADS", 2),
        };
        assert!(
            (1..=100).contains(&settings.rounds),
            "LOAD_ROUNDS in 1..=100"
        );
        assert!(
            (1..=4096).contains(&settings.connections),
            "LOAD_CONNS in 1..=4096"
        );
        assert!(
            (1..=64).contains(&settings.client_threads),
            "LOAD_CLIENT_THREADS in 1..=64"
        );
        settings
    }
}
