//! The `key` module's promises: one circuit per scheme and authority for HTTP (credentials left
//! out of its name), a closure for anything else, and a hard bound on the number of circuits:
//! a stream of hostile keys cannot grow memory, nor evict (and so reset) an open circuit.

mod support;

use std::time::Duration;
use support::{Dependency, Health};
use tower::{Layer, Service, ServiceExt};
use tower_once_breaker::CircuitBreakerLayer;
use tower_once_breaker::CircuitState;
use tower_once_core::classify::RetryOnError;

fn get(uri: &str) -> http::Request<()> {
    http::Request::get(uri).body(()).unwrap()
}

#[tokio::test(start_paused = true)]
async fn one_sick_host_does_not_open_the_circuit_of_another() {
    let sick = Dependency::default();
    sick.set(Health::Down);
    let healthy = Dependency::default();
    let layer = CircuitBreakerLayer::http()
        .classify(RetryOnError)
        .consecutive_failures(2);
    let circuits = layer.circuits();
    // One client for both hosts, routing by host as a real one does.
    let (s, h) = (sick.service(), healthy.service());
    let client = layer.layer(tower::service_fn(move |req: http::Request<()>| {
        let to_sick = req.uri().host() == Some("sick.example");
        let (mut s, mut h) = (s.clone(), h.clone());
        async move {
            if to_sick {
                s.ready().await?.call(req).await
            } else {
                h.ready().await?.call(req).await
            }
        }
    }));
    for _ in 0..3 {
        let _ = client.clone().oneshot(get("https://sick.example/a")).await;
    }
    assert_eq!(sick.calls(), 2, "the third was refused");
    for _ in 0..3 {
        client
            .clone()
            .oneshot(get("https://healthy.example/a"))
            .await
            .unwrap();
    }
    assert_eq!(healthy.calls(), 3);
    let open = client
        .clone()
        .oneshot(get("https://SICK.example/b"))
        .await
        .unwrap_err();
    assert_eq!(open.open().unwrap().circuit(), "https://sick.example");
    assert_eq!(
        circuits.find("https://sick.example").unwrap().state(),
        CircuitState::Open
    );
    assert_eq!(
        circuits.find("https://healthy.example").unwrap().state(),
        CircuitState::Closed
    );
    assert!(
        circuits.find("http://sick.example").is_none(),
        "scheme is part of it"
    );
}

#[tokio::test(start_paused = true)]
async fn credentials_in_the_uri_never_reach_a_circuits_name() {
    let dep = Dependency::default();
    let layer = CircuitBreakerLayer::http().classify(RetryOnError);
    let circuits = layer.circuits();
    layer
        .layer(dep.service())
        .oneshot(get("https://user:secret@api.example:8443/v1"))
        .await
        .unwrap();
    let names: Vec<_> = circuits.all().iter().map(|c| c.key().to_owned()).collect();
    assert!(
        names.contains(&"https://api.example:8443".to_owned()),
        "{names:?}"
    );
    assert!(names.iter().all(|n| !n.contains("secret")), "{names:?}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_of_hostile_keys_stays_within_the_bound_and_never_resets_an_open_circuit() {
    let dep = Dependency::default();
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .max_circuits(16)
        .key_by(|req: &String| Some(req.clone()));
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    // A sick tenant's circuit opens.
    dep.set(Health::Down);
    svc.clone().oneshot("sick".to_owned()).await.unwrap_err();
    assert!(svc
        .clone()
        .oneshot("sick".to_owned())
        .await
        .unwrap_err()
        .is_circuit_open());
    // 10 000 distinct keys, each used once.
    dep.set(Health::Up);
    for i in 0..10_000 {
        svc.clone().oneshot(format!("hostile-{i}")).await.unwrap();
        if i % 1000 == 0 {
            assert!(
                circuits.all().len() <= 16 + 2,
                "default + 16 keyed + overflow"
            );
        }
    }
    assert!(circuits.all().len() <= 18);
    // The sick one was never evicted: it is still open and still refuses.
    assert_eq!(circuits.find("sick").unwrap().state(), CircuitState::Open);
    let refused = svc.clone().oneshot("sick".to_owned()).await.unwrap_err();
    assert!(refused.is_circuit_open());
    assert_eq!(dep.calls(), 1 + 10_000);
}

#[tokio::test(start_paused = true)]
async fn when_every_circuit_is_failing_new_keys_share_the_overflow_circuit() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .max_circuits(4)
        .break_duration(
            tower_once_core::backoff::Backoff::new(
                Duration::from_secs(60),
                1.0,
                Duration::from_secs(60),
            )
            .unwrap(),
        )
        .key_by(|req: &String| Some(req.clone()));
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    for key in ["a", "b", "c", "d"] {
        svc.clone().oneshot(key.to_owned()).await.unwrap_err();
    }
    // Four open circuits: none can go. The fifth key shares the overflow circuit, which
    // opens on its failure; the sixth key, through the same overflow, is refused.
    svc.clone().oneshot("e".to_owned()).await.unwrap_err();
    let refused = svc.clone().oneshot("f".to_owned()).await.unwrap_err();
    assert_eq!(refused.open().unwrap().circuit(), "(overflow)");
    assert_eq!(circuits.all().len(), 6);
    for key in ["a", "b", "c", "d"] {
        assert_eq!(circuits.find(key).unwrap().state(), CircuitState::Open);
    }
    assert_eq!(dep.calls(), 5);
}

