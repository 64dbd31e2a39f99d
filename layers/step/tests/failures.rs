//! What a failed or unsuccessful call leaves behind (crate docs, "And once the call returns":
//! "an answer that is not a success (an upstream 409, 429, 4xx, 5xx) | none: released; the
//! step is not done | the answer, is_recorded false"; "an error that says it was never sent
//! (a refused connection) | none: released | is_inner"; "any other error (a timeout, a reset),
//! policy RunAgain | none: released; the next attempt sends again, with the same key |
//! is_inner"; `StepError::is_inner`: "nothing was recorded, and a later attempt calls again").
//! And a tool that panics: its claim must not outlive the panic, and a call that may have gone
//! out and may not be sent twice is never sent again.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;
use support::{post, refund_id, settle, tool, Refund};
use tower::{Layer, Service, ServiceExt};
use tower_once_core::classify::Action;
use tower_once_core::unsent::Unsent;
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer};

type Outcome = Result<Refund, std::io::Error>;

/// `Ok` below 300 is a success; any other answer is the downstream's refusal, never stored.
fn by_status(outcome: &Outcome) -> Action {
    match outcome {
        Ok(r) if r.status < 300 => Action::Success,
        Ok(r) if r.status >= 500 => Action::Retry { after: None },
        _ => Action::Stop,
    }
}

/// A tool answering `statuses[n]` on its `n`th call (the last one after that).
fn answering(
    statuses: &'static [u16],
) -> (
    Arc<std::sync::atomic::AtomicUsize>,
    impl support::RefundTool<http::Request<String>>,
) {
    tool(move |_: http::Request<String>, call| async move {
        let status = statuses[call.min(statuses.len() - 1)];
        Ok(Refund { status, call })
    })
}

/// A tool failing with `kind` on its first call, answering `201` after.
fn failing_once(
    kind: std::io::ErrorKind,
) -> (
    support::Calls,
    support::Keys,
    impl support::RefundTool<http::Request<String>>,
) {
    support::keeping_keys(move |call| async move {
        if call == 0 {
            return Err(std::io::Error::from(kind));
        }
        Ok(Refund { status: 201, call })
    })
}

