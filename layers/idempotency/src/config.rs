//! The settings of one layer and their defaults, shared by the layer, the service and the future.

use http::{HeaderName, Method};
use std::fmt;
use std::time::Duration;

/// The default `Idempotency-Key` header name.
pub use tower_once_core::IDEMPOTENCY_KEY;

/// The header added, with the value `true`, to the layer's "still in progress" answers (`409`,
/// gRPC `UNAVAILABLE`), so that a client's retry layer can tell them from failures.
pub use tower_once_core::IDEMPOTENCY_IN_PROGRESS;

/// The header added to replayed responses, with the value `true` (as Stripe does).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The largest response body stored for replay unless the layer says otherwise (1 MiB).
pub(crate) const DEFAULT_RESPONSE_LIMIT: usize = 1024 * 1024;

/// The longest lease or retention accepted: longer ones are cut to this (about 100 years).
pub(crate) use tower_once_core::time::MAX_DURATION;

/// Everything the future needs besides the store and the inner service; shared by all clones
/// of one service. The scope is not here: only the service reads it.
#[derive(Clone)]
pub(crate) struct Config<F, P> {
    // Shared with the `Claim` handed to handlers, which stores responses by the same rules.
    pub(crate) settings: std::sync::Arc<Settings>,
    /// Work finished on tasks of its own, shared by every service of one layer.
    pub(crate) detached: crate::detached::Detached,
    pub(crate) fingerprinter: F,
    pub(crate) predicate: P,
}

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) methods: Vec<Method>,
    pub(crate) header: HeaderName,
    pub(crate) max_key_len: usize,
    pub(crate) require_key: bool,
    pub(crate) body_limit: usize,
    pub(crate) response_limit: usize,
    pub(crate) lease: Duration,
    pub(crate) retention: Duration,
    pub(crate) fail_open: bool,
    pub(crate) cancel_on_disconnect: bool,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) in_progress_retry_after: Duration,
    pub(crate) strip_headers: Vec<HeaderName>,
    pub(crate) problems: crate::problem::Problems,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            header: IDEMPOTENCY_KEY,
            max_key_len: crate::key::DEFAULT_MAX_KEY_LEN,
            require_key: false,
            body_limit: tower_once_core::replay::DEFAULT_BODY_LIMIT,
            response_limit: DEFAULT_RESPONSE_LIMIT,
            lease: Duration::from_secs(10),
            retention: Duration::from_secs(24 * 3600),
            fail_open: false,
            cancel_on_disconnect: false,
            unavailable_retry_after: Duration::from_secs(1),
            in_progress_retry_after: Duration::from_secs(1),
            strip_headers: Vec::new(),
            problems: Default::default(),
        }
    }
}

/// How long a request body over the limit is read and thrown away before the `413`: a client
/// still uploading reads the answer instead of a reset, and one that declared a large body and
/// sends nothing (or drips it) gets its `413` after this, with the connection closed.
pub(crate) const DRAIN_TIME: Duration = Duration::from_secs(1);

impl Settings {
    /// How much of a request body over the limit is read and thrown away before the `413`, so
    /// that a client still sending reads the answer instead of a connection reset.
    pub(crate) fn drain_limit(&self) -> usize {
        self.body_limit.saturating_mul(4).max(1024 * 1024)
    }
}

impl<F, P> fmt::Debug for Config<F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("settings", &self.settings)
            .field("fingerprinter", &std::any::type_name::<F>())
            .field("predicate", &std::any::type_name::<P>())
            .finish()
    }
}
