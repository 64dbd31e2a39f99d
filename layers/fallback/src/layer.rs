use crate::config::Config;
use crate::rule::Safety;
use crate::service::Fallback;
use std::fmt;
use std::time::Duration;
use tower_layer::Layer;
use tower_once_core::classify::RetryOnError;
use tower_once_core::shard::PerThread;

/// Sends a request whose primary failed to a secondary service, when that cannot repeat an
/// effect. See the [crate docs](crate) for the rule; [`HttpFallbackLayer`](crate::http::HttpFallbackLayer)
/// is the form for `http::Request`s.
///
/// The request type must be `Clone` (one copy is kept for the secondary). A plain request
/// cannot say whether running it twice is harmless, so only the failures that certainly did
/// not run go to the secondary, unless the layer is told more
/// ([`side_effect_free`](Self::side_effect_free), [`shares_records`](Self::shares_records)).
///
/// ```
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_once_fallback::FallbackLayer;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = tower::service_fn(|key: String| async move { Ok::<_, std::io::Error>(format!("cached {key}")) });
/// let svc = ServiceBuilder::new()
///     .layer(FallbackLayer::new(cache).side_effect_free(true))
///     .service_fn(|_: String| async { Err::<String, _>(std::io::Error::other("primary down")) });
/// assert_eq!(svc.oneshot("user:1".to_owned()).await.unwrap(), "cached user:1");
/// # }
/// ```
#[derive(Clone)]
pub struct FallbackLayer<T, C = RetryOnError, H = ()> {
    pub(crate) config: Config<T, C, H>,
}

impl<T> FallbackLayer<T> {
    /// Falls back to `secondary`, classifying outcomes with [`RetryOnError`] (every `Err` is
    /// a failure).
    pub fn new(secondary: T) -> Self {
        Self {
            config: Config {
                secondary,
                safety: Safety::default(),
                deadline: None,
                classifier: RetryOnError,
                hook: (),
            },
        }
    }
}

impl<T, C, H> FallbackLayer<T, C, H> {
    /// Declares that the requests have no side effects (reads, searches, LLM completions): any
    /// failure may go to the secondary. Default `false`.
    pub fn side_effect_free(mut self, free: bool) -> Self {
        self.config.safety.side_effect_free = free;
        self
    }

    /// Declares that the secondary shares the primary's idempotency records (another region of
    /// the same service, one store): a request with an idempotency key may go there after any
    /// failure, for the two run it once between them. Default `false`.
    pub fn shares_records(mut self, shared: bool) -> Self {
        self.config.safety.shares_records = shared;
        self
    }

    /// One deadline for the whole operation, primary and secondary: put on the request (and
    /// in scope), so the layers below (a `RetryLayer`, a `TimeoutLayer`) see what is left of
    /// it; an earlier deadline the request already carries wins. No request goes to the
    /// secondary once it has passed, and the secondary is cut at it. Default: none of its own.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.config.deadline = Some(deadline);
        self
    }

    /// How outcomes are classified: `Retry` and `InProgress` are failures that may fall back;
    /// `Success` and `Stop` (the caller's fault) are returned as they are.
    pub fn classify<C2>(self, classifier: C2) -> FallbackLayer<T, C2, H> {
        let c = self.config;
        FallbackLayer {
            config: Config {
                secondary: c.secondary,
                safety: c.safety,
                deadline: c.deadline,
                classifier,
                hook: c.hook,
            },
        }
    }

    /// Called before each request goes to the secondary: see
    /// [`OnFallback`](crate::hook::OnFallback).
    pub fn on_fallback<H2>(self, hook: H2) -> FallbackLayer<T, C, H2> {
        let c = self.config;
        FallbackLayer {
            config: Config {
                secondary: c.secondary,
                safety: c.safety,
                deadline: c.deadline,
                classifier: c.classifier,
                hook,
            },
        }
    }
}

impl<P, T: Clone, C: Clone, H: Clone> Layer<P> for FallbackLayer<T, C, H> {
    type Service = Fallback<P, T, C, H>;

    fn layer(&self, primary: P) -> Self::Service {
        Fallback {
            primary,
            config: PerThread::new(self.config.clone()),
        }
    }
}

impl<T, C, H> fmt::Debug for FallbackLayer<T, C, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackLayer")
            .field("config", &self.config)
            .finish()
    }
}
