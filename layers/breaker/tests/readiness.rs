//! The crate docs' "Readiness": with `gate_readiness`, the service is not ready while its
//! circuit is open, is ready again when the break ends with the probe reserved for its next
//! call, and a service dropped with a reserved probe gives it back. Without it, `poll_ready`
//! is the inner service's. Paused time; calls that reached the dependency are counted.

mod support;

use std::time::Duration;
use support::{Dependency, Health};
use tokio::time::timeout;
use tower::{Layer, Service, ServiceExt};
use tower_once_breaker::{CircuitBreakerLayer, CircuitState};
use tower_once_core::backoff::{Backoff, Jitter};

fn gated() -> CircuitBreakerLayer {
    CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .gate_readiness(true)
        .break_duration(
            Backoff::new(Duration::from_secs(5), 1.0, Duration::from_secs(5))
                .unwrap()
                .jitter(Jitter::None),
        )
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_makes_the_service_wait_for_the_break_and_reserves_the_probe() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let circuit = layer.circuits().circuit("");
    let mut svc = layer.layer(dep.service());
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    let before = tokio::time::Instant::now();
    assert!(
        timeout(Duration::from_millis(4900), svc.ready())
            .await
            .is_err(),
        "not ready during the break"
    );
    svc.ready().await.unwrap();
    assert_eq!(before.elapsed(), Duration::from_secs(5));
    assert_eq!(
        circuit.state(),
        CircuitState::HalfOpen,
        "the probe is reserved"
    );
    // Another service of the same layer is not ready while the probe is out.
    let mut other = layer.layer(dep.service());
    assert!(timeout(Duration::from_secs(1), other.ready())
        .await
        .is_err());
    dep.set(Health::Up);
    assert_eq!(svc.call(2).await.unwrap(), "ok");
    assert_eq!(circuit.state(), CircuitState::Closed);
    assert_eq!(other.ready().await.unwrap().call(3).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_service_dropped_with_a_reserved_probe_gives_it_back() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let mut svc = layer.layer(dep.service());
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(5)).await;
    svc.ready().await.unwrap();
    drop(svc);
    let mut next = layer.layer(dep.service());
    timeout(Duration::from_millis(100), next.ready())
        .await
        .expect("the probe came back")
        .unwrap();
    dep.set(Health::Up);
    assert_eq!(next.call(2).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_the_gate_an_open_circuit_is_ready_and_refuses_at_call() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let mut svc = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .layer(dep.service());
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    let err = timeout(Duration::from_millis(1), svc.ready())
        .await
        .expect("ready at once")
        .unwrap()
        .call(2)
        .await
        .unwrap_err();
    assert!(err.is_circuit_open());
    assert_eq!(dep.calls(), 1);
}

/// A gated service made ready while the circuit was closed keeps that admission: after the
/// circuit trips (through another service of the layer), its call is let through the open
/// circuit. A Worker holds such readiness across its blocking fetch.
#[tokio::test(start_paused = true)]
async fn readiness_from_a_closed_period_does_not_pass_an_open_circuit() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let circuit = layer.circuits().circuit("");
    let mut held = layer.layer(dep.service());
    held.ready().await.unwrap();
    let mut other = layer.layer(dep.service());
    other.ready().await.unwrap().call(1).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    let res = held.call(2).await;
    assert_eq!(dep.calls(), 1, "sent through the open circuit: {res:?}");
}

/// "A half-open circuit admits exactly `half_open_probes` calls": a probe reserved at
/// `poll_ready` and held past `max_half_open_wait` outlives its half-open period. The circuit
/// reopens, half-opens again and reserves a new probe for another service: both go,
/// concurrently, with `half_open_probes(1)`.
#[tokio::test(start_paused = true)]
async fn a_probe_reserved_past_max_half_open_is_not_a_second_probe() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated().max_half_open_wait(Duration::from_secs(10));
    let circuit = layer.circuits().circuit("");
    let mut held = layer.layer(dep.service());
    held.ready().await.unwrap().call(1).await.unwrap_err();
    held.ready().await.unwrap();
    assert_eq!(circuit.state(), CircuitState::HalfOpen, "probe reserved");
    let mut other = layer.layer(dep.service());
    other.ready().await.unwrap();
    assert_eq!(
        circuit.state(),
        CircuitState::HalfOpen,
        "a new period's probe"
    );
    dep.set(Health::Hangs);
    let _a = held.call(2);
    let _b = other.call(3);
    assert_eq!(
        dep.calls(),
        2,
        "two probes at once, with half_open_probes(1)"
    );
}

