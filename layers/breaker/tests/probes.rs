//! The crate docs' half-open row under real contention: however many tasks on however many
//! threads call a half-open circuit at once, exactly `half_open_probes` calls reach the
//! dependency, and the rest are refused; when they succeed the circuit closes. Real threads
//! (a multi-thread runtime), bounded waits, no timing assertion.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};
use tower_once_breaker::{CircuitBreakerLayer, CircuitState};
use tower_once_core::backoff::{Backoff, Jitter};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contending_callers_admit_exactly_the_configured_probes() {
    for probes in [1u32, 3] {
        for _trial in 0..30 {
            trial(probes).await;
        }
    }
}

async fn trial(probes: u32) {
    let reached = Arc::new(AtomicU32::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let dep = {
        let (reached, gate, failing) = (reached.clone(), gate.clone(), failing.clone());
        tower::service_fn(move |_: u32| {
            let (reached, gate, failing) = (reached.clone(), gate.clone(), failing.clone());
            async move {
                if failing.load(SeqCst) {
                    return Err("down");
                }
                reached.fetch_add(1, SeqCst);
                // Probes stay in flight until the test lets them go.
                let _permit = gate.acquire().await.map_err(|_| "closed")?;
                Ok("ok")
            }
        })
    };
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .half_open_probes(probes)
        .break_duration(
            Backoff::new(Duration::from_millis(1), 1.0, Duration::from_millis(1))
                .unwrap()
                .jitter(Jitter::None),
        );
    let circuit = layer.circuits().circuit("");
    let svc = layer.layer(dep);
    svc.clone().oneshot(0).await.unwrap_err();
    assert_eq!(circuit.state(), CircuitState::Open);
    failing.store(false, SeqCst);
    // Let the 1 ms break pass on the real clock, boundedly.
    for _ in 0..1000 {
        if circuit.next_change().is_some_and(|d| d.is_zero()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let callers = 64;
    let start = Arc::new(tokio::sync::Barrier::new(callers));
    let refused = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let (svc, start, refused) = (svc.clone(), start.clone(), refused.clone());
            tokio::spawn(async move {
                start.wait().await;
                match svc.oneshot(i as u32).await {
                    Ok(_) => true,
                    Err(e) => {
                        assert!(e.is_circuit_open(), "{e}");
                        refused.fetch_add(1, SeqCst);
                        false
                    }
                }
            })
        })
        .collect();
    // Every caller either reached the dependency or was refused.
    for _ in 0..10_000 {
        if reached.load(SeqCst) + refused.load(SeqCst) == callers as u32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(reached.load(SeqCst), probes, "exactly the probes went");
    assert_eq!(refused.load(SeqCst), callers as u32 - probes);
    assert_eq!(circuit.state(), CircuitState::HalfOpen);
    gate.add_permits(callers);
    let succeeded = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .filter(|ok| *ok.as_ref().unwrap())
        .count();
    assert_eq!(succeeded as u32, probes);
    assert_eq!(circuit.state(), CircuitState::Closed);
}
