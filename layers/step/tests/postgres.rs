//! A tool whose effect is in Postgres commits the step's result in the same transaction (crate
//! docs of `tower_once_step::postgres`): one commit for the effect and the result; an error
//! before the commit leaves neither and the step runs again at once; a tool frozen past its
//! lease is ended by Postgres and never commits after another owner took the step over; an
//! unkeyed step that could not be made safe on a transactional store is refused. And tools that
//! use the transaction wrongly or unusually: committing twice, with another step's claim, not at
//! all, before failing; at SERIALIZABLE; with a savepoint; with an effect outside Postgres.
#![cfg(feature = "postgres")]

mod support;

use serde::{Deserialize, Serialize};

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use support::postgres::{Db, Refunded};
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_once_idempotency::store::postgres::sqlx;
use tower_once_step::postgres::StepClaim;
use tower_once_step::{OnUnknown, Step, StepId, StepLayer};

/// What the tool does after writing its refund on the step's transaction.
#[derive(Debug, Clone, Copy)]
enum Then {
    Commit,
    Fail,
    /// Sleeps this long holding the transaction idle, then commits.
    Freeze(Duration),
}

/// A refund tool: its effect and the step's result in the step's transaction.
fn tool(
    schema: String,
    plans: Arc<std::sync::Mutex<Vec<Then>>>,
    runs: Arc<AtomicUsize>,
) -> impl Service<http::Request<String>, Response = Refunded, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    tower::service_fn(move |req: http::Request<String>| {
        let (schema, plans, runs) = (schema.clone(), Arc::clone(&plans), Arc::clone(&runs));
        async move {
            runs.fetch_add(1, SeqCst);
            let then = plans.lock().unwrap().pop().unwrap_or(Then::Commit);
            let claim = req
                .extensions()
                .get::<StepClaim<Refunded>>()
                .cloned()
                .ok_or("no claim")?;
            let mut tx = claim.transaction().await?;
            let (id,): (i64,) = sqlx::query_as(&format!(
                "INSERT INTO {schema}.refunds (amount) VALUES (40) RETURNING id"
            ))
            .fetch_one(&mut *tx)
            .await?;
            let refunded = Refunded { id };
            match then {
                Then::Commit => {}
                Then::Fail => return Err("the payment provider said no".into()),
                Then::Freeze(pause) => tokio::time::sleep(pause).await,
            }
            let refunded = claim.commit(tx, refunded).await?;
            Ok(refunded)
        }
    })
}

fn refund_step(run: &str) -> Step<http::Request<String>> {
    support::postgres::refund(run).on_unknown(OnUnknown::RunAgain)
}

#[tokio::test]
async fn the_effect_and_the_result_commit_together_and_the_step_replays() {
    let db = Db::transactional().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(Vec::new()));
    let steps = StepLayer::new(db.store.clone()).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let first = steps.clone().oneshot(refund_step("run-1")).await.unwrap();
    assert!(first.is_recorded() && !first.is_replayed());
    let again = steps.oneshot(refund_step("run-1")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), first.value(), "the committed result replays");
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 1));
}

#[tokio::test]
async fn a_tool_that_fails_before_its_commit_leaves_nothing_and_the_step_runs_again_at_once() {
    let db = Db::transactional().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(vec![Then::Fail]));
    let steps = StepLayer::new(db.store.clone())
        .lease(Duration::from_secs(30))
        .layer(tool(db.schema.name.clone(), plans, Arc::clone(&runs)));
    let failed = steps
        .clone()
        .oneshot(refund_step("run-2"))
        .await
        .unwrap_err();
    assert!(failed.is_inner(), "{failed}");
    assert_eq!(
        db.refunds().await,
        0,
        "the refund rolled back with the step"
    );
    // No lease to wait out (30 s): the retry runs now and refunds once.
    let retried = tokio::time::timeout(Duration::from_secs(5), steps.oneshot(refund_step("run-2")))
        .await
        .expect("the step is free at once")
        .unwrap();
    assert!(retried.is_recorded());
    assert_eq!((runs.load(SeqCst), db.refunds().await), (2, 1));
}

