//! The crate docs' table, a test per row: which failed requests go to the secondary (unsent
//! failures always; failures that may have run only for idempotent, `SafeToRetry`,
//! side-effect-free, or keyed requests to a secondary sharing the records) and which never do,
//! and none once the deadline has passed. Every test counts the calls (the effects) on each side,
//! and the key each side saw.

use http::{Request, Response, StatusCode};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{Layer, ServiceExt};
use tower_once_core::resend::SafeToRetry;
use tower_once_fallback::http::{FromSecondary, HttpFallbackLayer};
use tower_once_fallback::{FallbackLayer, Reason};

mod support;

use support::{get, post, Req, Side};

#[tokio::test(start_paused = true)]
async fn a_success_or_the_callers_fault_is_returned_as_it_is() {
    for status in [200, 201, 400, 404, 422] {
        let (primary, secondary) = (Side::default(), Side::default());
        let res = HttpFallbackLayer::new(secondary.answering(200))
            .side_effect_free(true)
            .layer(primary.answering(status))
            .oneshot(post())
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), status);
        assert!(res.extensions().get::<FromSecondary>().is_none());
        assert_eq!((primary.calls(), secondary.calls()), (1, 0), "{status}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unsent_failure_goes_on_whatever_the_request() {
    // The connection was refused: a POST without a key may go.
    let (primary, secondary) = (Side::default(), Side::default());
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let res = HttpFallbackLayer::new(secondary.answering(201))
        .on_fallback(
            move |e: &tower_once_fallback::hook::FallbackEvent<'_, _, _>| {
                seen.lock().unwrap().push(e.reason)
            },
        )
        .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)))
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(res.extensions().get::<FromSecondary>().is_some());
    assert_eq!((primary.calls(), secondary.calls()), (1, 1));
    assert_eq!(*reasons.lock().unwrap(), [Reason::Unsent]);
}

