//! The crate docs' semantics tables: when a circuit opens (failures in a row, a failure ratio
//! with a minimum throughput, slow calls), what it refuses and says, how half-open probes
//! decide (and give their place back), breaks that back off, a half-open circuit that cannot
//! get stuck, stale outcomes, manual steering and the state-change hook. Paused time; every
//! test counts the calls that reached the dependency.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{Dependency, Health};
use tower::{Layer, Service, ServiceExt};
use tower_once_breaker::hook::{Cause, StateChange};
use tower_once_breaker::{BreakerError, CircuitBreakerLayer, CircuitState};
use tower_once_core::backoff::{Backoff, Jitter};

type Error = BreakerError<std::io::Error>;

async fn call<S>(svc: &mut S) -> Result<&'static str, Error>
where
    S: Service<u32, Response = &'static str, Error = Error>,
{
    svc.ready().await?.call(7).await
}

fn fixed(secs: u64) -> Backoff {
    Backoff::new(Duration::from_secs(secs), 1.0, Duration::from_secs(secs))
        .unwrap()
        .jitter(Jitter::None)
}

#[tokio::test(start_paused = true)]
async fn failures_in_a_row_open_it_and_it_refuses_without_sending() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(3)
        .break_duration(fixed(5));
    let mut svc = layer.layer(dep.service());
    for _ in 0..3 {
        assert!(!call(&mut svc).await.unwrap_err().is_circuit_open());
    }
    assert_eq!(dep.calls(), 3);
    let refused = call(&mut svc).await.unwrap_err();
    assert!(refused.is_circuit_open());
    assert_eq!(refused.circuit_retry_after(), Some(Duration::from_secs(5)));
    assert_eq!(
        refused.to_string(),
        "the circuit is open: a probe is admitted in 5.0 s"
    );
    assert_eq!(dep.calls(), 3, "refused calls are never sent");
    tokio::time::advance(Duration::from_secs(2)).await;
    let refused = call(&mut svc).await.unwrap_err();
    assert_eq!(refused.circuit_retry_after(), Some(Duration::from_secs(3)));
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_success_between_failures_starts_the_count_again() {
    let dep = Dependency::default();
    let mut svc = CircuitBreakerLayer::new()
        .consecutive_failures(3)
        .layer(dep.service());
    for _ in 0..5 {
        dep.set(Health::Down);
        call(&mut svc).await.unwrap_err();
        call(&mut svc).await.unwrap_err();
        dep.set(Health::Up);
        call(&mut svc).await.unwrap();
    }
    assert_eq!(dep.calls(), 15, "never opened");
}

#[tokio::test(start_paused = true)]
async fn the_ratio_needs_its_minimum_throughput_and_counts_only_the_window() {
    let dep = Dependency::default();
    let layer = CircuitBreakerLayer::new().failure_ratio(0.5, 10, Duration::from_secs(10));
    let mut svc = layer.layer(dep.service());
    // 9 failures: all of them failed, but fewer calls than the minimum.
    dep.set(Health::Down);
    for _ in 0..9 {
        assert!(!call(&mut svc).await.unwrap_err().is_circuit_open());
    }
    // They age out of the window; then 6 successes and 5 failures: 5/11 < 0.5.
    tokio::time::advance(Duration::from_secs(11)).await;
    dep.set(Health::Up);
    for _ in 0..6 {
        call(&mut svc).await.unwrap();
    }
    dep.set(Health::Down);
    for _ in 0..5 {
        assert!(!call(&mut svc).await.unwrap_err().is_circuit_open());
    }
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Closed);
    // The sixth failure: 6/12.
    assert!(!call(&mut svc).await.unwrap_err().is_circuit_open());
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Open);
    assert!(call(&mut svc).await.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 21);
}

#[tokio::test(start_paused = true)]
async fn the_default_opens_within_tens_of_failed_calls() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let mut svc = CircuitBreakerLayer::new().layer(dep.service());
    let mut sent = 0;
    while !call(&mut svc).await.unwrap_err().is_circuit_open() {
        sent += 1;
        assert!(sent < 100, "never opened");
    }
    assert_eq!(sent, 20, "half of at least 20 calls");
    assert_eq!(dep.calls(), 20);
}