#[tokio::test]
async fn a_tool_frozen_past_its_lease_never_commits_after_another_owner_took_over() {
    let db = Db::transactional().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let lease = Duration::from_millis(600);
    // The first run holds its transaction idle for five leases: Postgres ends its session.
    let plans = Arc::new(std::sync::Mutex::new(vec![Then::Freeze(lease * 5)]));
    let steps = StepLayer::new(db.store.clone()).lease(lease).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let frozen = tokio::spawn(steps.clone().oneshot(refund_step("run-3")));
    while runs.load(SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A second owner (another replica, after the first froze): it waits for the step and
    // takes it over once the frozen owner's transaction is gone.
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        steps.clone().oneshot(refund_step("run-3")),
    )
    .await
    .expect("the second owner settles within the bound")
    .unwrap();
    assert!(second.is_recorded() || second.is_replayed());
    let first = frozen.await.unwrap();
    assert!(
        first.as_ref().map_or(true, |out| !out.is_recorded()),
        "the frozen owner cannot commit: {first:?}"
    );
    assert_eq!(db.refunds().await, 1, "one refund, whoever made it");
    let again = steps.oneshot(refund_step("run-3")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(again.value(), second.value());
}

#[tokio::test]
async fn an_unkeyed_post_that_may_not_be_sent_twice_is_refused_on_a_transactional_store() {
    let db = Db::transactional().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let plans = Arc::new(std::sync::Mutex::new(Vec::new()));
    let steps = StepLayer::new(db.store.clone()).layer(tool(
        db.schema.name.clone(),
        plans,
        Arc::clone(&runs),
    ));
    let request = http::Request::post("/notes").body(String::new()).unwrap();
    let step = Step::new(StepId::new("run-4", 3, "note"), request);
    let refused = steps.oneshot(step).await.unwrap_err();
    assert!(refused.is_misused(), "{refused}");
    assert_eq!(runs.load(SeqCst), 0, "nothing sent");
}

// ---- Tools that use the step's transaction in other ways. ----

/// The step's claim, from the tool's request.
fn claim_of<T: 'static>(req: &http::Request<String>) -> Result<StepClaim<T>, BoxError> {
    Ok(req
        .extensions()
        .get::<StepClaim<T>>()
        .cloned()
        .ok_or("no claim")?)
}

/// The refund, written on `conn` (the step's transaction, or a savepoint in it).
async fn insert_refund(
    schema: &str,
    conn: &mut sqlx::PgConnection,
    amount: i64,
) -> Result<Refunded, BoxError> {
    let (id,): (i64,) = sqlx::query_as(&format!(
        "INSERT INTO {schema}.refunds (amount) VALUES ($1) RETURNING id"
    ))
    .bind(amount)
    .fetch_one(conn)
    .await?;
    Ok(Refunded { id })
}

#[tokio::test]
async fn a_tool_that_commits_then_tries_to_commit_again_records_once() {
    let db = Db::transactional().await;
    let (schema, runs, refused) = (
        db.schema.name.clone(),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (counted, misused) = (Arc::clone(&runs), Arc::clone(&refused));
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs, misused) =
                (schema.clone(), Arc::clone(&counted), Arc::clone(&misused));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let first = insert_refund(&schema, &mut tx, 40).await?;
                let first = claim.commit(tx, first).await?;
                // A second effect, a second commit: the claim's transaction is gone.
                match claim.transaction().await {
                    Err(e) if e.is_misused() => misused.fetch_add(1, SeqCst),
                    other => panic!("a second transaction: {other:?}"),
                };
                Ok::<_, BoxError>(first)
            }
        },
    ));
    let first = steps.clone().oneshot(refund_step("run-5")).await.unwrap();
    assert!(first.is_recorded());
    let again = steps.oneshot(refund_step("run-5")).await.unwrap();
    assert!(again.is_replayed() && again.value() == first.value());
    assert_eq!(
        (runs.load(SeqCst), refused.load(SeqCst), db.refunds().await),
        (1, 1, 1)
    );
}

