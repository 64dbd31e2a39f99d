use crate::config::{Config, Settings, MAX_DURATION};
use crate::fingerprint::{Fingerprinter, Xxh3Fingerprint};
use crate::predicate::{DefaultPredicate, StorePredicate};
use crate::scope::Scope;
use crate::service::Idempotency;
use crate::store::{IdempotencyStore, MemoryStore};
use http::{HeaderName, Method};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Applies [`Idempotency`] to a service: requests that carry an `Idempotency-Key` run their
/// handler once; retries get the stored response.
///
/// See the [crate docs](crate) for the flow, the status codes and an axum example.
///
/// Type parameters, each changed by one builder method: `St` the [store](crate::store)
/// ([`store`](Self::store)), `Sc` the [scope](crate::scope) ([`scope`](Self::scope)), `F` the
/// [fingerprint](crate::fingerprint) ([`fingerprint_with`](Self::fingerprint_with)), `P` the
/// [store predicate](crate::predicate) ([`store_when`](Self::store_when)).
///
/// ```
/// use std::time::Duration;
/// use tower_once_idempotency::{scope::HeaderScope, IdempotencyLayer};
///
/// let layer = IdempotencyLayer::new()
///     .require_key(true)
///     .scope(HeaderScope::new("x-tenant-id"))
///     .body_limit(64 * 1024)
///     .lease(Duration::from_secs(30))
///     .retention(Duration::from_secs(3600));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer<St = MemoryStore, Sc = (), F = Xxh3Fingerprint, P = DefaultPredicate> {
    store: St,
    scope: Sc,
    config: Config<F, P>,
}

impl IdempotencyLayer {
    /// A layer with the defaults and a fresh [`MemoryStore`]:
    ///
    /// | setting | default |
    /// |---|---|
    /// | covered methods | `POST`, `PATCH` |
    /// | key header | `Idempotency-Key`, 1..=255 visible ASCII, optional (missing → pass through) |
    /// | scope | none (`()`) |
    /// | request body limit | 1 MiB → `413` |
    /// | stored response limit | 1 MiB (larger → not replayable) |
    /// | lease | 10 s, renewed every 1/3 lease while the handler runs |
    /// | retention | 24 h |
    /// | store failure | fail closed: `503`, `Retry-After: 1` |
    /// | client gone mid-handler | the handler finishes, its response is stored ([`cancel_on_disconnect`](Self::cancel_on_disconnect)) |
    /// | stored responses | all but 5xx, 400, 408, 413, 415, 422, 425, 429 ([`store_when`](Self::store_when)) |
    pub fn new() -> Self {
        Self::with_store(MemoryStore::new())
    }
}

impl Default for IdempotencyLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<St> IdempotencyLayer<St> {
    /// A layer with the defaults of [`new`](IdempotencyLayer::new) and the given store.
    pub fn with_store(store: St) -> Self {
        Self {
            store,
            scope: (),
            config: Config {
                settings: Arc::new(Settings::default()),
                detached: Default::default(),
                fingerprinter: Xxh3Fingerprint,
                predicate: DefaultPredicate,
            },
        }
    }
}

impl<St: IdempotencyStore, Sc, F, P> IdempotencyLayer<St, Sc, F, P> {
    /// The handlers (and streamed responses) this layer finishes on tasks of their own after
    /// their clients left, and the store writes left to finish (its own retries included):
    /// wait for them at shutdown. See [`Detached`](crate::Detached).
    pub fn detached(&self) -> crate::detached::Detached {
        self.config.detached.including(self.store.background())
    }
}

impl<St, Sc, F, P> IdempotencyLayer<St, Sc, F, P> {
    /// Uses another store (for example the Redis store, shared by many replicas).
    pub fn store<St2>(self, store: St2) -> IdempotencyLayer<St2, Sc, F, P> {
        IdempotencyLayer {
            store,
            scope: self.scope,
            config: self.config,
        }
    }

    /// The store this layer uses.
    pub fn store_ref(&self) -> &St {
        &self.store
    }

