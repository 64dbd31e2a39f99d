//! [`StepLayer`]: its settings and builder.

use crate::codec::Json;
use crate::config::{
    Settings, DEFAULT_LEASE, DEFAULT_MAX_WAIT, DEFAULT_RESULT_LIMIT, DEFAULT_RETENTION,
};
use crate::service::Steps;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::classify::RetryOnError;

/// Runs each step once: see the [crate docs](crate).
///
/// ```
/// use tower::{Layer, ServiceExt};
/// use tower_once_idempotency::store::MemoryStore;
/// use tower_once_step::{Step, StepId, StepLayer};
///
/// # #[derive(Debug)] struct Lookup(&'static str);
/// # impl tower_once_step::StepRequest for Lookup {}
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let tool = tower::service_fn(|Lookup(order)| async move {
///     Ok::<_, std::io::Error>(format!("order {order}: shipped"))
/// });
/// let steps = StepLayer::new(MemoryStore::new()).layer(tool);
///
/// let id = StepId::new("run-1", 1, "lookup");
/// let first = steps.clone().oneshot(Step::new(id.clone(), Lookup("A7"))).await.unwrap();
/// assert!(!first.is_replayed());
/// let again = steps.oneshot(Step::new(id, Lookup("A7"))).await.unwrap();
/// assert!(again.is_replayed()); // the tool was not called
/// assert_eq!(again.value(), "order A7: shipped");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StepLayer<St, C = Json, K = RetryOnError, V = ()> {
    settings: Arc<Settings<St, C, K, V>>,
}

impl<St> StepLayer<St> {
    /// Steps kept in `store` (any `IdempotencyStore`: memory, Redis, Redis Cluster,
    /// Postgres), results as JSON, `Ok` a success.
    pub fn new(store: St) -> Self {
        Self {
            settings: Arc::new(Settings {
                store,
                codec: Json,
                classifier: RetryOnError,
                verify: (),
                lease: DEFAULT_LEASE,
                retention: DEFAULT_RETENTION,
                max_wait: DEFAULT_MAX_WAIT,
                result_limit: DEFAULT_RESULT_LIMIT,
                scoped: false,
            }),
        }
    }
}

impl<St: Clone, C: Clone, K: Clone, V: Clone> StepLayer<St, C, K, V> {
    fn map<C2, K2, V2>(
        self,
        f: impl FnOnce(Settings<St, C, K, V>) -> Settings<St, C2, K2, V2>,
    ) -> StepLayer<St, C2, K2, V2> {
        let settings = Arc::try_unwrap(self.settings).unwrap_or_else(|shared| Settings {
            store: shared.store.clone(),
            codec: shared.codec.clone(),
            classifier: shared.classifier.clone(),
            verify: shared.verify.clone(),
            lease: shared.lease,
            retention: shared.retention,
            max_wait: shared.max_wait,
            result_limit: shared.result_limit,
            scoped: shared.scoped,
        });
        StepLayer {
            settings: Arc::new(f(settings)),
        }
    }

    /// How results are kept ([`Json`] by default; any [`Codec`](crate::Codec)).
    pub fn codec<C2: Clone>(self, codec: C2) -> StepLayer<St, C2, K, V> {
        self.map(|s| Settings {
            store: s.store,
            codec,
            classifier: s.classifier,
            verify: s.verify,
            lease: s.lease,
            retention: s.retention,
            max_wait: s.max_wait,
            result_limit: s.result_limit,
            scoped: s.scoped,
        })
    }

    /// Which outcomes are a step's result (`Action::Success`); only those are stored. The
    /// default takes every `Ok` as a success: for a tool whose answer carries a status, say
    /// which answers are its result, so that an upstream `409`, `429`, `4xx` or `5xx` is
    /// returned but never stored as the tool's result. `Action::Stop` marks a refusal (the
    /// call did not happen); `Action::Retry` an answer that may have had its effect (a `5xx`),
    /// which a step that may not be sent twice treats as an unknown outcome. Errors are not
    /// classified: one that says the call was never sent (`Unsent`) frees the step; any
    /// other may have run, and the step's [`OnUnknown`](crate::OnUnknown) policy decides.
    ///
    /// ```
    /// use tower_once_core::classify::Action;
    /// # #[derive(serde::Serialize, serde::Deserialize)] struct ToolResult { status: u16 }
    /// let by_status = |outcome: &Result<ToolResult, std::io::Error>| match outcome {
    ///     Ok(r) if r.status < 300 => Action::Success,
    ///     Ok(r) if r.status >= 500 || r.status == 429 => Action::Retry { after: None },
    ///     Ok(_) => Action::Stop,
    ///     Err(_) => Action::Retry { after: None },
    /// };
    /// let layer = tower_once_step::StepLayer::new(tower_once_idempotency::store::MemoryStore::new())
    ///     .classify(by_status);
    /// # let _ = layer;
    /// ```
    pub fn classify<K2: Clone>(self, classifier: K2) -> StepLayer<St, C, K2, V> {
        self.map(|s| Settings {
            store: s.store,
            codec: s.codec,
            classifier,
            verify: s.verify,
            lease: s.lease,
            retention: s.retention,
            max_wait: s.max_wait,
            result_limit: s.result_limit,
            scoped: s.scoped,
        })
    }

    /// Asks the downstream whether a call whose outcome is unknown happened, before the step
    /// is recorded as unknown: see [`Verify`](crate::Verify). Only steps that may not be sent
    /// twice ([`OnUnknown::Refuse`](crate::OnUnknown)) ask. One hook serves every tool under
    /// the layer: branch on [`StepId::tool`](crate::StepId::tool) (and find the call by its
    /// run, [`StepId::run`](crate::StepId::run)).
    pub fn verify<V2: Clone>(self, verify: V2) -> StepLayer<St, C, K, V2> {
        self.map(|s| Settings {
            store: s.store,
            codec: s.codec,
            classifier: s.classifier,
            verify,
            lease: s.lease,
            retention: s.retention,
            max_wait: s.max_wait,
            result_limit: s.result_limit,
            scoped: s.scoped,
        })
    }

    /// How long a step in progress holds its claim without renewal (10 s by default); renewed
    /// every third of it while the call runs. A step whose owner died is taken over (or
    /// settled as unknown) once this passes.
    ///
    /// # Panics
    ///
    /// If `lease` is under 3 ms.
    pub fn lease(self, lease: Duration) -> Self {
        assert!(
            lease >= Duration::from_millis(3),
            "StepLayer::lease must be at least 3 ms"
        );
        self.map(|s| Settings { lease, ..s })
    }

    /// How long a step's record is kept (7 days by default): a repeat after it runs again.
    ///
    /// # Panics
    ///
    /// If `retention` is zero.
    pub fn retention(self, retention: Duration) -> Self {
        assert!(
            !retention.is_zero(),
            "StepLayer::retention must not be zero"
        );
        self.map(|s| Settings { retention, ..s })
    }

    /// How long a step waits for the same step running elsewhere when its request carries no
    /// deadline and none is in scope (60 s by default).
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.map(|s| Settings { max_wait, ..s })
    }

    /// The largest encoded result stored (1 MiB by default): a larger one is returned, not
    /// stored, and the step is not done.
    pub fn result_limit(self, bytes: usize) -> Self {
        self.map(|s| Settings {
            result_limit: bytes,
            ..s
        })
    }

    /// Every step must carry a scope ([`Step::scope`](crate::Step::scope): its tenant or
    /// principal); one without is refused, nothing sent. Steps of two scopes never share a
    /// record.
    pub fn scoped(self) -> Self {
        self.map(|s| Settings { scoped: true, ..s })
    }
}

impl<S, St, C, K, V> Layer<S> for StepLayer<St, C, K, V> {
    type Service = Steps<S, St, C, K, V>;

    fn layer(&self, inner: S) -> Self::Service {
        Steps::new(inner, Arc::clone(&self.settings))
    }
}
