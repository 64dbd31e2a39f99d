//! Steps kept in a plain (not transactional) `PostgresStore`: a store "that writes its claims"
//! (`tower_once_step::postgres`: keep unkeyed steps there), whose result is a write after the
//! call (crate docs, Known limits). The step still hands its tool a `Claim` in the request's
//! extensions (the store completes in transaction), undocumented for steps: what a tool that
//! uses it gets. And a step dropped while its write waits for a pooled connection (the store
//! contract: a layer finishes the operations it drops). Real time (Postgres's clock and pool);
//! effects counted as tool runs and rows.
#![cfg(feature = "postgres")]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::postgres::{Db, Refunded};
use tower::{BoxError, Layer, ServiceExt};
use tower_once_idempotency::store::postgres::sqlx;
use tower_once_step::{Step, StepId, StepLayer};

fn refund_step(run: &str) -> Step<http::Request<String>> {
    support::postgres::refund(run).keyed()
}

#[tokio::test]
async fn on_a_plain_store_the_tool_gets_no_claim_and_the_step_records_its_result() {
    // `tower_once_step::postgres`: "On a plain `PostgresStore` the tool gets no claim: the step
    // records its result after the call, as on any store" (a claim there let a tool write a
    // record of the HTTP layer's kind, which every replay then failed to read).
    let db = Db::plain(8).await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                assert!(req
                    .extensions()
                    .get::<tower_once_step::postgres::StepClaim<Refunded>>()
                    .is_none());
                let pool =
                    sqlx::PgPool::connect(&tower_once_test_support::postgres::database_url())
                        .await?;
                let (id,): (i64,) = sqlx::query_as(&format!(
                    "INSERT INTO {schema}.refunds (amount) VALUES (40) RETURNING id"
                ))
                .fetch_one(&pool)
                .await?;
                Ok::<_, BoxError>(Refunded { id })
            }
        },
    ));
    let first = steps.clone().oneshot(refund_step("run-1")).await.unwrap();
    assert!(first.is_recorded(), "{first:?}");
    let again = steps.oneshot(refund_step("run-1")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value());
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 1));
}

#[tokio::test]
async fn a_step_dropped_while_its_result_waits_for_a_connection_is_still_recorded() {
    // The store contract: "If the layer's future is dropped mid-operation, it spawns the
    // pending future ... so the operation is not lost"; crate docs: "the step's future dropped
    // (a caller's timeout) | released, on a task of its own". The pool is busy (one connection,
    // held elsewhere) when the tool answers; the step's write waits for it, and the caller's
    // timeout drops the step. The write is dropped with it: the record stays in progress for
    // the lease, and the next attempt waits it out and sends the refund again.
    let db = Db::plain(1).await;
    let lease = Duration::from_secs(3);
    let runs = Arc::new(AtomicUsize::new(0));
    let (called_tx, called) = tokio::sync::mpsc::unbounded_channel::<()>();
    let go = Arc::new(tokio::sync::Notify::new());
    let (counted, answer) = (Arc::clone(&runs), Arc::clone(&go));
    let steps = StepLayer::new(db.store.clone())
        .lease(lease)
        .layer(tower::service_fn(move |_req: http::Request<String>| {
            let (runs, answer, called) =
                (Arc::clone(&counted), Arc::clone(&answer), called_tx.clone());
            async move {
                let n = runs.fetch_add(1, SeqCst);
                if n == 0 {
                    let _ = called.send(());
                    answer.notified().await;
                }
                Ok::<_, BoxError>(Refunded { id: n as i64 })
            }
        }));
    let mut called = called;
    let first = tokio::spawn(steps.clone().oneshot(refund_step("run-2")));
    called.recv().await.unwrap();
    // The pool's one connection, busy elsewhere (the claim gave it back before the call).
    let busy = db.store.pool().acquire().await.unwrap();
    go.notify_one();
    tokio::time::sleep(Duration::from_millis(200)).await; // the write waits for `busy`
    first.abort(); // the caller's timeout
    assert!(first.await.unwrap_err().is_cancelled());
    drop(busy);
    tokio::time::sleep(Duration::from_millis(200)).await;

    let start = tokio::time::Instant::now();
    let again = steps.oneshot(refund_step("run-2")).await.unwrap();
    assert!(
        again.is_replayed(),
        "the tool's answer was lost with the dropped write: {again:?} after {:?}, {} tool runs",
        start.elapsed(),
        runs.load(SeqCst)
    );
    assert_eq!(runs.load(SeqCst), 1);
}

#[tokio::test]
async fn an_unkeyed_step_killed_mid_call_is_settled_unknown_and_never_sent_again() {
    // `tower_once_step::postgres`: an unkeyed step belongs in "a store that writes its claims
    // (the plain PostgresStore, Redis)"; crate docs: "the process killed | ... an unkeyed
    // call's mark stays, so the next owner settles it unknown".
    let db = Db::plain(8).await;
    let lease = Duration::from_millis(600);
    let (calls, hanging) = support::hanging_refunds();
    support::kill_after(
        StepLayer::new(db.store.clone())
            .lease(lease)
            .layer(hanging)
            .oneshot(Step::new(
                StepId::new("run-3", 2, "refund"),
                support::post("40"),
            )),
        Duration::from_millis(200),
    )
    .await;
    assert_eq!(calls.load(SeqCst), 1);
    let (later_calls, later) = support::refunds();
    let steps = StepLayer::new(db.store.clone()).lease(lease).layer(later);
    for _ in 0..2 {
        let err = steps
            .clone()
            .oneshot(Step::new(
                StepId::new("run-3", 2, "refund"),
                support::post("40"),
            ))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
    }
    assert_eq!((calls.load(SeqCst), later_calls.load(SeqCst)), (1, 0));
}