#[tokio::test(start_paused = true)]
async fn requests_without_a_key_share_the_default_circuit() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .key_by(|req: &u32| (*req > 100).then(|| req.to_string()));
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    svc.clone().oneshot(1).await.unwrap_err();
    svc.clone().oneshot(2).await.unwrap_err();
    assert!(svc.clone().oneshot(3).await.unwrap_err().is_circuit_open());
    assert_eq!(circuits.circuit("").state(), CircuitState::Open);
    assert!(!svc
        .clone()
        .oneshot(101)
        .await
        .unwrap_err()
        .is_circuit_open());
}

/// "A stream of hostile keys cannot ... reset a sick endpoint's breaker": a sick endpoint's
/// circuit has two (slow, failing) calls under way and no failure counted yet, so it is
/// "idle"; one new key evicts it. The two failures land in the evicted circuit; the next
/// call to the sick endpoint gets a fresh, closed circuit and is sent.
#[tokio::test(start_paused = true)]
async fn a_circuit_with_failing_calls_under_way_is_not_reset_by_a_new_key() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    dep.delay(Duration::from_secs(1));
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(2)
        .max_circuits(1)
        .key_by(|req: &String| Some(req.clone()));
    let circuits = layer.circuits();
    let mut svc = layer.layer(dep.service());
    let a1 = svc.ready().await.unwrap().call("sick".to_owned());
    let a2 = svc.ready().await.unwrap().call("sick".to_owned());
    let hostile = svc.ready().await.unwrap().call("hostile-1".to_owned());
    let (a1, a2, _) = tokio::join!(a1, a2, hostile);
    assert!(!a1.unwrap_err().is_circuit_open() && !a2.unwrap_err().is_circuit_open());
    assert_eq!(dep.calls(), 3);
    // Two failures in a row on "sick": its circuit must be open.
    let third = svc.ready().await.unwrap().call("sick".to_owned()).await;
    assert_eq!(
        dep.calls(),
        3,
        "sent through a fresh circuit: {third:?}; sick is {:?}",
        circuits.find("sick").map(|c| c.state())
    );
}

/// A key spelled "(overflow)" is a keyed circuit of its own, but `find` answers with the
/// shared overflow circuit: the operator reads (and steers) the wrong circuit.
#[tokio::test(start_paused = true)]
async fn a_key_named_like_the_overflow_circuit_is_found_as_itself() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(1)
        .key_by(|req: &String| Some(req.clone()));
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    svc.clone()
        .oneshot("(overflow)".to_owned())
        .await
        .unwrap_err();
    assert!(svc
        .clone()
        .oneshot("(overflow)".to_owned())
        .await
        .unwrap_err()
        .is_circuit_open());
    let names: Vec<_> = circuits.all().iter().map(|c| c.key().to_owned()).collect();
    assert_eq!(
        circuits.find("(overflow)").unwrap().state(),
        CircuitState::Open,
        "circuits: {names:?}"
    );
}

/// Steering by hand at the bound: isolating one host's circuit when every keyed circuit is
/// busy hands back the overflow circuit, and isolates every other new host with it.
#[tokio::test(start_paused = true)]
async fn isolating_one_host_at_the_bound_does_not_isolate_other_hosts() {
    let dep = Dependency::default();
    dep.set(Health::Down);
    let layer = CircuitBreakerLayer::new()
        .consecutive_failures(5)
        .max_circuits(1)
        .key_by(|req: &String| Some(req.clone()));
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    // One keyed circuit, with a failure counted: not idle.
    svc.clone().oneshot("a".to_owned()).await.unwrap_err();
    let maintenance = circuits.circuit("b");
    maintenance.isolate();
    dep.set(Health::Up);
    let other = svc.clone().oneshot("c".to_owned()).await;
    assert!(
        other.is_ok(),
        "host c refused because host b was isolated (handle key {:?}): {other:?}",
        maintenance.key()
    );
}

/// Hostile keys: a 60 KiB authority, an empty key, a key of only unicode, and a URI
/// with '@' in the password; no panic, credentials never in a name.
#[tokio::test(start_paused = true)]
async fn hostile_keys_neither_panic_nor_leak_credentials() {
    let dep = Dependency::default();
    let layer = CircuitBreakerLayer::http().classify(RetryOnError);
    let circuits = layer.circuits();
    let svc = layer.layer(dep.service());
    let host = "a".repeat(60_000);
    for uri in [
        format!("https://{host}/"),
        "https://us%40er:p%3Ass@api.example:8443/v1".to_owned(),
        "/relative/only".to_owned(),
        "https://[::1]:65535/".to_owned(),
    ] {
        svc.clone().oneshot(get(&uri)).await.unwrap();
    }
    let names: Vec<_> = circuits.all().iter().map(|c| c.key().to_owned()).collect();
    assert!(names
        .iter()
        .all(|n| !n.contains("p%3Ass") && !n.contains("us%40er")));
    assert!(names.contains(&"https://api.example:8443".to_owned()));
    assert!(
        names.contains(&"https://[::1]:65535".to_owned()),
        "{names:?}"
    );
    let keyed = CircuitBreakerLayer::new().key_by(|req: &String| Some(req.clone()));
    let svc = keyed.layer(dep.service());
    for key in ["", "ключ", "\u{0}", "(overflow)x"] {
        svc.clone().oneshot(key.to_owned()).await.unwrap();
    }
}
