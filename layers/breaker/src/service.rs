//! The middleware: which circuit a call goes through, and whether it may go.

use crate::circuit::{Admitted, Circuit};
use crate::error::{BreakerError, CircuitOpen};
use crate::future::ResponseFuture;
use crate::guard::Guard;
use crate::key::CircuitKey;
use crate::registry::Config;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};
use tower_once_core::attempt::Attempt;
use tower_once_core::carrier::Carrier;
use tower_once_core::classify::Classify;
use tower_once_core::shard::PerThread;
use tower_once_timeout::Deadline;
use tower_service::Service;

/// How often a gated service looks again at a half-open circuit whose probes are all taken.
const HALF_OPEN_RECHECK: Duration = Duration::from_millis(50);
/// How often it looks again at an open or isolated circuit (a person may close it).
const RECHECK: Duration = Duration::from_secs(1);

/// Middleware built by [`CircuitBreakerLayer`](crate::CircuitBreakerLayer).
pub struct CircuitBreaker<S, K = (), C = tower_once_core::classify::RetryOnError> {
    inner: S,
    config: PerThread<Config<K, C>>,
    // The key of the request being called, reused: no allocation per call.
    name: String,
    gate: Option<Gate>,
}

/// A service's readiness gate on its default circuit: the wait for the break to end, and the
/// admission reserved for the next call.
struct Gate {
    sleep: Option<Pin<Box<Sleep>>>,
    reserved: Option<Guard>,
}

impl<S, K, C> CircuitBreaker<S, K, C> {
    pub(crate) fn new(inner: S, config: PerThread<Config<K, C>>, gate: bool) -> Self {
        Self {
            inner,
            config,
            name: String::new(),
            gate: gate.then_some(Gate {
                sleep: None,
                reserved: None,
            }),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K, C> Clone for CircuitBreaker<S, K, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: self.config.clone(),
            name: String::new(),
            // A clone reserves its own admission.
            gate: self.gate.as_ref().map(|_| Gate {
                sleep: None,
                reserved: None,
            }),
        }
    }
}

impl<S: fmt::Debug, K, C> fmt::Debug for CircuitBreaker<S, K, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("inner", &self.inner)
            .field("config", self.config.get())
            .field("gated", &self.gate.is_some())
            .finish()
    }
}

impl<S, Req, K, C> Service<Req> for CircuitBreaker<S, K, C>
where
    S: Service<Req>,
    Req: Carrier,
    K: CircuitKey<Req>,
    C: Classify<S::Response, S::Error>,
{
    type Response = S::Response;
    type Error = BreakerError<S::Error>;
    type Future = ResponseFuture<S::Future, K, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(gate) = &mut self.gate {
            ready!(gate.poll_admitted(self.config.get().registry.default_circuit(), cx));
        }
        self.inner.poll_ready(cx).map_err(BreakerError::inner)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let config = self.config.local();
        let registry = &config.registry;
        // NOTE: an operation retried by a RetryLayer above counts once, by its first attempt.
        // A request that carries no attempt is placed where its future is first polled: in
        // the retry's scope even when this call runs on a `Buffer`'s worker.
        let (counted, in_scope) = match (registry.policy().every_attempt, Attempt::carried(&req)) {
            (true, _) => (true, false),
            (false, Some(attempt)) => (attempt.is_first(), false),
            (false, None) => (true, true),
        };
        let keyed = K::KEYED && {
            self.name.clear();
            config.key.key(&req, &mut self.name);
            !self.name.is_empty()
        };
        // NOTE: an admission reserved at `poll_ready` holds only while the circuit is in the
        // same period: reserved while closed, it does not pass a circuit that opened since.
        let reserved = self
            .gate
            .as_mut()
            .and_then(|gate| gate.reserved.take())
            .filter(Guard::is_current);
        let admitted = match reserved {
            // The gate reserved an admission on the default circuit for this call.
            Some(guard) if !keyed => Ok(guard.counted(counted)),
            _ => {
                let circuit = match keyed {
                    true => registry.lookup(&self.name),
                    false => registry.default_circuit().local(),
                };
                match circuit.0.admit(counted) {
                    Ok(admitted) => Ok(Guard::new(circuit, admitted)),
                    Err(refusal) => Err(CircuitOpen::new(
                        circuit.0.name().clone(),
                        refusal.state,
                        refusal.retry_after,
                    )),
                }
            }
        };
        match admitted {
            Ok(guard) => {
                let started = registry.policy().slow_call.map(|_| Instant::now());
                ResponseFuture::called(self.inner.call(req), config, guard, started, in_scope)
            }
            Err(open) => {
                crate::metrics::refusal(open.state());
                tracing::debug!(
                    circuit = open.circuit(),
                    state = open.state().as_str(),
                    "call refused"
                );
                ResponseFuture::refused(open)
            }
        }
    }
}

impl Gate {
    /// Ready once the default circuit admits a call, which it then holds for the next one;
    /// ready at once (the call is then refused) when the circuit admits none before the
    /// deadline in scope, so a caller is never held past it.
    fn poll_admitted(&mut self, circuit: &PerThread<Circuit>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.reserved.as_ref().is_some_and(Guard::is_current) {
                return Poll::Ready(());
            }
            // A reservation of an earlier period is given back.
            self.reserved = None;
            let local = circuit.local();
            match local.0.admit(true) {
                Ok(admitted) => {
                    self.sleep = None;
                    self.reserved = Some(Guard::new(local, admitted));
                    return Poll::Ready(());
                }
                Err(refusal) => {
                    let now = Instant::now();
                    let left = local.0.next_change();
                    // NOTE: waits no longer than the deadline in scope: a break that ends after
                    // it makes the service ready at once, and the call is refused.
                    let deadline = Deadline::current();
                    let admits_in_time = match (refusal.state, left, deadline) {
                        (crate::CircuitState::Open, Some(left), Some(deadline)) => {
                            tower_once_core::time::saturating_add(now, left) < deadline.instant()
                        }
                        // Only a person closes it: nothing is admitted by a deadline.
                        (crate::CircuitState::Isolated, _, Some(_)) => false,
                        (_, _, Some(deadline)) => !deadline.is_expired(),
                        (_, _, None) => true,
                    };
                    if !admits_in_time {
                        self.sleep = None;
                        return Poll::Ready(());
                    }
                    // Looked at again at least every second: a circuit closed by hand, or a
                    // probe that decided, lets the caller through without waiting the break.
                    let wait = match (refusal.state, left) {
                        (crate::CircuitState::HalfOpen, Some(left)) => left.min(HALF_OPEN_RECHECK),
                        (_, Some(left)) => left.min(RECHECK),
                        (_, None) => RECHECK,
                    };
                    let mut until = tower_once_core::time::saturating_add(now, wait);
                    if let Some(deadline) = deadline {
                        // Looked at again no later than the deadline, which ends the wait.
                        until = until.min(deadline.instant());
                    }
                    let sleep = self
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                    sleep.as_mut().reset(until);
                    ready!(sleep.as_mut().poll(cx));
                }
            }
        }
    }
}

impl Admitted {
    pub(crate) fn with_counted(self, counted: bool) -> Self {
        match self {
            Self::Closed { generation, .. } => Self::Closed {
                generation,
                counted,
            },
            probe => probe,
        }
    }
}

impl Guard {
    /// The same admission, counted (or not) as the call it is used for.
    pub(crate) fn counted(mut self, counted: bool) -> Self {
        self.admitted = self.admitted.with_counted(counted);
        self
    }
}
