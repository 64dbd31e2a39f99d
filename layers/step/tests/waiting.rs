//! A step running elsewhere is waited for, never run twice (crate docs, "What a step does":
//! "in progress elsewhere (task, process, replica) | waits (looks again, 10 ms doubling to a
//! quarter of the lease) until it is done, its owner's lease ends, or the deadline | its
//! result, waited; or StepError::is_in_progress at the deadline"; "claims it, calls the inner
//! service with the lease renewed every third of it"). The deadline is the request's
//! (`StepRequest::deadline`), the one in scope, or `StepLayer::max_wait`. Effects are counted
//! as calls of the tool; time is tokio's paused clock.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use support::{hanging_refunds, kill_after, post, refund_id, slow_refunds, Lookup};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt};
use tower_once_core::deadline::Deadline;
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer};

#[tokio::test(start_paused = true)]
async fn concurrent_calls_of_one_step_call_the_tool_once_and_the_others_wait_and_replay() {
    let (calls, refunds) = slow_refunds(Duration::from_secs(2));
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();

    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let steps = steps.clone();
            let step = Step::new(id.clone(), post("40")).arguments("40");
            tokio::spawn(steps.oneshot(step))
        })
        .collect();
    let mut outs = Vec::new();
    for task in tasks {
        outs.push(task.await.unwrap().unwrap());
    }
    assert_eq!(
        calls.load(SeqCst),
        1,
        "one refund for eight concurrent calls"
    );
    let called: Vec<_> = outs.iter().filter(|o| !o.is_replayed()).collect();
    assert_eq!(called.len(), 1);
    assert!(called[0].is_recorded() && !called[0].waited());
    for out in outs.iter().filter(|o| o.is_replayed()) {
        assert!(
            out.waited(),
            "a replay of a step in progress says it waited"
        );
        assert_eq!(out.value(), called[0].value());
    }
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_step_called_concurrently_is_sent_once() {
    // The same with the `Refuse` policy (three round trips: claim, mark, record).
    let (calls, refunds) = slow_refunds(Duration::from_millis(300));
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let (a, b) = tokio::join!(
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
        steps.clone().oneshot(Step::new(id.clone(), post("40"))),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(calls.load(SeqCst), 1);
    assert!(a.is_replayed() != b.is_replayed());
    assert!(a.waited() || b.waited());
    let again = steps.oneshot(Step::new(id, post("40"))).await.unwrap();
    assert!(again.is_replayed() && !again.waited());
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_in_progress_for_many_leases_keeps_its_claim_and_is_never_run_by_a_waiter() {
    // A call ten leases long: renewed every third of the lease, the owner keeps the step; a
    // waiter that took it over would send it again (keyed) or report it unknown (unkeyed).
    let lease = Duration::from_millis(300);
    let (calls, refunds) = slow_refunds(lease * 10);
    let steps = StepLayer::new(MemoryStore::new())
        .lease(lease)
        .layer(refunds);
    let keyed = refund_id();
    let unkeyed = StepId::new("run-1", 3, "refund");

    let owners = [
        tokio::spawn(
            steps
                .clone()
                .oneshot(Step::new(keyed.clone(), post("1")).keyed()),
        ),
        tokio::spawn(steps.clone().oneshot(Step::new(unkeyed.clone(), post("1")))),
    ];
    tokio::time::sleep(lease / 2).await;
    assert_eq!(calls.load(SeqCst), 2);

    // Waiters arriving all along the call, each waiting until the result is there.
    let mut waiters = Vec::new();
    for _ in 0..6 {
        for id in [&keyed, &unkeyed] {
            let mut step = Step::new(id.clone(), post("1"));
            if id == &keyed {
                step = step.keyed();
            }
            waiters.push(tokio::spawn(steps.clone().oneshot(step)));
        }
        tokio::time::sleep(lease * 3 / 2).await;
    }
    for owner in owners {
        let out = owner.await.unwrap().unwrap();
        assert!(
            out.is_recorded() && !out.is_replayed(),
            "the owner recorded its result"
        );
    }
    for waiter in waiters {
        let out = waiter.await.unwrap().unwrap();
        assert!(out.is_replayed(), "a waiter replays the owner's result");
    }
    assert_eq!(calls.load(SeqCst), 2, "each step sent once");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_with_a_deadline_on_the_request_gives_up_at_the_deadline() {
    let (calls, refunds) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let owner = tokio::spawn(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("1")).keyed()),
    );
    tokio::task::yield_now().await;
    assert_eq!(calls.load(SeqCst), 1);

    let deadline = Deadline::after(Duration::from_millis(1500));
    let mut request = post("1");
    deadline.attach(&mut request);
    let err = steps
        .clone()
        .oneshot(Step::new(id, request).keyed())
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(
        Instant::now(),
        deadline.instant(),
        "at the deadline, not later"
    );
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_with_a_deadline_that_passed_gives_up_at_once() {
    let (calls, refunds) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds);
    let id = refund_id();
    let owner = tokio::spawn(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("1")).keyed()),
    );
    tokio::task::yield_now().await;

    let mut request = post("1");
    Deadline::after(Duration::ZERO).attach(&mut request);
    let start = Instant::now();
    let err = steps
        .oneshot(Step::new(id, request).keyed())
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_with_a_deadline_in_scope_gives_up_at_the_deadline() {
    // A request type of the caller's own carries nothing: the deadline in scope (what a retry
    // layer above sets on each attempt) bounds the wait.
    let (calls, lookups) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(lookups);
    let id = StepId::new("run-1", 2, "lookup");
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), Lookup("A7"))));
    tokio::task::yield_now().await;

    let deadline = Deadline::after(Duration::from_secs(2));
    let mut waiter = steps.clone();
    let err = deadline
        .in_scope(async move {
            waiter
                .ready()
                .await
                .unwrap()
                .call(Step::new(id, Lookup("A7")))
                .await
        })
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(Instant::now(), deadline.instant());
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn a_deadline_in_scope_bounds_the_wait_of_a_step_behind_a_buffer() {
    // `Deadline` docs: "a deadline in scope while the caller polls also reaches layers behind a
    // Buffer (whose worker hands the inner future back to the caller)"; `StepLayer::max_wait`
    // applies only "when its request carries no deadline and none is in scope".
    let (calls, lookups) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(lookups);
    let id = StepId::new("run-1", 2, "lookup");
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), Lookup("A7"))));
    tokio::task::yield_now().await;

    let buffered = tower::buffer::Buffer::new(steps, 8);
    let deadline = Deadline::after(Duration::from_secs(2));
    let err = deadline
        .in_scope(buffered.oneshot(Step::new(id, Lookup("A7"))))
        .await
        .unwrap_err();
    let err = err
        .downcast::<tower_once_step::StepError<std::io::Error>>()
        .unwrap();
    assert!(err.is_in_progress(), "{err:?}");
    assert!(
        Instant::now() <= deadline.instant(),
        "gave up {:?} after the deadline (the default max_wait is 60 s)",
        Instant::now() - deadline.instant()
    );
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn without_a_deadline_a_waiter_gives_up_after_max_wait() {
    let (calls, refunds) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new())
        .max_wait(Duration::from_secs(5))
        .layer(refunds);
    let id = refund_id();
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), post("1"))));
    tokio::task::yield_now().await;

    let start = Instant::now();
    let err = steps.oneshot(Step::new(id, post("1"))).await.unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert!(tower_once_core::unsent::Unsent::is_unsent(&err));
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_deadline_comes_before_a_dead_owners_lease_ends_sends_nothing() {
    let (calls, refunds) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(refunds); // lease 10 s
    let id = refund_id();
    kill_after(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("1")).keyed()),
        Duration::from_millis(5),
    )
    .await;
    assert_eq!(calls.load(SeqCst), 1);

    let deadline = Deadline::after(Duration::from_secs(3));
    let mut request = post("1");
    deadline.attach(&mut request);
    let err = steps
        .clone()
        .oneshot(Step::new(id.clone(), request).keyed())
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(Instant::now(), deadline.instant());
    assert_eq!(
        calls.load(SeqCst),
        1,
        "the dead owner's lease had not ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_looks_again_soon_after_the_owner_finishes() {
    // Looks 10 ms, doubling to a quarter of the lease: an owner that finishes after 100 ms is
    // seen well before the next lease ends.
    let lease = Duration::from_secs(8);
    let (calls, refunds) = slow_refunds(Duration::from_millis(100));
    let steps = StepLayer::new(MemoryStore::new())
        .lease(lease)
        .layer(refunds);
    let id = refund_id();
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), post("1"))));
    tokio::task::yield_now().await;

    let start = Instant::now();
    let out = steps.oneshot(Step::new(id, post("1"))).await.unwrap();
    assert!(out.is_replayed() && out.waited());
    assert!(
        start.elapsed() < Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    owner.await.unwrap().unwrap();
    assert_eq!(calls.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn deadline_call_on_a_step_bounds_the_wait_for_a_dead_owner() {
    // `Deadline::call`: "the way a caller gives a call its deadline": the step (a `Carrier`)
    // carries it on its request and the call runs in its scope. Shorter than the dead owner's
    // lease: nothing sent, in progress at the deadline; a later call whose deadline reaches
    // past the lease takes the step over (keyed: sent again with its key).
    let (calls, refunds) = support::first_calls_hang(1);
    let mut steps = StepLayer::new(MemoryStore::new()).layer(refunds); // lease 10 s
    let id = refund_id();
    kill_after(
        steps
            .clone()
            .oneshot(Step::new(id.clone(), post("1")).keyed()),
        Duration::from_millis(5),
    )
    .await;

    let deadline = Deadline::after(Duration::from_secs(3));
    let step = Step::new(id.clone(), post("1")).keyed();
    let err = deadline
        .call(steps.ready().await.unwrap(), step)
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(Instant::now(), deadline.instant());
    assert_eq!(calls.load(SeqCst), 1);

    let deadline = Deadline::after(Duration::from_secs(30));
    let step = Step::new(id, post("1")).keyed();
    let out = deadline
        .call(steps.ready().await.unwrap(), step)
        .await
        .unwrap();
    assert!(out.waited() && out.is_recorded());
    assert!(Instant::now() < deadline.instant());
    assert_eq!(calls.load(SeqCst), 2, "taken over once the lease ended");
}

#[tokio::test(start_paused = true)]
async fn deadline_call_on_a_step_without_extensions_bounds_the_wait_in_scope() {
    // A request type of the caller's own carries nothing: `Deadline::call` puts the deadline
    // in scope, and that bounds the wait, behind a `Buffer` too.
    let (calls, lookups) = hanging_refunds();
    let steps = StepLayer::new(MemoryStore::new()).layer(lookups);
    let id = StepId::new("run-1", 2, "lookup");
    let owner = tokio::spawn(steps.clone().oneshot(Step::new(id.clone(), Lookup("A7"))));
    tokio::task::yield_now().await;

    let mut direct = steps.clone();
    let deadline = Deadline::after(Duration::from_secs(2));
    let err = deadline
        .call(
            direct.ready().await.unwrap(),
            Step::new(id.clone(), Lookup("A7")),
        )
        .await
        .unwrap_err();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(Instant::now(), deadline.instant());

    let mut buffered = tower::buffer::Buffer::new(steps, 8);
    let deadline = Deadline::after(Duration::from_secs(2));
    let err = deadline
        .call(buffered.ready().await.unwrap(), Step::new(id, Lookup("A7")))
        .await
        .unwrap_err();
    let err = err
        .downcast::<tower_once_step::StepError<std::io::Error>>()
        .unwrap();
    assert!(err.is_in_progress(), "{err:?}");
    assert_eq!(Instant::now(), deadline.instant());
    assert_eq!(calls.load(SeqCst), 1);
    owner.abort();
}

#[tokio::test(start_paused = true)]
async fn deadline_call_on_a_step_carries_the_deadline_to_the_tool() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = std::sync::Arc::clone(&seen);
    let (calls, tool_) = support::tool(move |req: http::Request<String>, call| {
        record.lock().unwrap().push(Deadline::carried(&req));
        async move { Ok::<_, std::io::Error>(support::Refund { status: 201, call }) }
    });
    let mut steps = StepLayer::new(MemoryStore::new()).layer(tool_);
    let deadline = Deadline::after(Duration::from_secs(5));
    let step = Step::new(refund_id(), post("1")).keyed();
    let out = deadline
        .call(steps.ready().await.unwrap(), step)
        .await
        .unwrap();
    assert!(out.is_recorded());
    assert_eq!(*seen.lock().unwrap(), vec![Some(deadline)]);
    assert_eq!(calls.load(SeqCst), 1);
}