#[tokio::test(start_paused = true)]
async fn a_probe_after_the_break_closes_it_and_a_failed_probe_doubles_the_break() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let breaks = Backoff::new(Duration::from_secs(4), 2.0, Duration::from_secs(10))
        .unwrap()
        .jitter(Jitter::None);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(breaks);
    let circuit = layer.circuits().circuit("");
    let mut svc = layer.layer(dep.service());
    call(&mut svc).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    let mut probe_times = Vec::new();
    let mut breaks_seen = Vec::new();
    let start = tokio::time::Instant::now();
    for _ in 0..4 {
        let wait = call(&mut svc)
            .await
            .unwrap_err()
            .circuit_retry_after()
            .unwrap();
        breaks_seen.push(wait.as_secs());
        tokio::time::advance(wait).await;
        // The probe: sent, fails, opens it again.
        assert!(!call(&mut svc).await.unwrap_err().is_circuit_open());
        probe_times.push(start.elapsed().as_secs());
    }
    assert_eq!(breaks_seen, [4, 8, 10, 10], "doubling, capped");
    assert_eq!(dep.calls(), 5, "one call, then one probe per break");
    dep.set(Health::Up);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(call(&mut svc).await.unwrap(), "ok");
    assert_eq!(circuit.state(), CircuitState::Closed);
    // Closed by a probe: the backoff starts over.
    dep.set(Health::Down);
    call(&mut svc).await.unwrap_err();
    assert_eq!(
        call(&mut svc).await.unwrap_err().circuit_retry_after(),
        Some(Duration::from_secs(4))
    );
}

#[tokio::test(start_paused = true)]
async fn half_open_admits_only_its_probes_and_needs_each_to_succeed() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .half_open_probes(2)
        .break_duration(fixed(1));
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    // Two probes that take a second each: a third call meanwhile is refused.
    dep.set(Health::Up);
    dep.delay(Duration::from_secs(1));
    let first = tokio::spawn(svc.clone().oneshot(1));
    tokio::task::yield_now().await;
    dep.delay(Duration::from_secs(2));
    let second = tokio::spawn(svc.clone().oneshot(2));
    tokio::task::yield_now().await;
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    let third = svc.clone().oneshot(3).await.unwrap_err();
    assert!(third.is_circuit_open());
    assert_eq!(third.open().unwrap().state(), CircuitState::HalfOpen);
    assert_eq!(third.circuit_retry_after(), None, "a probe decides when");
    assert_eq!(first.await.unwrap().unwrap(), "ok");
    assert_eq!(
        circuit.state(),
        CircuitState::HalfOpen,
        "one success of the two needed"
    );
    assert_eq!(second.await.unwrap().unwrap(), "ok");
    assert_eq!(circuit.state(), CircuitState::Closed);
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_gives_its_place_back() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1));
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Hangs);
    let probe = tokio::spawn(svc.clone().oneshot(1));
    tokio::task::yield_now().await;
    assert!(svc.clone().oneshot(2).await.unwrap_err().is_circuit_open());
    probe.abort();
    let _ = probe.await;
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    dep.set(Health::Up);
    assert_eq!(
        svc.clone().oneshot(3).await.unwrap(),
        "ok",
        "the place came back"
    );
    assert_eq!(circuit.state(), CircuitState::Closed);
    assert_eq!(dep.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_hung_probe_cannot_keep_it_half_open() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .max_half_open_wait(Duration::from_secs(10));
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Hangs);
    let _hung = tokio::spawn(svc.clone().oneshot(1));
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    assert!(svc.clone().oneshot(2).await.unwrap_err().is_circuit_open());
    tokio::time::advance(Duration::from_secs(1)).await;
    // The longest wait is over: the next call opens it again (a failed probe), then after
    // the break a new probe goes.
    let reopened = svc.clone().oneshot(3).await.unwrap_err();
    assert_eq!(reopened.open().unwrap().state(), CircuitState::Open);
    assert_eq!(circuit.state(), CircuitState::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    assert_eq!(svc.clone().oneshot(4).await.unwrap(), "ok");
    assert_eq!(circuit.state(), CircuitState::Closed);
    assert_eq!(
        dep.calls(),
        3,
        "the first call, the hung probe, the new probe"
    );
}

#[tokio::test(start_paused = true)]
async fn slow_successes_count_as_failures() {
    let dep = Dependency::default();
    dep.delay(Duration::from_secs(3));
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .slow_call(Duration::from_secs(2));
    let svc = layer.layer(dep.service());
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), "ok");
    assert_eq!(svc.clone().oneshot(2).await.unwrap(), "ok");
    assert!(svc.clone().oneshot(3).await.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_faults_count_as_neither() {
    // A classifier that says `Stop` for every error: the caller's fault.
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = calls.clone();
    let mut svc = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .classify(|outcome: &Result<(), &'static str>| match outcome {
            Ok(_) => tower_once_core::classify::Action::Success,
            Err(_) => tower_once_core::classify::Action::Stop,
        })
        .layer(tower::service_fn(move |_: u32| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Err::<(), _>("422 unprocessable") }
        }));
    for _ in 0..10 {
        let err = svc.ready().await.unwrap().call(1).await.unwrap_err();
        assert!(!err.is_circuit_open());
    }
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 10);
}

