//! Steps kept in a real Redis (crate docs: "The step's record lives in any IdempotencyStore:
//! memory, Redis, ..."; "What a step does": a done step replays, "nothing sent"; "in progress
//! elsewhere (task, process, replica) | waits"; "the process killed | the claim ends with its
//! lease; an unkeyed call's mark stays, so the next owner settles it unknown"; "store
//! unreachable | nothing sent | StepError::is_store"; "the step's future dropped | released").
//! Two `RedisStore` connections stand for two processes; each test owns its `redis-server`.
//! Real time here (Redis's own clock keeps the leases), so leases are short and every test
//! counts the tool's calls, never durations.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{kill_after, post, refund_id, refunds, slow_refunds, tool, Refund};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::redis::RedisStore;
use tower_once_step::{Step, StepId, StepLayer};
use tower_once_test_support::redis::RedisServer;

/// Long enough for a loaded 2-core machine, short enough to wait out.
const LEASE: Duration = Duration::from_millis(600);

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&server.url()).await.unwrap()
}

#[tokio::test]
async fn a_done_step_replays_in_another_process_and_other_arguments_are_a_mismatch() {
    let server = RedisServer::start();
    let id = refund_id();
    let (a_calls, a_tool) = refunds();
    let first = StepLayer::new(connect(&server).await)
        .layer(a_tool)
        .oneshot(Step::new(id.clone(), post("40")).arguments("40"))
        .await
        .unwrap();
    assert!(first.is_recorded());

    let (b_calls, b_tool) = refunds();
    let b = StepLayer::new(connect(&server).await).layer(b_tool);
    let again = b
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).arguments("40"))
        .await
        .unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value());
    let err = b
        .oneshot(Step::new(id, post("41")).arguments("41"))
        .await
        .unwrap_err();
    assert!(err.is_mismatch(), "{err:?}");
    assert_eq!((a_calls.load(SeqCst), b_calls.load(SeqCst)), (1, 0));
}

#[tokio::test]
async fn concurrent_steps_in_two_processes_send_once() {
    let server = RedisServer::start();
    let id = refund_id();
    let (a_calls, a_tool) = slow_refunds(Duration::from_millis(300));
    let (b_calls, b_tool) = slow_refunds(Duration::from_millis(300));
    let a = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(a_tool);
    let b = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(b_tool);
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let steps = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(steps.oneshot(Step::new(id.clone(), post("40"))))
        })
        .collect();
    let mut replays = 0;
    for task in tasks {
        let out = task.await.unwrap().unwrap();
        if out.is_replayed() {
            replays += 1;
            assert!(out.waited());
        }
    }
    assert_eq!(replays, 5);
    assert_eq!(a_calls.load(SeqCst) + b_calls.load(SeqCst), 1);
}

#[tokio::test]
async fn a_step_longer_than_several_leases_keeps_its_claim() {
    // Renewed every third of the lease: the other process's unkeyed attempt never takes it
    // over (it would settle it unknown if it did).
    let server = RedisServer::start();
    let id = refund_id();
    let (a_calls, a_tool) = slow_refunds(LEASE * 4);
    let (b_calls, b_tool) = refunds();
    let a = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(a_tool);
    let b = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(b_tool);
    let owner = tokio::spawn(a.oneshot(Step::new(id.clone(), post("40"))));
    tokio::time::sleep(LEASE / 3).await;
    let waiter = b.oneshot(Step::new(id, post("40"))).await.unwrap();
    assert!(waiter.is_replayed() && waiter.waited());
    assert!(owner.await.unwrap().unwrap().is_recorded());
    assert_eq!((a_calls.load(SeqCst), b_calls.load(SeqCst)), (1, 0));
}