#[tokio::test]
async fn a_tool_that_commits_with_another_steps_claim_commits_nothing() {
    // `Claim::commit`: "[`ClaimError::is_misused`] when `tx` is another claim's". A tool that
    // kept the claim of an earlier step (run-a) commits run-b's transaction with it.
    let db = Db::transactional().await;
    let schema = db.schema.name.clone();
    let kept: Arc<std::sync::Mutex<Option<StepClaim<Refunded>>>> = Default::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let (stash, counted) = (Arc::clone(&kept), Arc::clone(&runs));
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, stash, runs) = (schema.clone(), Arc::clone(&stash), Arc::clone(&counted));
            async move {
                let n = runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let refunded = insert_refund(&schema, &mut tx, 40).await?;
                let earlier = stash.lock().unwrap().replace(claim.clone());
                let with = match (n, earlier) {
                    (1, Some(earlier)) => earlier, // run-b's first attempt
                    _ => claim,
                };
                let refunded = with.commit(tx, refunded).await?;
                Ok::<_, BoxError>(refunded)
            }
        },
    ));
    assert!(steps
        .clone()
        .oneshot(refund_step("run-a"))
        .await
        .unwrap()
        .is_recorded());
    let err = steps
        .clone()
        .oneshot(refund_step("run-b"))
        .await
        .unwrap_err();
    assert!(err.is_inner(), "{err}");
    let cause = err
        .inner_error()
        .unwrap()
        .downcast_ref::<tower_once_idempotency::ClaimError>();
    assert!(cause.is_some_and(|c| c.is_misused()), "{err}");
    assert_eq!(db.refunds().await, 1, "run-b's refund rolled back");
    let retried = tokio::time::timeout(
        Duration::from_secs(5),
        steps.clone().oneshot(refund_step("run-b")),
    )
    .await
    .expect("free at once")
    .unwrap();
    assert!(retried.is_recorded());
    for run in ["run-a", "run-b"] {
        assert!(steps
            .clone()
            .oneshot(refund_step(run))
            .await
            .unwrap()
            .is_replayed());
    }
    assert_eq!((runs.load(SeqCst), db.refunds().await), (3, 2));
}

#[tokio::test]
async fn a_tool_that_returns_ok_without_committing_leaves_nothing_and_runs_again_at_once() {
    let db = Db::transactional().await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone())
        .lease(Duration::from_secs(30))
        .layer(tower::service_fn(move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                let n = runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let refunded = insert_refund(&schema, &mut tx, 40).await?;
                let refunded = if n == 0 {
                    drop(tx); // forgot to commit
                    refunded
                } else {
                    claim.commit(tx, refunded).await?
                };
                Ok::<_, BoxError>(refunded)
            }
        }));
    let first = steps.clone().oneshot(refund_step("run-6")).await.unwrap();
    assert!(
        !first.is_recorded(),
        "its transaction rolled back: {first:?}"
    );
    assert_eq!(db.refunds().await, 0);
    let second = tokio::time::timeout(
        Duration::from_secs(5),
        steps.clone().oneshot(refund_step("run-6")),
    )
    .await
    .expect("free at once")
    .unwrap();
    assert!(second.is_recorded() && !second.is_replayed());
    assert!(steps
        .oneshot(refund_step("run-6"))
        .await
        .unwrap()
        .is_replayed());
    assert_eq!((runs.load(SeqCst), db.refunds().await), (2, 1));
}

#[tokio::test]
async fn a_tool_that_fails_after_its_commit_is_replayed_and_never_run_again() {
    // The refund and the result committed; then the tool fails (its answer to the agent could
    // not be built, say). The step returns the tool's error, and the committed step replays:
    // the refund is never made twice.
    let db = Db::transactional().await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let refunded = insert_refund(&schema, &mut tx, 40).await?;
                claim.commit(tx, refunded).await?;
                Err::<Refunded, BoxError>("committed, then the answer failed".into())
            }
        },
    ));
    let err = steps
        .clone()
        .oneshot(refund_step("run-7"))
        .await
        .unwrap_err();
    assert!(err.is_inner(), "{err}");
    let again = steps.oneshot(refund_step("run-7")).await.unwrap();
    assert!(again.is_replayed(), "{again:?}");
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 1));
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Answer {
    status: u16,
    id: i64,
}

