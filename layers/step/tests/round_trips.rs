//! Round trips per step on the Redis store (crate docs, "Costs"): a replay is one, a fresh
//! keyed step two (claim, record), a fresh unkeyed one three (claim, mark, record).
//! Counted with `INFO commandstats` on a `redis-server` of the test's own: every round trip
//! the store makes is one `EVALSHA`.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tower::{Layer, Service, ServiceExt};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_step::{OnUnknown, Step, StepId, StepLayer, StepRequest};
use tower_once_test_support::redis::RedisServer;

struct Call;

impl StepRequest for Call {}

fn evalshas(redis: &RedisServer) -> u64 {
    redis
        .command_calls()
        .into_iter()
        .filter(|(cmd, _)| cmd == "evalsha" || cmd == "eval")
        .map(|(_, calls)| calls)
        .sum()
}

#[tokio::test]
async fn a_replay_is_one_round_trip_a_keyed_step_two_an_unkeyed_one_three() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let tool = tower::service_fn(move |Call| {
        counted.fetch_add(1, SeqCst);
        async { Ok::<_, std::io::Error>(String::from("done")) }
    });
    let mut steps = StepLayer::new(store).layer(tool);
    let step = |run: &str, policy| {
        Step::new(StepId::new(run, 1, "tool"), Call)
            .arguments("a")
            .on_unknown(policy)
    };
    // Warm up: the first use of each script loads it.
    for policy in [OnUnknown::RunAgain, OnUnknown::Refuse] {
        let warm = step(&format!("warm-{policy:?}"), policy);
        steps.ready().await.unwrap().call(warm).await.unwrap();
    }

    let count = |redis: &RedisServer| {
        let n = evalshas(redis);
        redis.cli(&["CONFIG", "RESETSTAT"]);
        n
    };
    count(&redis);
    let fresh = steps
        .ready()
        .await
        .unwrap()
        .call(step("keyed", OnUnknown::RunAgain));
    assert!(!fresh.await.unwrap().is_replayed());
    assert_eq!(count(&redis), 2, "a fresh keyed step: claim, record");

    let again = steps
        .ready()
        .await
        .unwrap()
        .call(step("keyed", OnUnknown::RunAgain));
    assert!(again.await.unwrap().is_replayed());
    assert_eq!(
        count(&redis),
        1,
        "a replay: one claim that finds the record"
    );

    let unkeyed = steps
        .ready()
        .await
        .unwrap()
        .call(step("unkeyed", OnUnknown::Refuse));
    assert!(!unkeyed.await.unwrap().is_replayed());
    assert_eq!(
        count(&redis),
        3,
        "a fresh unkeyed step: claim, mark, record"
    );
    assert_eq!(calls.load(SeqCst), 4, "two warm-ups, two fresh steps");
}