#[tokio::test(start_paused = true)]
async fn an_answer_that_is_not_a_success_is_returned_not_recorded_and_called_again() {
    for statuses in [&[409, 201][..], &[429, 201], &[422, 201], &[503, 201]] {
        let statuses: &'static [u16] = Box::leak(statuses.to_vec().into_boxed_slice());
        let (calls, refunds) = answering(statuses);
        let steps = StepLayer::new(MemoryStore::new())
            .classify(by_status)
            .layer(refunds);
        let id = refund_id();

        let first = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed())
            .await
            .unwrap();
        assert_eq!(first.value().status, statuses[0], "the answer, as it is");
        assert!(!first.is_recorded() && !first.is_replayed());
        let second = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed())
            .await
            .unwrap();
        assert!(!second.waited() && second.is_recorded() && !second.is_replayed());
        assert_eq!(second.value().status, 201);
        let third = steps
            .oneshot(Step::new(id, post("40")).keyed())
            .await
            .unwrap();
        assert!(third.is_replayed() && third.value().status == 201);
        assert_eq!(calls.load(SeqCst), 2, "{statuses:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_post_answered_with_a_5xx_is_unknown_and_never_sent_again() {
    // Crate docs, "And once the call returns": a failure that may have had its effect (a 502
    // from a gateway) on a call that may not be sent twice is as unknown as a timeout: recorded
    // so, and never sent again (a 4xx, a refusal, is released instead).
    let (calls, refunds) = answering(&[502, 201]);
    let steps = StepLayer::new(MemoryStore::new())
        .classify(by_status)
        .layer(refunds);
    let id = refund_id();
    let first = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")))
        .await
        .unwrap_err();
    assert!(first.is_unknown(), "{first}");
    let second = steps.oneshot(Step::new(id, post("40"))).await.unwrap_err();
    assert!(second.is_unknown(), "{second}");
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_released_and_the_next_attempt_sends() {
    for keyed in [true, false] {
        let (calls, _, refunds) = failing_once(std::io::ErrorKind::ConnectionRefused);
        let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
        let id = refund_id();
        let step = || {
            let step = Step::new(id.clone(), post("40"));
            if keyed {
                step.keyed()
            } else {
                step
            }
        };
        let err = steps.clone().oneshot(step()).await.unwrap_err();
        assert!(err.is_inner(), "keyed {keyed}: {err:?}");
        assert!(err.is_unsent(), "a refused connection was never sent");
        assert_eq!(
            err.inner_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::ConnectionRefused)
        );

        let out = steps.clone().oneshot(step()).await.unwrap();
        assert!(
            out.is_recorded() && !out.is_replayed() && !out.waited(),
            "keyed {keyed}"
        );
        let again = steps.oneshot(step()).await.unwrap();
        assert!(again.is_replayed());
        assert_eq!(calls.load(SeqCst), 2, "keyed {keyed}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_keyed_call_that_timed_out_is_released_and_sent_again_with_the_same_key() {
    for kind in [
        std::io::ErrorKind::TimedOut,
        std::io::ErrorKind::ConnectionReset,
    ] {
        let (calls, keys, refunds) = failing_once(kind);
        let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
        let id = refund_id();
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed())
            .await
            .unwrap_err();
        assert!(err.is_inner() && !err.is_unknown(), "{kind:?}: {err:?}");
        assert!(!err.is_unsent(), "{kind:?} may have been sent");

        let out = steps
            .oneshot(Step::new(id.clone(), post("40")).keyed())
            .await
            .unwrap();
        assert!(out.is_recorded() && !out.waited());
        let key = Some(id.idempotency_key());
        assert_eq!(*keys.lock().unwrap(), vec![key.clone(), key]);
        assert_eq!(calls.load(SeqCst), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_call_that_was_reset_is_never_sent_again() {
    let (calls, _, refunds) = failing_once(std::io::ErrorKind::ConnectionReset);
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let err = steps
        .clone()
        .oneshot(Step::new(id.clone(), post("40")))
        .await
        .unwrap_err();
    assert!(err.is_unknown());
    let err = steps.oneshot(Step::new(id, post("40"))).await.unwrap_err();
    assert!(err.is_unknown());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_of_an_owner_whose_connection_was_refused_runs_the_step_itself() {
    let (calls, refunds) = tool(|_: http::Request<String>, call| async move {
        if call == 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        }
        Ok(Refund { status: 201, call })
    });
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let (owner, waiter) = tokio::join!(
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
        async {
            tokio::task::yield_now().await;
            steps
                .clone()
                .oneshot(Step::new(id.clone(), post("40")))
                .await
        }
    );
    assert!(owner.unwrap_err().is_inner());
    let waiter = waiter.unwrap();
    assert!(waiter.waited() && waiter.is_recorded() && !waiter.is_replayed());
    assert_eq!(calls.load(SeqCst), 2, "the refused call never went out");
}

/// A tool whose first call panics once it is under way, and whose later calls answer.
fn panicking_once() -> (
    Arc<std::sync::atomic::AtomicUsize>,
    impl support::RefundTool<http::Request<String>>,
) {
    tool(|_: http::Request<String>, call| async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if call == 0 {
            panic!("the tool's client panicked mid-call");
        }
        Ok(Refund { status: 201, call })
    })
}

#[tokio::test(start_paused = true)]
async fn a_keyed_step_whose_tool_panics_is_released_for_the_next_attempt() {
    let (calls, refunds) = panicking_once();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let panicked = tokio::spawn(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")).keyed()),
    )
    .await
    .unwrap_err();
    assert!(panicked.is_panic(), "the panic reaches the caller");
    settle().await;

    let out = steps
        .oneshot(Step::new(id, post("40")).keyed())
        .await
        .unwrap();
    assert!(!out.waited(), "released, not held until its lease ends");
    assert!(out.is_recorded());
    assert_eq!(calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_step_whose_tool_panics_is_never_sent_again() {
    let (calls, refunds) = panicking_once();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let panicked = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), post("40"))))
        .await
        .unwrap_err();
    assert!(panicked.is_panic());
    settle().await;

    for _ in 0..2 {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_tool_that_is_not_ready_fails_the_step_and_sends_nothing() {
    #[derive(Clone)]
    struct Closed;
    impl Service<http::Request<String>> for Closed {
        type Response = Refund;
        type Error = std::io::Error;
        type Future = std::future::Ready<Outcome>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), std::io::Error>> {
            std::task::Poll::Ready(Err(std::io::ErrorKind::ConnectionRefused.into()))
        }
        fn call(&mut self, _: http::Request<String>) -> Self::Future {
            unreachable!("called while not ready")
        }
    }
    let err = StepLayer::new(MemoryStore::new())
        .layer(Closed)
        .oneshot(Step::new(refund_id(), post("40")))
        .await
        .unwrap_err();
    assert!(err.is_inner() && err.is_unsent(), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_refusal_is_released_with_its_mark_and_the_next_attempt_sends() {
    // "a refusal (the classifier's Action::Stop: an upstream 4xx) | none: released; the step
    // is not done": for a call that may not be sent twice too; its sent mark goes with it,
    // so the fixed resend is sent, not settled unknown.
    for statuses in [&[400, 201][..], &[409, 201], &[422, 201]] {
        let statuses: &'static [u16] = Box::leak(statuses.to_vec().into_boxed_slice());
        let (calls, refunds) = answering(statuses);
        let steps = StepLayer::new(MemoryStore::new())
            .classify(by_status)
            .layer(refunds);
        let id = refund_id();
        let first = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap();
        assert!(!first.is_recorded() && first.value().status == statuses[0]);
        let second = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap();
        assert!(second.is_recorded() && !second.waited(), "{statuses:?}");
        assert!(steps
            .oneshot(Step::new(id, post("40")))
            .await
            .unwrap()
            .is_replayed());
        assert_eq!(calls.load(SeqCst), 2, "{statuses:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_post_answered_429_by_a_classifier_that_retries_it_is_unknown() {
    // The crate's own `classify` example retries a 429: "an answer that may have had its
    // effect (Action::Retry or InProgress: a 5xx, a 429), policy Refuse | ... without one:
    // unknown, recorded".
    let (calls, refunds) = answering(&[429, 201]);
    let steps = StepLayer::new(MemoryStore::new())
        .classify(|outcome: &Outcome| match outcome {
            Ok(r) if r.status < 300 => Action::Success,
            Ok(r) if r.status >= 500 || r.status == 429 => Action::Retry { after: None },
            Ok(_) => Action::Stop,
            Err(_) => Action::Retry { after: None },
        })
        .layer(refunds);
    let id = refund_id();
    for _ in 0..2 {
        let err = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap_err();
        assert!(err.is_unknown(), "{err:?}");
    }
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_5xx_is_looked_up_released_when_not_found_and_recorded_when_found() {
    use tower_once_step::Verified;
    for found in [false, true] {
        let (calls, refunds) = answering(&[502, 201]);
        let lookups = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&lookups);
        let steps = StepLayer::new(MemoryStore::new())
            .classify(by_status)
            .verify(move |_: &StepId, _: std::time::SystemTime| {
                counted.fetch_add(1, SeqCst);
                std::future::ready(if found {
                    Verified::Happened(Refund {
                        status: 201,
                        call: 99,
                    })
                } else {
                    Verified::NotHappened
                })
            })
            .layer(refunds);
        let id = refund_id();
        let first = steps
            .clone()
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap();
        if found {
            assert!(first.is_verified() && first.value().call == 99, "{first:?}");
        } else {
            assert!(!first.is_recorded() && first.value().status == 502);
        }
        let second = steps
            .oneshot(Step::new(id.clone(), post("40")))
            .await
            .unwrap();
        if found {
            assert!(second.is_replayed() && second.value().call == 99);
            assert_eq!(calls.load(SeqCst), 1, "found: never sent again");
        } else {
            assert!(second.is_recorded() && !second.is_replayed());
            assert_eq!(
                calls.load(SeqCst),
                2,
                "not found: its mark went, sent again"
            );
        }
        assert_eq!(lookups.load(SeqCst), 1);
    }
}