#[tokio::test]
async fn a_tool_cannot_commit_an_answer_the_classifier_refuses_or_the_limit_would_not_keep() {
    // `StepClaim::commit`: "Refused, with nothing committed (the effect rolls back), when the
    // layer's classifier does not call `Ok(value)` a success, its codec cannot keep it, or it
    // is over the layer's `result_limit`". DESIGN: an upstream 5xx is never a tool's result.
    // (A committed 503 was once reported "not recorded", then replayed as the result.)
    let db = Db::transactional().await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone())
        .classify(|outcome: &Result<Answer, BoxError>| match outcome {
            Ok(a) if a.status < 300 => tower_once_core::classify::Action::Success,
            Ok(a) if a.status >= 500 => tower_once_core::classify::Action::Retry { after: None },
            _ => tower_once_core::classify::Action::Stop,
        })
        .layer(tower::service_fn(move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let Refunded { id } = insert_refund(&schema, &mut tx, 40).await?;
                let answer = Answer { status: 503, id };
                let answer = claim.commit(tx, answer).await?;
                Ok::<_, BoxError>(answer)
            }
        }));
    let first = steps
        .clone()
        .oneshot(refund_step("run-8"))
        .await
        .unwrap_err();
    assert!(first.is_inner(), "{first:?}");
    let second = steps.oneshot(refund_step("run-8")).await.unwrap_err();
    assert!(second.is_inner(), "not done: called again, {second:?}");
    assert_eq!(
        (runs.load(SeqCst), db.refunds().await),
        (2, 0),
        "nothing committed"
    );

    // A result over the layer's limit: refused the same way.
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone())
        .result_limit(4)
        .layer(tower::service_fn(move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let refunded = insert_refund(&schema, &mut tx, 40).await?;
                claim.commit(tx, refunded).await
            }
        }));
    let over = steps.oneshot(refund_step("run-9")).await.unwrap_err();
    assert!(over.is_inner(), "{over:?}");
    assert_eq!((runs.load(SeqCst), db.refunds().await), (1, 0));
}

#[tokio::test]
async fn at_serializable_a_conflict_rolls_back_and_each_step_commits_once() {
    // `Claim::commit`: fails, nothing committed, with `is_store` on "a serialization failure at
    // SERIALIZABLE included: the retry runs the handler again". Every transaction SERIALIZABLE
    // (the pool's setting: the claim's `BEGIN` comes before the tool could say so). Two refunds
    // of two runs each read the refunds table, then write: one of them must fail.
    let options = sqlx::postgres::PgPoolOptions::new().after_connect(|conn, _| {
        Box::pin(async move {
            sqlx::Executor::execute(conn, "SET default_transaction_isolation TO 'serializable'")
                .await
                .map(drop)
        })
    });
    let db = Db::transactional_with(options).await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let both_read = Arc::new(tokio::sync::Barrier::new(2));
    let (counted, barrier) = (Arc::clone(&runs), Arc::clone(&both_read));
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs, barrier) =
                (schema.clone(), Arc::clone(&counted), Arc::clone(&barrier));
            async move {
                let n = runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                let total: i64 =
                    sqlx::query_scalar(&format!("SELECT count(*) FROM {schema}.refunds"))
                        .fetch_one(&mut *tx)
                        .await?;
                if n < 2 {
                    barrier.wait().await; // both first attempts have read
                }
                let refunded = insert_refund(&schema, &mut tx, 40 + total).await?;
                let refunded = claim.commit(tx, refunded).await?;
                Ok::<_, BoxError>(refunded)
            }
        },
    ));
    let (a, b) = tokio::join!(
        steps.clone().oneshot(refund_step("run-a")),
        steps.clone().oneshot(refund_step("run-b")),
    );
    let failed: Vec<_> = [&a, &b]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(failed.len(), 1, "one of them conflicts: {a:?} {b:?}");
    assert!(failed[0].is_inner(), "{}", failed[0]);
    assert_eq!(db.refunds().await, 1, "the conflicting refund rolled back");
    for run in ["run-a", "run-b"] {
        let out = steps.clone().oneshot(refund_step(run)).await.unwrap();
        assert!(out.is_recorded(), "{run}: {out:?}");
    }
    assert_eq!((runs.load(SeqCst), db.refunds().await), (3, 2));
}