#[tokio::test(start_paused = true)]
async fn calls_let_through_before_a_transition_do_not_count_after_it() {
    let dep = Dependency::default();
    dep.delay(Duration::from_secs(5));
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .break_duration(fixed(1));
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    // Two slow calls let through while closed.
    let slow: Vec<_> = (0..2)
        .map(|i| tokio::spawn(svc.clone().oneshot(i)))
        .collect();
    tokio::task::yield_now().await;
    // Meanwhile the circuit is opened and closed by hand: a new period.
    circuit.isolate();
    circuit.reset();
    for call in slow {
        assert!(!call.await.unwrap().unwrap_err().is_circuit_open());
    }
    assert_eq!(
        circuit.state(),
        CircuitState::Closed,
        "their failures belonged to the earlier period"
    );
}

#[tokio::test(start_paused = true)]
async fn isolate_close_and_reset_by_hand() {
    let dep = Dependency::default();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(
            Backoff::new(Duration::from_secs(1), 2.0, Duration::from_secs(60))
                .unwrap()
                .jitter(Jitter::None),
        );
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    circuit.isolate();
    let refused = svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(refused.open().unwrap().state(), CircuitState::Isolated);
    assert_eq!(refused.circuit_retry_after(), None);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(
        svc.clone().oneshot(1).await.unwrap_err().is_circuit_open(),
        "until closed by hand"
    );
    circuit.close();
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 1);
    // Trips remembered by `close`, forgotten by `reset`.
    dep.set(Health::Down);
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(circuit.next_change(), Some(Duration::from_secs(1)));
    circuit.close();
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(
        circuit.next_change(),
        Some(Duration::from_secs(2)),
        "the second trip"
    );
    circuit.reset();
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(
        circuit.next_change(),
        Some(Duration::from_secs(1)),
        "forgotten"
    );
}

#[tokio::test(start_paused = true)]
async fn the_hook_sees_every_transition_with_its_reason() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .on_state_change(move |c: &StateChange<'_>| {
            log.lock()
                .unwrap()
                .push((c.from, c.to, c.cause, c.open_for));
        });
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    svc.clone().oneshot(1).await.unwrap();
    layer.circuits().circuit("").isolate();
    use CircuitState::*;
    let one = Some(Duration::from_secs(1));
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (Closed, Open, Cause::Failures, one),
            (Open, HalfOpen, Cause::BreakOver, None),
            (HalfOpen, Open, Cause::ProbeFailed, one),
            (Open, HalfOpen, Cause::BreakOver, None),
            (HalfOpen, Closed, Cause::ProbesSucceeded, None),
            (Closed, Isolated, Cause::Manual, None),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn clones_of_the_layer_and_its_services_share_circuits_and_a_new_setting_starts_fresh() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new().consecutive_failures(2);
    let a = layer.layer(dep.service());
    let b = layer.clone().layer(dep.service());
    a.oneshot(1).await.unwrap_err();
    b.clone().oneshot(1).await.unwrap_err();
    assert!(b.oneshot(1).await.unwrap_err().is_circuit_open());
    let fresh = layer.consecutive_failures(5).layer(dep.service());
    assert!(!fresh.oneshot(1).await.unwrap_err().is_circuit_open());
}

#[test]
#[should_panic(expected = "the ratio must be in (0, 1]")]
fn a_ratio_above_one_is_refused_when_built() {
    let _ = CircuitBreakerLayer::new().failure_ratio(1.5, 10, Duration::from_secs(1));
}

#[test]
#[should_panic(expected = "consecutive_failures must be at least 1")]
fn zero_failures_in_a_row_is_refused_when_built() {
    let _ = CircuitBreakerLayer::new().consecutive_failures(0);
}

/// `CircuitHandle::close`: "Closes it, with an empty window". On a closed circuit with
/// failures counted it empties nothing: the next failure trips it.
#[tokio::test(start_paused = true)]
async fn close_by_hand_empties_the_window_of_a_closed_circuit() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new().consecutive_failures(3);
    let circuit = layer.circuits().circuit("");
    let mut svc = layer.layer(dep.service());
    call(&mut svc).await.unwrap_err();
    call(&mut svc).await.unwrap_err();
    circuit.close();
    call(&mut svc).await.unwrap_err();
    assert_eq!(
        circuit.state(),
        CircuitState::Closed,
        "one failure after an emptied window"
    );
}