    /// Which request methods the layer covers; others pass through untouched.
    /// Default `POST` and `PATCH`.
    ///
    /// # Panics
    ///
    /// If `methods` is empty.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        Arc::make_mut(&mut self.config.settings).methods = methods.into_iter().collect();
        assert!(
            !self.config.settings.methods.is_empty(),
            "IdempotencyLayer::methods needs at least one method"
        );
        self
    }

    /// The header carrying the key. Default `Idempotency-Key`.
    pub fn header_name(mut self, name: HeaderName) -> Self {
        Arc::make_mut(&mut self.config.settings).header = name;
        self
    }

    /// The longest key accepted. Default 255.
    ///
    /// # Panics
    ///
    /// If `max` is zero.
    pub fn max_key_len(mut self, max: usize) -> Self {
        assert!(max > 0, "IdempotencyLayer::max_key_len must be at least 1");
        Arc::make_mut(&mut self.config.settings).max_key_len = max;
        self
    }

    /// Whether a covered request without a key is refused with `400` (`true`) or passed through
    /// (`false`, the default, so the layer can be added to an existing API).
    pub fn require_key(mut self, require: bool) -> Self {
        Arc::make_mut(&mut self.config.settings).require_key = require;
        self
    }

    /// The largest request body buffered; larger ones get `413` and never reach the handler.
    /// `Content-Length` is checked before reading. Default 1 MiB.
    pub fn body_limit(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config.settings).body_limit = limit;
        self
    }

    /// The largest response body stored for replay. A larger response still reaches its first
    /// caller in full; its key is then kept as *not replayable*, so duplicates get `409` and the
    /// handler never runs twice. Default 1 MiB.
    pub fn response_limit(mut self, limit: usize) -> Self {
        Arc::make_mut(&mut self.config.settings).response_limit = limit;
        self
    }

    /// How long a claim holds its key without renewal. While the handler runs the layer renews it
    /// every third of the lease; if the process dies, the key is free again within one lease.
    /// Default 10 s. Longer than about 100 years is cut to that. Keep it well above the time a
    /// store write can take (the Redis store's command timeout is 1 s): a completion that lands
    /// after the lease ran out is refused, as any write of a claim that is no longer ours, and
    /// the retry runs the handler again.
    ///
    /// # Panics
    ///
    /// If `lease` is shorter than 3 ms.
    pub fn lease(mut self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_millis(3),
            "IdempotencyLayer::lease must be at least 3 ms"
        );
        Arc::make_mut(&mut self.config.settings).lease = lease.min(MAX_DURATION);
        self
    }

    /// How long a completed response is kept for replay. Default 24 h (as Stripe). Longer than
    /// about 100 years is cut to that.
    ///
    /// # Panics
    ///
    /// If `retention` is zero.
    pub fn retention(mut self, retention: Duration) -> Self {
        assert!(
            !retention.is_zero(),
            "IdempotencyLayer::retention must not be zero"
        );
        Arc::make_mut(&mut self.config.settings).retention = retention.min(MAX_DURATION);
        self
    }

    /// What to do when the store fails: `false` (the default) answers `503` with `Retry-After`
    /// and does not run the handler; `true` runs the handler without a claim (duplicates may
    /// then run twice).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        Arc::make_mut(&mut self.config.settings).fail_open = fail_open;
        self
    }

    /// What happens to a handler whose client goes away (disconnects, times out, or drops the
    /// request future) while it runs.
    ///
    /// `false`, the default: the handler runs to completion on a task of its own, its response
    /// is stored, and the client's retry gets the replay — the effect happens once. This costs
    /// one allocation per covered request (the request's future is boxed so that it can be
    /// moved to a task) and a spawned task only when a client actually leaves.
    ///
    /// `true`: the handler's future is dropped with the request, as tower services usually are,
    /// and the key is released so the retry runs the handler again. Choose it only for handlers
    /// that are safe to run twice or that roll back when cancelled.
    pub fn cancel_on_disconnect(mut self, cancel: bool) -> Self {
        Arc::make_mut(&mut self.config.settings).cancel_on_disconnect = cancel;
        self
    }

    /// The wait advertised to a duplicate that arrives while the first request runs (`409` with
    /// `Retry-After`, or gRPC `UNAVAILABLE` with `grpc-retry-pushback-ms`): the smaller of this
    /// and the lease left. Default 1 s. The lease bounds how long a *crashed* owner holds the
    /// key; a live handler usually finishes much sooner, so advertising the whole lease would
    /// make clients wait (or give up) for nothing.
    pub fn in_progress_retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config.settings).in_progress_retry_after = after;
        self
    }

    /// The `Retry-After` sent with `503` when the store fails. Default 1 s.
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        Arc::make_mut(&mut self.config.settings).unavailable_retry_after = after;
        self
    }

    /// A response header never stored nor replayed (in addition to the hop-by-hop headers,
    /// which never are). For example a per-response `Set-Cookie`.
    pub fn strip_header(mut self, name: HeaderName) -> Self {
        Arc::make_mut(&mut self.config.settings)
            .strip_headers
            .push(name);
        self
    }

    /// Builds the layer's own error responses (`400`, `409`, `413`, `422`, `500`, `503`) with
    /// `f` instead of RFC 9457 problem documents, for APIs with an error format of their own.
    /// `f` gets the case and, for `409` and `503`, the wait to advertise; keep the status of
    /// [`ProblemKind::status`](crate::problem::ProblemKind::status) and send `Retry-After` when
    /// given one, or clients (and `RetryLayer`) cannot tell what to do.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use tower_once_idempotency::{problem::ProblemKind, IdempotencyLayer};
    ///
    /// let layer = IdempotencyLayer::new().problem_response(|kind: ProblemKind, retry_after| {
    ///     let mut res = http::Response::new(Bytes::from(format!(
    ///         r#"{{"error":{{"code":"{}"}}}}"#,
    ///         kind.type_uri().rsplit(':').next().unwrap_or("error")
    ///     )));
    ///     *res.status_mut() = kind.status();
    ///     if let Some(after) = retry_after {
    ///         res.headers_mut().insert("retry-after", after.as_secs().max(1).into());
    ///     }
    ///     res
    /// });
    /// # let _ = layer;
    /// ```
    pub fn problem_response<R>(mut self, f: R) -> Self
    where
        R: Fn(crate::problem::ProblemKind, Option<Duration>) -> http::Response<bytes::Bytes>
            + Send
            + Sync
            + 'static,
    {
        Arc::make_mut(&mut self.config.settings).problems =
            crate::problem::Problems::custom(Arc::new(f));
        self
    }

    /// Scopes keys, for example by tenant: see [`scope`](crate::scope).
    pub fn scope<Sc2>(self, scope: Sc2) -> IdempotencyLayer<St, Sc2, F, P>
    where
        Sc2: Scope,
    {
        IdempotencyLayer {
            store: self.store,
            scope,
            config: self.config,
        }
    }

    /// Replaces the request fingerprint: see [`fingerprint`](crate::fingerprint).
    pub fn fingerprint_with<F2>(self, fingerprinter: F2) -> IdempotencyLayer<St, Sc, F2, P>
    where
        F2: Fingerprinter,
    {
        let c = self.config;
        IdempotencyLayer {
            store: self.store,
            scope: self.scope,
            config: Config {
                settings: c.settings,
                detached: c.detached,
                fingerprinter,
                predicate: c.predicate,
            },
        }
    }

    /// Replaces the rule deciding which responses are stored: see [`predicate`](crate::predicate).
    pub fn store_when<P2>(self, predicate: P2) -> IdempotencyLayer<St, Sc, F, P2>
    where
        P2: StorePredicate,
    {
        let c = self.config;
        IdempotencyLayer {
            store: self.store,
            scope: self.scope,
            config: Config {
                settings: c.settings,
                detached: c.detached,
                predicate,
                fingerprinter: c.fingerprinter,
            },
        }
    }
}

impl<S, St, Sc, F, P> Layer<S> for IdempotencyLayer<St, Sc, F, P>
where
    St: IdempotencyStore,
    Sc: Clone,
    F: Clone,
    P: Clone,
{
    type Service = Idempotency<S, St, Sc, F, P>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(
            inner,
            self.store.clone(),
            self.scope.clone(),
            Arc::new(self.config.clone()),
        )
    }
}

impl<St: fmt::Debug, Sc, F, P> fmt::Debug for IdempotencyLayer<St, Sc, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("store", &self.store)
            .field("scope", &std::any::type_name::<Sc>())
            .field("config", &self.config)
            .finish()
    }
}
