//! The fallback in the stack it is made for (crate docs "The stack it is made for": a retry and a
//! circuit breaker in front of the primary, or a retry around the fallback): an open circuit is an
//! unsent failure, but an operation whose earlier attempt was sent is not unsent when its circuit
//! then refuses the next one (typed or boxed behind a `Buffer`, with a retry inside or outside the
//! fallback), and a refusal the fallback answered for never reaches the retry's budget as one.
//! Every test counts the calls (the effects) on each side.

use http::StatusCode;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_once_breaker::CircuitBreakerLayer;
use tower_once_core::backoff::{Backoff, Jitter};
use tower_once_fallback::http::HttpFallbackLayer;
use tower_once_fallback::FallbackLayer;
use tower_once_retry::RetryLayer;

mod support;

use support::{counting, post, timed, Side};

fn fixed_break(secs: u64) -> Backoff {
    Backoff::new(Duration::from_secs(secs), 1.0, Duration::from_secs(secs))
        .unwrap()
        .jitter(Jitter::None)
}

#[tokio::test(start_paused = true)]
async fn an_open_circuit_behind_a_retry_is_an_unsent_failure() {
    let (primary, secondary) = (Side::default(), Side::default());
    let breaker = CircuitBreakerLayer::http().consecutive_failures(1);
    breaker.circuits().circuit("http://a.example").isolate();
    let primary_stack = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(3).into_http())
        .layer(breaker)
        .service(primary.answering(200));
    let res = HttpFallbackLayer::new(secondary.answering(201))
        .layer(primary_stack)
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!((primary.calls(), secondary.calls()), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn a_post_that_failed_after_a_sent_attempt_stays_even_if_its_circuit_then_opened() {
    let (primary, secondary) = (Side::default(), Side::default());
    // The first attempt is sent and fails (a reset: it may have run); the circuit opens; the
    // retries are refused. Not every attempt was unsent: no fallback.
    let primary_stack = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(3).into_http())
        .layer(CircuitBreakerLayer::http().consecutive_failures(1))
        .service(primary.failing(Err(std::io::ErrorKind::ConnectionReset)));
    let err = HttpFallbackLayer::new(secondary.answering(201))
        .layer(primary_stack)
        .oneshot(post())
        .await
        .unwrap_err();
    assert!(err.is_primary());
    assert_eq!((primary.calls(), secondary.calls()), (1, 0));
}

/// RetryError's `Unsent`: an operation whose first attempt was sent (a reset: it may have
/// run), whose circuit then opened and refused its second attempt, is not "unsent". The
/// retry layer gives up with GiveUp::CircuitOpen after 2 attempts, 1 refused; the fallback
/// must keep the primary's outcome.
#[tokio::test(start_paused = true)]
async fn a_sent_attempt_then_a_circuit_refusal_is_not_unsent() {
    let (p, s) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let primary = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .layer(
            CircuitBreakerLayer::new()
                .consecutive_failures(1)
                .break_duration(fixed_break(60)),
        )
        .service(counting::<String>(p.clone(), |_| {
            Err(std::io::ErrorKind::ConnectionReset.into())
        }));
    let secondary = counting::<String>(s.clone(), |_| Ok("charged by B"));
    let result = FallbackLayer::new(secondary)
        .layer(primary)
        .oneshot("charge".to_owned())
        .await;
    assert_eq!(
        (p.load(SeqCst), s.load(SeqCst)),
        (1, 0),
        "charged on A (reset after sending) and again on B: {result:?}"
    );
}

/// The same with HTTP: a POST the retry layer stamped a key on (so that it may retry it on
/// the primary) is sent, reset, then refused by its now open circuit; the fallback above the
/// retry must not send it to a secondary that does not share the primary's records.
#[tokio::test(start_paused = true)]
async fn http_post_sent_then_refused_by_its_circuit_stays_with_the_primary() {
    let (primary, secondary) = (Side::default(), Side::default());
    let primary_stack = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .no_budget()
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .layer(
            CircuitBreakerLayer::http()
                .consecutive_failures(1)
                .break_duration(fixed_break(60)),
        )
        .service(primary.failing(Err(std::io::ErrorKind::ConnectionReset)));
    let result = HttpFallbackLayer::new(secondary.answering(201))
        .layer(primary_stack)
        .oneshot(post())
        .await;
    assert_eq!(
        (primary.calls(), secondary.calls()),
        (1, 0),
        "the POST may have run on A, and ran on B: {result:?}"
    );
}