#[tokio::test]
async fn a_killed_processes_steps_are_taken_over_or_settled_unknown() {
    let server = RedisServer::start();
    let keyed = refund_id();
    let unkeyed = StepId::new("run-1", 3, "refund");
    let (dead_calls, dead_tool) = support::hanging_refunds();
    let dead = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(dead_tool);
    kill_after(
        dead.clone()
            .oneshot(Step::new(keyed.clone(), post("40")).keyed()),
        Duration::from_millis(200),
    )
    .await;
    kill_after(
        dead.oneshot(Step::new(unkeyed.clone(), post("40"))),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(dead_calls.load(SeqCst), 2);

    let (calls, tool_) = refunds();
    let next = StepLayer::new(connect(&server).await)
        .lease(LEASE)
        .layer(tool_);
    let out = next
        .clone()
        .oneshot(Step::new(keyed, post("40")).keyed())
        .await
        .unwrap();
    assert!(
        out.is_recorded(),
        "the keyed step is taken over and sent again"
    );
    for _ in 0..2 {
        let err = next
            .clone()
            .oneshot(Step::new(unkeyed.clone(), post("40")))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
    }
    assert_eq!(calls.load(SeqCst), 1, "only the keyed step went again");
}

#[tokio::test]
async fn with_redis_down_a_step_fails_closed_and_sends_nothing() {
    let mut server = RedisServer::start();
    let store = connect(&server).await;
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(store).layer(refunds);
    let id = refund_id();
    server.stop();
    for step in [
        Step::new(id.clone(), post("40")),
        Step::new(id.clone(), post("40")).keyed(),
    ] {
        let err = steps.clone().oneshot(step).await.unwrap_err();
        assert!(err.is_store(), "{err:?}");
        assert!(tower_once_core::unsent::Unsent::is_unsent(&err));
    }
    assert_eq!(calls.load(SeqCst), 0);

    server.restart();
    // The connection comes back on its own; a few attempts while it reconnects fail closed.
    let mut out = None;
    for _ in 0..50 {
        match steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
        {
            Ok(o) => {
                out = Some(o);
                break;
            }
            Err(err) => {
                assert!(err.is_store(), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(out.expect("Redis came back").is_recorded());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test]
async fn a_step_dropped_while_redis_is_slow_to_claim_it_is_released() {
    // Redis stalls (SIGSTOP) with the step's claim in its socket; the caller's timeout drops
    // the step; Redis wakes and runs the claim. Nothing was sent, and the step must be free
    // for the next attempt, not held for a lease by a claim nobody owns.
    let server = RedisServer::start();
    let id = refund_id();
    let lease = Duration::from_secs(3);
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(connect(&server).await)
        .lease(lease)
        .layer(refunds);
    // Warm the script cache, so the claim is one command.
    steps
        .clone()
        .oneshot(Step::new(StepId::new("warm", 0, "up"), post("0")).keyed())
        .await
        .unwrap();
    calls.store(0, SeqCst);

    server.signal("-STOP");
    let timed_out = tokio::time::timeout(
        Duration::from_millis(200),
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed()),
    )
    .await;
    server.signal("-CONT");
    assert!(timed_out.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await; // the claim runs, the reply is dropped
    assert_eq!(calls.load(SeqCst), 0);

    let out = steps
        .oneshot(Step::new(id, post("40")).keyed())
        .await
        .unwrap();
    assert!(
        !out.waited(),
        "the next attempt waited out the lease of the dropped step's claim"
    );
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test]
async fn a_result_kept_in_redis_round_trips_through_json() {
    let server = RedisServer::start();
    let (calls, big) = tool(|_: http::Request<String>, call| async move {
        Ok::<_, std::io::Error>(vec![
            Refund { status: 201, call };
            // Not small: a body well past one Redis protocol buffer.
            20_000
        ])
    });
    let steps = StepLayer::new(connect(&server).await).layer(big);
    let id = StepId::new("run-1", 2, "refunds");
    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")).keyed())
        .await
        .unwrap();
    assert!(first.is_recorded());
    let again = steps
        .oneshot(Step::new(id, post("40")).keyed())
        .await
        .unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value());
    assert_eq!(calls.load(SeqCst), 1);
}

/// `redis-cli` against `server`: the test's admin, as an operator's would be.
fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli is on PATH with redis-server");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
#[ignore = "known limit (crate docs, Known limits): a Redis whose eviction policy drops keys with a TTL drops the sent mark too; run the steps' Redis with maxmemory-policy noeviction"]
async fn a_done_unkeyed_step_that_redis_evicted_is_settled_unknown_not_sent_again() {
    // Known limits: "a store that drops records to make room (the memory store at its bounds,
    // a Redis with an eviction policy) can drop a done step's result; a keyed step then runs
    // again with its key, an unkeyed one is settled unknown"; Costs: the sent mark is "an
    // in-progress claim that no store drops to make room". A Redis under memory pressure with
    // an eviction policy (allkeys-lru; volatile-lru alike, every step key has a TTL) evicts
    // the mark with the record, and the unkeyed refund is sent again.
    let server = RedisServer::start_with(
        tower_once_test_support::ports::free_port(),
        &["--maxmemory-policy", "allkeys-lru"],
    );
    let (calls, refunds) = refunds();
    let steps = StepLayer::new(connect(&server).await).layer(refunds);
    let id = refund_id();
    let done = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")))
        .await
        .unwrap();
    assert!(done.is_recorded());
    let before: u64 = redis_cli(&server, &["DBSIZE"]).parse().unwrap();
    assert!(before >= 2, "the record and the mark ({before} keys)");

    // Memory runs short: Redis evicts what its policy allows, then the limit is lifted.
    redis_cli(&server, &["CONFIG", "SET", "maxmemory", "1"]);
    redis_cli(&server, &["SET", "pressure", "x"]);
    redis_cli(&server, &["CONFIG", "SET", "maxmemory", "0"]);
    let after = redis_cli(&server, &["DBSIZE"]);

    let again = steps.oneshot(Step::new(id, post("40"))).await;
    assert_eq!(
        calls.load(SeqCst),
        1,
        "the done refund was sent again ({before} keys before the eviction, {after} after): \
         {again:?}"
    );
}
