//! The crate docs' "Placement: inside or outside a retry": a breaker inside a `RetryLayer`
//! counts each operation once (also behind a `Buffer`, and for `http::Request`s across a
//! spawned task), the retry layer waits for an open circuit's probe when that fits before its
//! deadline and gives up at once (`GiveUp::CircuitOpen`) when it does not, without drawing on
//! its budget; a breaker outside a retry counts each operation's final outcome. Paused time;
//! every test counts the calls that reached the dependency.

mod support;

use bytes::Bytes;
use http_body_util::Full;
use std::time::Duration;
use support::{Dependency, Health};
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_once_breaker::{CircuitBreakerLayer, CircuitState};
use tower_once_core::backoff::{Backoff, Jitter};
use tower_once_core::body::BufferedBody as ReplayBody;
use tower_once_core::unsent::Unsent;
use tower_once_retry::budget::RetryBudget;
use tower_once_retry::{GiveUp, RetryLayer};

fn fixed(secs: u64) -> Backoff {
    Backoff::new(Duration::from_secs(secs), 1.0, Duration::from_secs(secs))
        .unwrap()
        .jitter(Jitter::None)
}

#[tokio::test(start_paused = true)]
async fn inside_a_retry_one_failing_operation_counts_once() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new().consecutive_failures(3);
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(4).no_budget())
        .layer(breaker)
        .service(dep.service::<u32>());
    // Two operations of four failed attempts each: two failures, not eight.
    for _ in 0..2 {
        let err = svc.clone().oneshot(1).await.unwrap_err();
        assert_eq!(err.attempts(), 4);
        assert_eq!(err.reason(), GiveUp::Exhausted);
    }
    assert_eq!(dep.calls(), 8);
    assert_eq!(circuit.state(), CircuitState::Closed);
    // The third operation's first attempt is the third failure: its second attempt is
    // refused, its third waits for the break and goes as the probe (and fails), its fourth is
    // refused again.
    let err = svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    assert_eq!(dep.calls(), 10, "the first attempt and the probe");
    assert_eq!((err.attempts(), err.refusals()), (4, 2));
    assert_eq!(err.reason(), GiveUp::Exhausted);
    assert!(err.is_circuit_open(), "it ended on a refusal: {err}");
    assert!(err.circuit_retry_after().is_some());
}

#[tokio::test(start_paused = true)]
async fn counting_every_attempt_is_an_option() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(3)
        .count_every_attempt(true);
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(4).no_budget())
        .layer(breaker)
        .service(dep.service::<u32>());
    svc.oneshot(1).await.unwrap_err();
    assert_eq!(
        circuit.state(),
        CircuitState::Open,
        "tripped in its own retry loop"
    );
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn the_retry_waits_for_the_probe_when_it_fits_before_the_deadline() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(5));
    let circuit = breaker.circuits().circuit("");
    let budget = RetryBudget::new(0.0, 0, Duration::from_secs(10));
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(30))
                .budget(budget.clone()),
        )
        .layer(breaker)
        .service(dep.service::<u32>());
    // Trip it.
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    dep.set(Health::Up);
    let started = tokio::time::Instant::now();
    // Refused, then the retry waits 5 s (the circuit's word, not its backoff, and not its
    // empty budget) and its probe closes the circuit.
    assert_eq!(svc.clone().oneshot(2).await.unwrap(), "ok");
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(circuit.state(), CircuitState::Closed);
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_retry_gives_up_at_once_when_the_probe_is_past_its_deadline() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(60));
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(4)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .layer(breaker)
        .service(dep.service::<u32>());
    svc.clone().oneshot(1).await.unwrap_err();
    let started = tokio::time::Instant::now();
    let err = svc.clone().oneshot(2).await.unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait in vain");
    assert_eq!(err.reason(), GiveUp::CircuitOpen);
    assert!(err.is_circuit_open());
    assert_eq!((err.attempts(), err.refusals()), (1, 1));
    assert!(
        err.get_inner().unwrap().is_circuit_open(),
        "the breaker is named"
    );
    assert!(err.is_unsent(), "nothing was sent");
    assert!(err.to_string().contains("circuit_open"), "{err}");
    assert_eq!(dep.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn behind_a_buffer_the_retry_still_hears_the_refusal_and_counts_once() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .break_duration(fixed(60));
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(4)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .buffer(16)
        .layer(breaker)
        .service(dep.service::<String>());
    let err = svc.clone().oneshot("a".to_owned()).await.unwrap_err();
    assert_eq!(err.attempts(), 4);
    assert_eq!(
        circuit.state(),
        CircuitState::Closed,
        "one operation, one failure"
    );
    svc.clone().oneshot("b".to_owned()).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    assert_eq!(
        dep.calls(),
        5,
        "the second operation's retries were refused"
    );
    let err = svc.clone().oneshot("c".to_owned()).await.unwrap_err();
    assert_eq!(err.reason(), GiveUp::CircuitOpen);
    assert_eq!(dep.calls(), 5);
}