/// A clone of a service with a reserved probe reserves nothing; dropping the
/// original gives the probe back to the clone.
#[tokio::test(start_paused = true)]
async fn a_clone_does_not_inherit_a_reserved_probe_and_the_drop_gives_it_back() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let mut svc = layer.layer(dep.service());
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(5)).await;
    svc.ready().await.unwrap();
    let mut clone = svc.clone();
    assert!(timeout(Duration::from_secs(1), clone.ready())
        .await
        .is_err());
    drop(svc);
    timeout(Duration::from_millis(100), clone.ready())
        .await
        .expect("given back")
        .unwrap();
    dep.set(Health::Up);
    assert_eq!(clone.call(2).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 2);
}

// The gate's rechecks, and the deadline in scope.

/// Polls `svc.ready()` inside `deadline`'s scope (as a retry layer or a worker does) until
/// it is ready: how long that took, and how many polls it needed.
async fn ready_within<S: Service<u32>>(
    svc: &mut S,
    deadline: tower_once_timeout::Deadline,
) -> (Duration, u32) {
    let started = tokio::time::Instant::now();
    let mut polls = 0;
    let _ = std::future::poll_fn(|cx| {
        polls += 1;
        deadline.scope(|| svc.poll_ready(cx))
    })
    .await;
    (started.elapsed(), polls)
}

/// "A gated service never holds a caller past the deadline in scope": an isolated circuit
/// admits nothing before any deadline, so the service must be ready (and refuse) at once, or
/// at the latest at the deadline. It is held until its next one-second recheck.
#[tokio::test(start_paused = true)]
async fn an_isolated_circuit_never_holds_a_caller_past_its_deadline() {
    let dep = Dependency::default();
    let layer = gated();
    let circuit = layer.circuits().circuit("");
    circuit.isolate();
    let mut svc = layer.layer(dep.service());
    let deadline = tower_once_timeout::Deadline::after(Duration::from_millis(200));
    let (took, _) = ready_within(&mut svc, deadline).await;
    assert!(
        took <= Duration::from_millis(200),
        "held {took:?} with a 200 ms deadline in scope"
    );
    assert!(svc.call(1).await.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 0);
}

/// The same for a half-open circuit whose probe is taken: the caller may wait for the probe
/// to decide, but not past its deadline (it is rechecked every 50 ms, so a 20 ms deadline is
/// overrun by 30 ms).
#[tokio::test(start_paused = true)]
async fn a_half_open_circuit_with_its_probe_taken_never_holds_a_caller_past_its_deadline() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let circuit = layer.circuits().circuit("");
    let mut prober = layer.layer(dep.service());
    prober.ready().await.unwrap().call(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(5)).await;
    prober.ready().await.unwrap();
    assert_eq!(
        circuit.state(),
        CircuitState::HalfOpen,
        "the probe reserved"
    );
    let mut svc = layer.layer(dep.service());
    let deadline = tower_once_timeout::Deadline::after(Duration::from_millis(20));
    let (took, _) = ready_within(&mut svc, deadline).await;
    assert!(
        took <= Duration::from_millis(20),
        "held {took:?} with a 20 ms deadline in scope"
    );
}

/// No busy loop: a gated service waiting out a 5 s break (no deadline) is polled about once
/// per recheck, not spun; and a deadline past the break's end waits for the probe.
#[tokio::test(start_paused = true)]
async fn an_open_circuit_is_rechecked_not_spun_and_a_later_deadline_waits_for_the_probe() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = gated();
    let circuit = layer.circuits().circuit("");
    let mut svc = layer.layer(dep.service());
    svc.ready().await.unwrap().call(1).await.unwrap_err();
    let deadline = tower_once_timeout::Deadline::after(Duration::from_secs(6));
    let (took, polls) = ready_within(&mut svc, deadline).await;
    assert_eq!(took, Duration::from_secs(5));
    assert!(polls <= 8, "{polls} polls during a 5 s break");
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    // The reservation is one probe: another service is not ready.
    let mut other = layer.layer(dep.service::<u32>());
    assert!(timeout(Duration::from_secs(1), other.ready())
        .await
        .is_err());
}
