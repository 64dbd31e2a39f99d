//! The crate docs' semantics table: a slow first attempt is hedged after the delay and the
//! first good answer wins (the other copy is cancelled); a fast one is not; hedges stop at
//! `max_hedges`, at the deadline and when the shared retry budget refuses; a failure with
//! nothing else in flight is returned at once; an "in progress" answer waits for the copy that
//! holds the claim; the percentile delay follows observed latencies. Paused time; every test
//! counts the copies that reached the service and the ones cancelled.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower::{Layer, ServiceBuilder, ServiceExt};
use tower_once_core::attempt::Attempt;
use tower_once_core::classify::Action;
use tower_once_hedge::HedgeLayer;
use tower_once_retry::budget::RetryBudget;
use tower_once_retry::RetryLayer;
use tower_once_timeout::Deadline;

/// How the `n`th copy (0 the first) answers: after how long, with what.
type Script = Arc<dyn Fn(u32) -> (u64, Result<&'static str, &'static str>) + Send + Sync>;

#[derive(Clone)]
struct Replicas {
    calls: Arc<AtomicU32>,
    cancelled: Arc<AtomicU32>,
    marks: Arc<Mutex<Vec<Option<Attempt>>>>,
    script: Script,
}

struct CountDrop(Arc<AtomicU32>, bool);
impl Drop for CountDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, SeqCst);
        }
    }
}

impl Replicas {
    fn new(
        script: impl Fn(u32) -> (u64, Result<&'static str, &'static str>) + Send + Sync + 'static,
    ) -> Self {
        Self {
            calls: Arc::default(),
            cancelled: Arc::default(),
            marks: Arc::default(),
            script: Arc::new(script),
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(SeqCst)
    }

    fn cancelled(&self) -> u32 {
        self.cancelled.load(SeqCst)
    }

    fn service(
        &self,
    ) -> impl tower::Service<Req, Response = &'static str, Error = &'static str, Future = impl Send>
           + Clone
           + Send
           + 'static {
        let this = self.clone();
        tower::service_fn(move |req: Req| {
            let n = this.calls.fetch_add(1, SeqCst);
            this.marks.lock().unwrap().push(Attempt::carried(&req));
            let (ms, outcome) = (this.script)(n);
            let cancelled = this.cancelled.clone();
            async move {
                let mut guard = CountDrop(cancelled, false);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                guard.1 = true;
                outcome
            }
        })
    }
}

/// A request that carries the operation's context (as `http::Request` does) and is `Clone`.
#[derive(Debug, Clone, Default)]
struct Req(http::Extensions);

impl tower_once_core::carrier::Carrier for Req {
    fn extensions(&self) -> Option<&http::Extensions> {
        Some(&self.0)
    }

    fn extensions_mut(&mut self) -> Option<&mut http::Extensions> {
        Some(&mut self.0)
    }
}