#[tokio::test(start_paused = true)]
async fn a_post_that_may_have_run_stays_with_the_primary() {
    for outcome in [
        Ok(500),
        Ok(503),
        Err(std::io::ErrorKind::ConnectionReset),
        Err(std::io::ErrorKind::TimedOut),
    ] {
        let (primary, secondary) = (Side::default(), Side::default());
        let result = HttpFallbackLayer::new(secondary.answering(201))
            .layer(primary.failing(outcome))
            .oneshot(post())
            .await;
        match (outcome, result) {
            (Ok(status), Ok(res)) => assert_eq!(res.status().as_u16(), status),
            (Err(_), Err(e)) => assert!(e.is_primary()),
            (o, r) => panic!("{o:?}: {r:?}"),
        }
        assert_eq!((primary.calls(), secondary.calls()), (1, 0), "{outcome:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_idempotent_method_or_a_safe_to_retry_mark_goes_on_after_any_failure() {
    let (primary, secondary) = (Side::default(), Side::default());
    let layer = HttpFallbackLayer::new(secondary.answering(200));
    let res = layer
        .layer(primary.answering(503))
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let mut completion = post();
    completion.extensions_mut().insert(SafeToRetry);
    let res = layer
        .layer(primary.failing(Err(std::io::ErrorKind::TimedOut)))
        .oneshot(completion)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((primary.calls(), secondary.calls()), (2, 2));
    assert_eq!(
        secondary.keys(),
        [None, None],
        "a SafeToRetry request gets no key"
    );
}

#[tokio::test(start_paused = true)]
async fn side_effect_free_requests_go_on_after_any_failure() {
    let (primary, secondary) = (Side::default(), Side::default());
    let res = HttpFallbackLayer::new(secondary.answering(200))
        .side_effect_free(true)
        .layer(primary.answering(529))
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!((primary.calls(), secondary.calls()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn shared_records_need_a_key_and_a_stamped_one_is_the_same_on_both_sides() {
    // Without a key the secondary could not recognise it: stays.
    let (primary, secondary) = (Side::default(), Side::default());
    let layer = HttpFallbackLayer::new(secondary.answering(201)).shares_records(true);
    let res = layer
        .layer(primary.answering(500))
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(secondary.calls(), 0);
    // Stamped before the primary saw it: both sides got the same key.
    let res = layer
        .stamp_idempotency_keys(true)
        .layer(primary.answering(500))
        .oneshot(post())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let (p, s) = (primary.keys(), secondary.keys());
    assert_eq!(p.len(), 2);
    assert!(p[1].is_some());
    assert_eq!(s, [p[1].clone()]);
}

#[tokio::test(start_paused = true)]
async fn still_in_progress_is_a_failure_that_ran() {
    let (primary, secondary) = (Side::default(), Side::default());
    let mut keyed = post();
    keyed
        .headers_mut()
        .insert("idempotency-key", "k-1".parse().unwrap());
    let res = HttpFallbackLayer::new(secondary.answering(201))
        .layer(primary.answering(409))
        .oneshot(keyed)
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(
        secondary.calls(),
        0,
        "another secondary would run it a second time"
    );
}

#[tokio::test(start_paused = true)]
async fn plain_requests_go_on_only_unsent_unless_the_layer_is_told_more() {
    let calls = Arc::new(Mutex::new(0));
    let counted = calls.clone();
    let secondary = tower::service_fn(move |_: String| {
        *counted.lock().unwrap() += 1;
        async { Ok::<_, std::io::Error>("B") }
    });
    let failing = |kind: std::io::ErrorKind| {
        tower::service_fn(
            move |_: String| async move { Err::<&str, _>(std::io::Error::from(kind)) },
        )
    };
    let layer = FallbackLayer::new(secondary);
    let refused = failing(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(layer.layer(refused).oneshot("x".into()).await.unwrap(), "B");
    let reset = failing(std::io::ErrorKind::ConnectionReset);
    assert!(layer
        .layer(reset)
        .oneshot("x".into())
        .await
        .unwrap_err()
        .is_primary());
    let reset = failing(std::io::ErrorKind::ConnectionReset);
    let free = layer.clone().side_effect_free(true);
    assert_eq!(free.layer(reset).oneshot("x".into()).await.unwrap(), "B");
    assert_eq!(*calls.lock().unwrap(), 2);
}

#[tokio::test(start_paused = true)]
async fn no_fallback_after_the_deadline_and_the_secondary_is_cut_at_it() {
    // The primary takes the whole deadline: its failure stays.
    let (primary, secondary) = (Side::default(), Side::default());
    let slow_primary = primary.failing(Err(std::io::ErrorKind::ConnectionRefused));
    let slow_refused = tower::service_fn(move |req: Req| {
        let p = slow_primary.clone();
        async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            p.oneshot(req).await
        }
    });
    let err = HttpFallbackLayer::new(secondary.answering(201))
        .deadline(Duration::from_secs(2))
        .layer(slow_refused)
        .oneshot(post())
        .await;
    // The primary has no timeout of its own here: it answered after the deadline.
    assert!(err.unwrap_err().is_primary());
    assert_eq!(secondary.calls(), 0);

    // A secondary slower than what is left: cut at the deadline.
    let (primary, secondary) = (Side::default(), Side::default());
    let slow_secondary = secondary.answering(201).and_then(|r| async move {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Ok::<_, std::io::Error>(r)
    });
    let started = tokio::time::Instant::now();
    let err = HttpFallbackLayer::new(slow_secondary)
        .deadline(Duration::from_secs(2))
        .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)))
        .oneshot(post())
        .await
        .unwrap_err();
    assert!(err.is_deadline());
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(secondary.calls(), 1);
}

/// A secondary that is ready only once `open` is set (a full pool, a concurrency limit).
#[derive(Clone)]
struct Gated {
    open: Arc<Mutex<(bool, Option<std::task::Waker>)>>,
    calls: Arc<AtomicU32>,
}

impl Gated {
    fn open(&self) {
        let mut g = self.open.lock().unwrap();
        g.0 = true;
        if let Some(w) = g.1.take() {
            w.wake();
        }
    }
}

impl<B> tower::Service<Request<B>> for Gated {
    type Response = Response<String>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<String>, std::io::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        let mut g = self.open.lock().unwrap();
        if g.0 {
            std::task::Poll::Ready(Ok(()))
        } else {
            g.1 = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        self.calls.fetch_add(1, SeqCst);
        std::future::ready(Ok(Response::new(String::new())))
    }
}

/// "No request goes to the secondary once [the deadline] has passed": the secondary is not
/// ready when the primary's unsent failure comes in; it becomes ready only after the
/// deadline, before the fallback's future is polled again. It must not be called then.
#[tokio::test(start_paused = true)]
async fn nothing_goes_to_a_secondary_that_becomes_ready_after_the_deadline() {
    let primary = Side::default();
    let secondary = Gated {
        open: Arc::default(),
        calls: Arc::default(),
    };
    let fut = HttpFallbackLayer::new(secondary.clone())
        .deadline(Duration::from_secs(2))
        .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)))
        .oneshot(post());
    tokio::pin!(fut);
    assert!(futures_util::poll!(fut.as_mut()).is_pending());
    assert_eq!(primary.calls(), 1);
    // The deadline passes while the task is busy elsewhere; then the secondary frees up.
    tokio::time::advance(Duration::from_secs(3)).await;
    secondary.open();
    let result = fut.await;
    assert_eq!(
        secondary.calls.load(SeqCst),
        0,
        "sent to the secondary 1 s after the deadline: {result:?}"
    );
}

/// A fallback hook that panics is contained (crate docs: a hook that panics is logged and the
/// layer goes on): the request goes to the secondary once, as the rule says, and the next
/// request falls back as before. Nothing is sent twice.
#[tokio::test(start_paused = true)]
async fn a_fallback_hook_that_panics_is_contained_and_the_request_falls_back() {
    let (primary, secondary) = (Side::default(), Side::default());
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let svc = HttpFallbackLayer::new(secondary.answering(201))
        .on_fallback(
            move |_: &tower_once_fallback::hook::FallbackEvent<'_, _, _>| {
                if armed.swap(false, SeqCst) {
                    panic!("the fallback hook failed");
                }
            },
        )
        .layer(primary.failing(Err(std::io::ErrorKind::ConnectionRefused)));
    let res = svc.clone().oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!((primary.calls(), secondary.calls()), (1, 1));
    let res = svc.oneshot(post()).await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!((primary.calls(), secondary.calls()), (2, 2));
}