#[tokio::test(start_paused = true)]
async fn http_requests_carry_the_attempt_across_a_spawned_task() {
    type Req = http::Request<ReplayBody<Full<Bytes>>>;
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::http().consecutive_failures(2);
    let circuits = breaker.circuits();
    let guarded = breaker.layer(
        dep.service::<Req>()
            .map_response(|_| http::Response::new(Full::new(Bytes::new()))),
    );
    // The attempt reaches the breaker on another task, with nothing in scope there.
    let spawned = tower::service_fn(move |req: Req| {
        let svc = guarded.clone();
        async move { tokio::spawn(svc.oneshot(req)).await.unwrap() }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(4).no_budget().into_http())
        .service(spawned);
    let get = || {
        http::Request::get("http://API.example.com/v1")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let err = svc.clone().oneshot(get()).await.unwrap_err();
    assert_eq!(err.attempts(), 4);
    let circuit = circuits.find("http://api.example.com").unwrap();
    assert_eq!(circuit.state(), CircuitState::Closed, "counted once");
    svc.clone().oneshot(get()).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    assert_eq!(dep.calls(), 5);
    assert_eq!(
        circuits.circuit("").state(),
        CircuitState::Closed,
        "other hosts' circuit"
    );
}

#[tokio::test(start_paused = true)]
async fn outside_a_retry_it_counts_each_operations_final_outcome() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new().consecutive_failures(2);
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(breaker)
        .layer(RetryLayer::new().max_attempts(3).no_budget())
        .service(dep.service::<u32>());
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Closed);
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    assert_eq!(dep.calls(), 6);
    let err = svc.clone().oneshot(1).await.unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(dep.calls(), 6);
}

/// "A RetryLayer above ... gives up at once otherwise (GiveUp::CircuitOpen)": with
/// `gate_readiness`, an open circuit is not ready instead of refusing, so the retry waits
/// in `poll_ready` for its whole deadline and ends with GiveUp::Deadline.
#[tokio::test(start_paused = true)]
async fn a_retry_above_a_gated_breaker_gives_up_at_once_when_the_probe_is_past_its_deadline() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .gate_readiness(true)
        .break_duration(fixed(60));
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(4)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .layer(breaker)
        .service(dep.service::<u32>());
    // Trip it.
    let _ = svc.clone().oneshot(1).await;
    assert_eq!(circuit.state(), CircuitState::Open);
    let started = tokio::time::Instant::now();
    let err = svc.clone().oneshot(2).await.unwrap_err();
    assert_eq!(
        (err.reason(), started.elapsed()),
        (GiveUp::CircuitOpen, Duration::ZERO),
        "{err}"
    );
    assert_eq!(dep.calls(), 1);
}

/// Retry → Buffer → Breaker with http::Request: the refused attempts draw nothing
/// from an empty budget, and the operation counts once.
#[tokio::test(start_paused = true)]
async fn refused_attempts_behind_a_buffer_never_draw_the_budget() {
    type Req = http::Request<ReplayBody<Full<Bytes>>>;
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaker = CircuitBreakerLayer::http()
        .classify(tower_once_core::classify::RetryOnError)
        .consecutive_failures(1)
        .break_duration(fixed(2));
    let circuits = breaker.circuits();
    let guarded = ServiceBuilder::new().buffer(4).layer(breaker).service(
        dep.service::<Req>()
            .map_response(|_| http::Response::new(Full::new(Bytes::new()))),
    );
    let budget = RetryBudget::new(0.0, 0, Duration::from_secs(10));
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(30))
                .budget(budget)
                .into_http(),
        )
        .service(guarded);
    let get = || {
        http::Request::get("http://api.example.com/v1")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // First attempt fails (sent): the budget is empty, so no retry.
    let err = svc.clone().oneshot(get()).await.unwrap_err();
    assert_eq!(err.reason(), GiveUp::Budget);
    // The circuit is open: refused, waits for the probe (no budget needed), probe succeeds.
    dep.set(Health::Up);
    let res = svc.clone().oneshot(get()).await;
    assert!(res.is_ok(), "{:?}", res.err().map(|e| e.to_string()));
    assert_eq!(dep.calls(), 2);
    assert_eq!(
        circuits.find("http://api.example.com").unwrap().state(),
        CircuitState::Closed
    );
}
