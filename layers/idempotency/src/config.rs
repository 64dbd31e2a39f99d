//! The settings of one layer and their defaults, shared by the layer, the service and the future.

use crate::predicate::{DefaultPredicate, StorePredicate};
use http::response::Parts;
use http::{HeaderMap, HeaderName, Method};
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

/// The rules a response is stored by, wherever it is stored: by the layer, or by a handler in
/// its own transaction (`Claim::respond_in`), which must keep exactly what the layer would.
// NOTE: one object so that the claim handed to a handler, which cannot name the layer's
// predicate type, applies the same predicate and limits as the layer's own write.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) trait StoreRules: Send + Sync {
    /// The largest response body kept for replay.
    fn response_limit(&self) -> usize;
    /// The headers never stored, besides the hop-by-hop ones.
    fn strip_headers(&self) -> &[HeaderName];
    /// [`StorePredicate::should_store`].
    fn should_store(&self, parts: &Parts) -> bool;
    /// [`StorePredicate::should_store_trailers`].
    fn should_store_trailers(&self, trailers: &HeaderMap) -> bool;
}

impl<F, P> StoreRules for Config<F, P>
where
    F: Send + Sync,
    P: StorePredicate + Send + Sync,
{
    fn response_limit(&self) -> usize {
        self.settings.response_limit
    }

    fn strip_headers(&self) -> &[HeaderName] {
        &self.settings.strip_headers
    }

    fn should_store(&self, parts: &Parts) -> bool {
        self.predicate.should_store(parts)
    }

    fn should_store_trailers(&self, trailers: &HeaderMap) -> bool {
        self.predicate.should_store_trailers(trailers)
    }
}

/// The layer's defaults, for a claim made without a layer (a job's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DefaultRules;

impl StoreRules for DefaultRules {
    fn response_limit(&self) -> usize {
        DEFAULT_RESPONSE_LIMIT
    }

    fn strip_headers(&self) -> &[HeaderName] {
        &[]
    }

    fn should_store(&self, parts: &Parts) -> bool {
        DefaultPredicate.should_store(parts)
    }

    fn should_store_trailers(&self, trailers: &HeaderMap) -> bool {
        DefaultPredicate.should_store_trailers(trailers)
    }
}