/// A `tower::buffer::Buffer` between the fallback and the retry layer boxes the error. The
/// boxed chain then answers "unsent" if *any* error in it is a refused connection: the first
/// attempt was reset after sending (it may have run), the second found the primary refusing
/// connections. The typed RetryError says "may have run"; the boxed one must too.
#[tokio::test(start_paused = true)]
async fn behind_a_buffer_a_retry_whose_earlier_attempt_was_sent_is_not_unsent() {
    let (p, s) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let primary = ServiceBuilder::new()
        .buffer(8)
        .layer(
            RetryLayer::new()
                .max_attempts(2)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .service(counting::<String>(p.clone(), |n| match n {
            1 => Err(std::io::ErrorKind::ConnectionReset.into()),
            _ => Err(std::io::ErrorKind::ConnectionRefused.into()),
        }));
    let secondary = timed::<String>(s.clone(), |_| (0, Ok("charged by B")));
    let result = FallbackLayer::new(secondary)
        .layer(primary)
        .oneshot("charge".to_owned())
        .await;
    assert_eq!(
        (p.load(SeqCst), s.load(SeqCst)),
        (2, 0),
        "the first attempt may have run on A: {result:?}"
    );
}

/// Behind a Buffer, the circuit's refusal of the second attempt also reads as "unsent" in
/// the boxed chain (a Refused is found), although the first attempt was sent.
#[tokio::test(start_paused = true)]
async fn behind_a_buffer_a_sent_attempt_then_a_circuit_refusal_is_not_unsent() {
    let (p, s) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let primary = ServiceBuilder::new()
        .buffer(8)
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .no_budget(),
        )
        .layer(
            CircuitBreakerLayer::new()
                .consecutive_failures(1)
                .break_duration(fixed_break(60)),
        )
        .service(counting::<String>(p.clone(), |_| {
            Err(std::io::ErrorKind::ConnectionReset.into())
        }));
    let secondary = timed::<String>(s.clone(), |_| (0, Ok("charged by B")));
    let result = FallbackLayer::new(secondary)
        .layer(primary)
        .oneshot("charge".to_owned())
        .await;
    assert_eq!(
        (p.load(SeqCst), s.load(SeqCst)),
        (1, 0),
        "the first attempt may have run on A: {result:?}"
    );
}

/// An outer retry around the fallback: the POST (keyed by the retry, so the *primary* may be
/// retried safely) is sent and reset on attempt 1 (withheld: correct), which opens the
/// primary's circuit; attempt 2 is refused by that circuit, so the fallback sees an "unsent"
/// failure and sends the same operation to the secondary, which does not share the
/// primary's records. The operation may now have run on both.
#[tokio::test(start_paused = true)]
async fn an_outer_retry_around_the_fallback_never_sends_a_sent_operation_on() {
    let (primary, secondary) = (Side::default(), Side::default());
    let fallback = HttpFallbackLayer::new(secondary.answering(201)).layer(
        ServiceBuilder::new()
            .layer(
                CircuitBreakerLayer::http()
                    .consecutive_failures(1)
                    .break_duration(fixed_break(60)),
            )
            .service(primary.failing(Err(std::io::ErrorKind::ConnectionReset))),
    );
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .no_budget()
                .into_http()
                .stamp_idempotency_keys(true),
        )
        .service(fallback);
    let result = svc.oneshot(post()).await;
    let (p, s) = (primary.keys(), secondary.keys());
    assert_eq!(
        (p.len(), s.len()),
        (1, 0),
        "key {:?} sent to A, then to B: {:?}",
        p,
        result.map(|r| r.status())
    );
}

/// A circuit refusal of the primary, withdrawn by the fallback: the outer retry sees
/// the secondary's sent failure, not a refusal, so it draws on its (empty) budget.
#[tokio::test(start_paused = true)]
async fn a_stale_primary_refusal_does_not_reach_the_retry_above_the_fallback() {
    let (p, s) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let breaker = CircuitBreakerLayer::new().consecutive_failures(1);
    breaker.circuits().circuit("").isolate();
    let primary = breaker.layer(counting::<String>(p.clone(), |_| Ok("A")));
    let secondary = counting::<String>(s.clone(), |_| {
        Err(std::io::ErrorKind::ConnectionReset.into())
    });
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .budget(tower_once_retry::budget::RetryBudget::new(
                    0.0,
                    0,
                    Duration::from_secs(10),
                )),
        )
        .layer(FallbackLayer::new(secondary))
        .service(primary);
    let err = svc.oneshot("x".to_owned()).await.unwrap_err();
    assert_eq!(err.refusals(), 0, "{err}");
    assert_eq!(err.reason(), tower_once_retry::GiveUp::Budget, "{err}");
    assert_eq!((p.load(SeqCst), s.load(SeqCst)), (0, 1));
}

/// The retry layer draws nothing from its budget for an attempt a circuit refused, "for the
/// dependency saw no load". Here the primary *was* sent (a reset) and only the secondary's
/// circuit refused: the fallback lets the secondary's refusal through to the retry above, so
/// the attempt passes for unsent and the primary is retried past an empty budget.
#[tokio::test(start_paused = true)]
async fn a_sent_primary_with_a_refusing_secondary_still_draws_the_retry_budget() {
    let (p, s) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let breaker = CircuitBreakerLayer::new();
    breaker.circuits().circuit("").isolate();
    let secondary = breaker.layer(counting::<String>(s.clone(), |_| Ok("B")));
    let primary = counting::<String>(p.clone(), |_| {
        Err(std::io::ErrorKind::ConnectionReset.into())
    });
    let svc = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .max_attempts(3)
                .deadline(Duration::from_secs(10))
                .budget(tower_once_retry::budget::RetryBudget::new(
                    0.0,
                    0,
                    Duration::from_secs(10),
                )),
        )
        .layer(FallbackLayer::new(secondary).side_effect_free(true))
        .service(primary);
    let err = svc.oneshot("search".to_owned()).await.unwrap_err();
    assert_eq!(
        (p.load(SeqCst), err.reason(), err.refusals()),
        (1, tower_once_retry::GiveUp::Budget, 0),
        "{err}"
    );
}
