//! Relay settings and their defaults, checked once by [`RelayConfig::validate`].

use crate::error::OutboxError;
use std::time::Duration;
use tower_once_retry::backoff::Backoff;

/// How an [`OutboxRelay`](crate::OutboxRelay) claims, sends and gives up.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`batch_size`](Self::batch_size) | 16 | rows claimed per pass, sent concurrently |
/// | [`lease`](Self::lease) | 30 s | how long a claimed row is this relay's; a dead relay's rows come back after it |
/// | [`send_timeout`](Self::send_timeout) | 80 % of the lease | one send's cap (and its [`Deadline`](tower_once_timeout::Deadline)), so it ends before the lease |
/// | [`max_attempts`](Self::max_attempts) | 10 | failed attempts before a row is parked for a person |
/// | [`backoff`](Self::backoff) | 1 s doubling to 5 min, full jitter | wait after a failed attempt, unless the provider said (`Retry-After`) |
/// | [`poll_interval`](Self::poll_interval) | 5 s | a pass at least this often, besides `NOTIFY` on insert |
/// | [`shutdown_grace`](Self::shutdown_grace) | 10 s | how long in-flight sends may finish at shutdown; the rest are released |
/// | [`retain_sent`](Self::retain_sent) | 7 days | sent rows are deleted after this (their dedupe keys with them) |
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub(crate) batch_size: u32,
    pub(crate) lease: Duration,
    pub(crate) send_timeout: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) poll_interval: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) retain_sent: Option<Duration>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayConfig {
    /// The defaults in the table above.
    pub fn new() -> Self {
        Self {
            batch_size: 16,
            lease: Duration::from_secs(30),
            send_timeout: None,
            max_attempts: 10,
            backoff: default_backoff(),
            poll_interval: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            retain_sent: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }

    /// Rows claimed per pass and sent concurrently (1 to 1000).
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows;
        self
    }

    /// How long a claimed row belongs to this relay (at least 1 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// One send's cap, below the lease (default 80 % of it).
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = Some(timeout);
        self
    }

    /// Failed attempts before a row is parked (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait after failed attempt `n`, when the provider did not say how long.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// A pass at least this often, even without a `NOTIFY` (at least 10 ms).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long in-flight sends may finish once shutdown starts.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Deletes sent rows older than this (`None`: never). A dedupe key is remembered as long
    /// as its row: after that, enqueueing the same key sends again.
    pub fn retain_sent(mut self, retain: Option<Duration>) -> Self {
        self.retain_sent = retain;
        self
    }

    /// The cap on one send.
    pub fn effective_send_timeout(&self) -> Duration {
        self.send_timeout.unwrap_or_else(|| self.lease.mul_f64(0.8))
    }

    /// Checks that the settings can work.
    pub fn validate(&self) -> Result<(), OutboxError> {
        if !(1..=1000).contains(&self.batch_size) {
            return Err(OutboxError::config("batch_size must be within 1..=1000"));
        }
        if self.lease < Duration::from_secs(1) || self.lease > Duration::from_secs(24 * 3600) {
            return Err(OutboxError::config("lease must be within 1 s..=24 h"));
        }
        if self.effective_send_timeout() >= self.lease || self.effective_send_timeout().is_zero() {
            return Err(OutboxError::config(
                "send_timeout must be positive and below the lease",
            ));
        }
        if self.max_attempts == 0 {
            return Err(OutboxError::config("max_attempts must be at least 1"));
        }
        if self.poll_interval < Duration::from_millis(10) {
            return Err(OutboxError::config("poll_interval must be at least 10 ms"));
        }
        Ok(())
    }
}

fn default_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(300)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_nonsense_is_not() {
        assert!(RelayConfig::new().validate().is_ok());
        assert!(RelayConfig::new().batch_size(0).validate().is_err());
        assert!(RelayConfig::new().batch_size(1001).validate().is_err());
        assert!(RelayConfig::new().lease(Duration::ZERO).validate().is_err());
        assert!(RelayConfig::new().lease(Duration::MAX).validate().is_err());
        let cfg = RelayConfig::new().send_timeout(Duration::from_secs(30));
        assert!(cfg.validate().is_err());
        assert!(RelayConfig::new().max_attempts(0).validate().is_err());
        assert!(RelayConfig::new()
            .poll_interval(Duration::ZERO)
            .validate()
            .is_err());
        assert_eq!(
            RelayConfig::new().effective_send_timeout(),
            Duration::from_secs(24)
        );
    }
}