#[tokio::test]
async fn an_effect_rolled_back_to_a_savepoint_stays_rolled_back_and_the_rest_commits() {
    // `ClaimTransaction`: "Savepoints work as on any connection". The tool tries a refund in a
    // savepoint, rolls it back, makes another, and commits: one refund, and the step replays.
    let db = Db::transactional().await;
    let (schema, runs) = (db.schema.name.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&runs);
    let steps = StepLayer::new(db.store.clone()).layer(tower::service_fn(
        move |req: http::Request<String>| {
            let (schema, runs) = (schema.clone(), Arc::clone(&counted));
            async move {
                runs.fetch_add(1, SeqCst);
                let claim = claim_of(&req)?;
                let mut tx = claim.transaction().await?;
                {
                    let mut savepoint = sqlx::Acquire::begin(&mut *tx).await?;
                    insert_refund(&schema, &mut savepoint, 999).await?;
                    savepoint.rollback().await?;
                }
                let refunded = insert_refund(&schema, &mut tx, 40).await?;
                let refunded = claim.commit(tx, refunded).await?;
                Ok::<_, BoxError>(refunded)
            }
        },
    ));
    let first = steps.clone().oneshot(refund_step("run-10")).await.unwrap();
    assert!(first.is_recorded());
    let again = steps.oneshot(refund_step("run-10")).await.unwrap();
    assert!(again.is_replayed() && again.value() == first.value());
    let amounts: Vec<i64> =
        sqlx::query_scalar(&format!("SELECT amount FROM {}.refunds", db.schema.name))
            .fetch_all(db.store.pool())
            .await
            .unwrap();
    assert_eq!((runs.load(SeqCst), amounts), (1, vec![40]));
}

type Sent = Arc<std::sync::Mutex<Vec<Option<String>>>>;

/// A tool that calls the payments API (the HTTP effect, kept in `sent` with its key), then
/// writes its refund on the step's transaction; its first attempt fails before the commit.
fn calls_out_then_commits(
    schema: String,
    sent: Sent,
    runs: Arc<AtomicUsize>,
) -> impl Service<http::Request<String>, Response = Refunded, Error = BoxError, Future = impl Send>
       + Clone
       + Send {
    tower::service_fn(move |req: http::Request<String>| {
        let (schema, sent, runs) = (schema.clone(), Arc::clone(&sent), Arc::clone(&runs));
        async move {
            let n = runs.fetch_add(1, SeqCst);
            let key = req.headers().get("idempotency-key");
            sent.lock()
                .unwrap()
                .push(key.map(|k| k.to_str().unwrap().to_owned()));
            let claim = claim_of(&req)?;
            let mut tx = claim.transaction().await?;
            let refunded = insert_refund(&schema, &mut tx, 40).await?;
            if n == 0 {
                return Err("the ledger write failed after the payments call".into());
            }
            let refunded = claim.commit(tx, refunded).await?;
            Ok(refunded)
        }
    })
}

#[tokio::test]
async fn a_keyed_transactional_tool_that_calls_out_sends_again_with_its_key() {
    let db = Db::transactional().await;
    let (sent, runs): (Sent, _) = (Default::default(), Arc::new(AtomicUsize::new(0)));
    let steps = StepLayer::new(db.store.clone()).layer(calls_out_then_commits(
        db.schema.name.clone(),
        Arc::clone(&sent),
        Arc::clone(&runs),
    ));
    let step = || {
        let request = http::Request::post("/refunds")
            .body("40".to_owned())
            .unwrap();
        Step::new(StepId::new("run-11", 2, "refund"), request).keyed()
    };
    assert!(steps.clone().oneshot(step()).await.unwrap_err().is_inner());
    assert!(steps.clone().oneshot(step()).await.unwrap().is_recorded());
    assert!(steps.oneshot(step()).await.unwrap().is_replayed());
    let key = Some(step().idempotency_key());
    assert_eq!(*sent.lock().unwrap(), vec![key.clone(), key]);
    assert_eq!((runs.load(SeqCst), db.refunds().await), (2, 1));
}