fn req() -> Req {
    Req::default()
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_attempt_is_hedged_and_the_first_answer_wins() {
    let replicas = Replicas::new(|n| (if n == 0 { 5_000 } else { 20 }, Ok("answer")));
    let svc = HedgeLayer::new(Duration::from_millis(100)).layer(replicas.service());
    let started = Instant::now();
    assert_eq!(svc.oneshot(req()).await.unwrap(), "answer");
    assert_eq!(started.elapsed(), Duration::from_millis(120));
    assert_eq!(replicas.calls(), 2);
    assert_eq!(replicas.cancelled(), 1, "the slow copy was dropped");
    let marks = replicas.marks.lock().unwrap().clone();
    assert_eq!(marks, [None, Some(Attempt::FIRST.hedge())]);
}

/// The hook is told each hedge as it is sent: its number and how long after the first copy.
#[tokio::test(start_paused = true)]
async fn the_hook_is_told_each_hedge() {
    let replicas = Replicas::new(|_| (10_000, Ok("late")));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .max_hedges(2)
        .no_budget()
        .on_hedge(move |event: &tower_once_hedge::hook::HedgeEvent| {
            log.lock().unwrap().push((event.hedge, event.after));
        })
        .layer(replicas.service());
    let slow = tokio::spawn(svc.oneshot(req()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    slow.abort();
    let _ = slow.await;
    assert_eq!(replicas.calls(), 3);
    assert_eq!(
        *seen.lock().unwrap(),
        [
            (1, Duration::from_millis(100)),
            (2, Duration::from_millis(200))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_fast_answer_sends_no_hedge() {
    let replicas = Replicas::new(|_| (50, Ok("answer")));
    let svc = HedgeLayer::new(Duration::from_millis(100)).layer(replicas.service());
    for _ in 0..10 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    assert_eq!(replicas.calls(), 10);
    assert_eq!(replicas.cancelled(), 0);
}

#[tokio::test(start_paused = true)]
async fn hedges_stop_at_max_hedges_and_the_deadline() {
    let replicas = Replicas::new(|_| (10_000, Ok("late")));
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .max_hedges(3)
        .no_budget()
        .layer(replicas.service());
    let slow = tokio::spawn(svc.clone().oneshot(req()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(replicas.calls(), 4, "the first and three hedges");
    slow.abort();
    let _ = slow.await;
    assert_eq!(replicas.cancelled(), 4);

    // A deadline 250 ms away: hedges at 100 and 200 ms, none at 300.
    let replicas = Replicas::new(|_| (10_000, Ok("late")));
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .max_hedges(5)
        .no_budget()
        .layer(replicas.service());
    let mut request = req();
    Deadline::after(Duration::from_millis(250)).attach(&mut request);
    let slow = tokio::spawn(svc.oneshot(request));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(replicas.calls(), 3);
    slow.abort();
}

#[tokio::test(start_paused = true)]
async fn hedges_draw_on_the_budget_the_retry_layer_shares() {
    // No floor, 10 %: ten operations earn one retry or hedge between them.
    let budget = RetryBudget::new(0.1, 0, Duration::from_secs(60));
    // Ten fast operations, then two slow ones (calls 10 and 12; the hedge of the first is
    // call 11).
    let replicas = Replicas::new(|n| (if n == 10 || n == 12 { 1_000 } else { 10 }, Ok("ok")));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().budget(budget.clone()))
        .layer(HedgeLayer::new(Duration::from_millis(100)).budget(budget.clone()))
        .service(replicas.service());
    for _ in 0..10 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    let started = Instant::now();
    svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(110), "hedged");
    let started = Instant::now();
    svc.clone().oneshot(req()).await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(1_000),
        "the budget was spent"
    );
    // The retry layer deposited the operations; the hedging layer inside it, none of its own.
    assert_eq!(replicas.calls(), 13);
}

#[tokio::test(start_paused = true)]
async fn a_failure_with_nothing_else_in_flight_is_returned_at_once() {
    let replicas = Replicas::new(|_| (10, Err("503")));
    let svc = HedgeLayer::new(Duration::from_millis(100)).layer(replicas.service());
    let started = Instant::now();
    assert_eq!(svc.oneshot(req()).await.unwrap_err(), "503");
    assert_eq!(started.elapsed(), Duration::from_millis(10));
    assert_eq!(replicas.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_copy_waits_for_the_others() {
    // The first copy is slow and succeeds; the hedge fails fast.
    let replicas = Replicas::new(|n| {
        if n == 0 {
            (500, Ok("first"))
        } else {
            (10, Err("reset"))
        }
    });
    let svc = HedgeLayer::new(Duration::from_millis(100)).layer(replicas.service());
    assert_eq!(svc.oneshot(req()).await.unwrap(), "first");
    assert_eq!(replicas.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn in_progress_waits_for_the_copy_that_holds_the_claim() {
    // A classifier that reads "busy" as an idempotency server's "in progress".
    let classify = |outcome: &Result<&'static str, &'static str>| match outcome {
        Ok(_) => Action::Success,
        Err("busy") => Action::InProgress { after: None },
        Err(_) => Action::Retry { after: None },
    };
    // The first copy holds the claim and answers at 400 ms; the hedge is told "busy" at 150.
    let replicas = Replicas::new(|n| {
        if n == 0 {
            (400, Ok("done"))
        } else {
            (50, Err("busy"))
        }
    });
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .classify(classify)
        .layer(replicas.service());
    let started = Instant::now();
    assert_eq!(svc.oneshot(req()).await.unwrap(), "done");
    assert_eq!(started.elapsed(), Duration::from_millis(400));
    // Only "in progress" left: it is the answer (a retry layer asks again).
    let replicas = Replicas::new(|_| (50, Err("busy")));
    let svc = HedgeLayer::new(Duration::from_millis(10))
        .classify(classify)
        .layer(replicas.service());
    assert_eq!(svc.oneshot(req()).await.unwrap_err(), "busy");
}

#[tokio::test(start_paused = true)]
async fn the_percentile_delay_follows_observed_latencies() {
    // Nine in ten answers take 10 ms, one in ten 1 s.
    let replicas = Replicas::new(|n| (if n % 10 == 9 { 1_000 } else { 10 }, Ok("ok")));
    let svc = HedgeLayer::latency_percentile(0.8, 20, Duration::from_secs(5))
        .no_budget()
        .layer(replicas.service());
    // The first period: no delay known, no hedge.
    for _ in 0..40 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    assert_eq!(replicas.calls(), 40);
    tokio::time::advance(Duration::from_secs(5)).await;
    // Now the 80th percentile (about 10 ms) is the delay: the slow answers are hedged.
    let started = Instant::now();
    for _ in 0..10 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    assert_eq!(replicas.calls(), 51, "one hedge, for the one slow answer");
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
}

/// "Hedges carry `Attempt::hedge` marks so a breaker below doesn't count them": every first
/// copy is slow and succeeds, every hedge fails fast. A breaker that opens after two
/// consecutive failures stays closed over twenty operations.
#[tokio::test(start_paused = true)]
async fn a_breaker_below_does_not_count_failing_hedges() {
    let replicas = Replicas::new(|n| {
        if n % 2 == 0 {
            (500, Ok("slow"))
        } else {
            (10, Err("reset"))
        }
    });
    let breaker = tower_once_breaker::CircuitBreakerLayer::new().consecutive_failures(2);
    let circuit = breaker.circuits().circuit("");
    let svc = ServiceBuilder::new()
        .layer(HedgeLayer::new(Duration::from_millis(100)).no_budget())
        .layer(breaker)
        .service(replicas.service());
    for _ in 0..20 {
        assert_eq!(svc.clone().oneshot(req()).await.unwrap(), "slow");
    }
    assert_eq!(replicas.calls(), 40);
    assert_eq!(circuit.state(), tower_once_breaker::CircuitState::Closed);
}

/// "A retry below makes one attempt each": RetryLayer → HedgeLayer → RetryLayer →
/// replicas; the slow first copy succeeds, the hedge fails fast: the inner retry layer makes
/// one attempt of the hedge (two calls in all), the outer one none.
#[tokio::test(start_paused = true)]
async fn a_retry_below_makes_one_attempt_of_a_hedge() {
    let replicas = Replicas::new(|n| {
        if n == 0 {
            (500, Ok("first"))
        } else {
            (10, Err("503"))
        }
    });
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().max_attempts(3).no_budget())
        .layer(HedgeLayer::new(Duration::from_millis(100)).no_budget())
        .layer(RetryLayer::new().max_attempts(3).no_budget())
        .service(replicas.service());
    assert_eq!(svc.oneshot(req()).await.unwrap(), "first");
    assert_eq!(replicas.calls(), 2);
    let marks = replicas.marks.lock().unwrap().clone();
    assert_eq!(marks[1].map(Attempt::is_hedge), Some(true));
}

/// A caller that goes away mid-way (its future dropped after the hedge was sent) cancels
/// every copy, and no hedge is sent after.
#[tokio::test(start_paused = true)]
async fn a_dropped_operation_cancels_every_copy() {
    let replicas = Replicas::new(|_| (10_000, Ok("late")));
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .max_hedges(5)
        .no_budget()
        .layer(replicas.service());
    let _ = tokio::time::timeout(Duration::from_millis(250), svc.oneshot(req())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(replicas.calls(), 3);
    assert_eq!(replicas.cancelled(), 3);
}

/// The crate docs: the generic layer "applies the same rule to requests that can tell", and an
/// unkeyed `POST` is never hedged "whichever of the hedging layers it meets"
/// (`Carrier::may_send_twice`). `tower::hedge` users wrap a request in an `Arc` to make it
/// cheap to clone, and the workspace implements `Carrier` for `Arc<T>` itself: an
/// `Arc<http::Request>` holding an unkeyed `POST` is still that `POST`, and a slow first answer
/// must not make the layer send a second copy of it (a second charge at the server). (A
/// `tonic::Request` cannot meet the generic layer: it is not `Clone`.)
#[tokio::test(start_paused = true)]
async fn an_unkeyed_post_in_an_arc_is_never_hedged() {
    type Charge = Arc<http::Request<&'static str>>;
    let charges = Arc::new(AtomicU32::new(0));
    let count = charges.clone();
    let svc =
        HedgeLayer::new(Duration::from_millis(100)).layer(tower::service_fn(move |req: Charge| {
            count.fetch_add(1, SeqCst);
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                Ok::<_, &'static str>(*req.body())
            }
        }));
    let unkeyed: Charge = Arc::new(
        http::Request::post("https://api.example/charges")
            .body("10 EUR")
            .unwrap(),
    );
    assert!(!tower_once_core::resend::may_resend(&unkeyed));
    let started = Instant::now();
    assert_eq!(svc.oneshot(unkeyed).await.unwrap(), "10 EUR");
    assert_eq!(
        charges.load(SeqCst),
        1,
        "a copy of an unkeyed POST was sent: two charges"
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

/// A hook that panics on its first call, then watches quietly.
fn panics_once() -> impl Fn(&tower_once_hedge::hook::HedgeEvent) + Send + Sync + 'static {
    let armed = std::sync::atomic::AtomicBool::new(true);
    move |_: &tower_once_hedge::hook::HedgeEvent| {
        if armed.swap(false, SeqCst) {
            panic!("the hedge hook failed");
        }
    }
}

/// A hook that panics as a hedge goes out is contained (crate docs: a hook that panics is
/// logged and the layer goes on): the hedge is sent and answers, and the budget it drew on
/// paid for a hedge that went out.
#[tokio::test(start_paused = true)]
async fn a_hedge_hook_that_panics_is_contained_and_the_hedge_goes_out() {
    // No floor, 10 %: ten operations earn one retry or hedge between them.
    let budget = RetryBudget::new(0.1, 0, Duration::from_secs(60));
    // Ten fast operations, then a slow first copy (call 10) whose hedge (call 11) is fast.
    let replicas = Replicas::new(|n| (if n == 10 { 1_000 } else { 10 }, Ok("ok")));
    let svc = ServiceBuilder::new()
        .layer(RetryLayer::new().budget(budget.clone()))
        .layer(
            HedgeLayer::new(Duration::from_millis(100))
                .budget(budget.clone())
                .on_hedge(panics_once()),
        )
        .service(replicas.service());
    for _ in 0..10 {
        svc.clone().oneshot(req()).await.unwrap();
    }
    let started = Instant::now();
    assert_eq!(svc.clone().oneshot(req()).await.unwrap(), "ok");
    assert_eq!(
        started.elapsed(),
        Duration::from_millis(110),
        "the hedge answered"
    );
    assert_eq!(
        replicas.calls(),
        12,
        "the hedge whose hook panicked went out"
    );
    assert_eq!(replicas.cancelled(), 1, "the slow copy was dropped");
}

/// After the hook panicked once, later operations are hedged as before: nothing is left
/// half-done by the panic.
#[tokio::test(start_paused = true)]
async fn after_a_hedge_hook_panicked_later_operations_are_still_hedged() {
    let replicas = Replicas::new(|n| (if n % 2 == 0 { 5_000 } else { 20 }, Ok("answer")));
    let svc = HedgeLayer::new(Duration::from_millis(100))
        .no_budget()
        .on_hedge(panics_once())
        .layer(replicas.service());
    for round in 1..=2 {
        let started = Instant::now();
        assert_eq!(svc.clone().oneshot(req()).await.unwrap(), "answer");
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(120),
            "round {round} hedged"
        );
    }
    assert_eq!(replicas.calls(), 4);
    assert_eq!(replicas.cancelled(), 2);
}