/// A probe whose outcome is the caller's fault (Stop) gives its place back; a stale
/// success of a call admitted in an earlier closed period does not close a later period.
#[tokio::test(start_paused = true)]
async fn outcomes_of_an_earlier_period_never_decide_a_later_one() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    dep.delay(Duration::from_secs(3));
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .half_open_probes(2);
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep.service());
    // Slow call admitted while closed.
    let slow = tokio::spawn(svc.clone().oneshot(1));
    tokio::task::yield_now().await;
    dep.delay(Duration::ZERO);
    svc.clone().oneshot(2).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    dep.delay(Duration::from_secs(5));
    let p1 = tokio::spawn(svc.clone().oneshot(3));
    tokio::task::yield_now().await;
    // The slow call from the closed period now fails: it must not reopen the half-open one.
    let _ = slow.await;
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    let _ = p1.await;
    assert_eq!(circuit.state(), CircuitState::HalfOpen, "one of two probes");
    assert_eq!(dep.calls(), 3);
}

/// A hook that panics once, on the transition named, then watches quietly.
fn panics_once_on(cause: Cause) -> impl Fn(&StateChange<'_>) + Send + Sync + 'static {
    let armed = std::sync::atomic::AtomicBool::new(true);
    move |c: &StateChange<'_>| {
        if c.cause == cause && armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            panic!("the hook failed on {}", c.cause);
        }
    }
}

/// A hook that panics when the break is over (in the call that found it over, which the
/// circuit has already made its first probe) is contained (crate docs: a hook that panics is
/// logged and the layer goes on): that call goes on as the probe and closes the circuit; no
/// probe place is kept.
#[tokio::test(start_paused = true)]
async fn a_hook_that_panics_when_the_break_ends_does_not_keep_the_probe_place() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .on_state_change(panics_once_on(Cause::BreakOver));
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    assert_eq!(dep.calls(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    let probe = svc.clone().oneshot(1).await;
    assert_eq!(
        layer.circuits().circuit("").state(),
        CircuitState::Closed,
        "the call whose hook panicked was the probe: {probe:?}"
    );
    assert_eq!(probe.unwrap(), "ok");
    assert_eq!(dep.calls(), 2, "the probe reached the dependency");
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 3);
}

/// A hook that panics when the break ends inside `poll_ready` of a service with
/// `gate_readiness` (it holds the admission it finds ready) keeps no probe place: the ready
/// service dropped uncalled gives it back, and the next call is the probe and closes the
/// circuit.
#[tokio::test(start_paused = true)]
async fn a_hook_that_panics_in_poll_ready_when_the_break_ends_does_not_keep_the_probe_place() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .gate_readiness(true)
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .on_state_change(panics_once_on(Cause::BreakOver));
    let mut svc = layer.layer(dep.service());
    call(&mut svc).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    let mut other = svc.clone();
    assert!(other.ready().await.is_ok(), "the hook's panic is contained");
    drop(other);
    let next = call(&mut svc).await;
    assert_eq!(
        layer.circuits().circuit("").state(),
        CircuitState::Closed,
        "the next call was the probe: {next:?}"
    );
    assert_eq!(dep.calls(), 2);
}

/// A hook that panics when the circuit trips (in the failing call's future) leaves it open:
/// the tripping call ends with its own error, later calls are refused without being sent, and
/// after the break a probe closes it. The tripping call ran once.
#[tokio::test(start_paused = true)]
async fn a_hook_that_panics_on_the_trip_leaves_the_circuit_open_and_working() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .break_duration(fixed(1))
        .on_state_change(panics_once_on(Cause::Failures));
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    let tripping = svc.clone().oneshot(1).await.unwrap_err();
    assert!(!tripping.is_circuit_open(), "its own error: {tripping}");
    assert_eq!(dep.calls(), 2, "the tripping call ran once");
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Open);
    assert!(svc.clone().oneshot(1).await.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 2, "refused, not sent");
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    svc.clone().oneshot(1).await.unwrap();
    assert_eq!(dep.calls(), 3);
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Closed);
    // It trips again, its hook quiet now.
    dep.set(Health::Down);
    svc.clone().oneshot(1).await.unwrap_err();
    svc.clone().oneshot(1).await.unwrap_err();
    assert!(svc.clone().oneshot(1).await.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 5);
}

/// A hook that panics when the probe closes the circuit leaves it closed (the probe ran once,
/// its answer returned) and every later call is sent.
#[tokio::test(start_paused = true)]
async fn a_hook_that_panics_when_probes_close_it_leaves_it_closed() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .break_duration(fixed(1))
        .on_state_change(panics_once_on(Cause::ProbesSucceeded));
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    tokio::time::advance(Duration::from_secs(1)).await;
    dep.set(Health::Up);
    assert_eq!(svc.clone().oneshot(1).await.unwrap(), "ok");
    assert_eq!(dep.calls(), 2, "the probe ran once");
    assert_eq!(layer.circuits().circuit("").state(), CircuitState::Closed);
    for _ in 0..3 {
        svc.clone().oneshot(1).await.unwrap();
    }
    assert_eq!(dep.calls(), 5);
}
