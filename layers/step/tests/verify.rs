//! The verify hook (crate docs, "Unknown outcomes" and the table's rows for an earlier attempt
//! sent and never recorded): a call that may not be sent twice and whose outcome is unknown is
//! looked up downstream first. Found: its result is recorded and nothing is sent. Not found:
//! the call is sent. Cannot tell: recorded unknown, never sent again. Paused time, memory store,
//! effects counted. And hooks that go wrong: one that panics, one slower than the lease, one that
//! finds a result the codec cannot keep, one whose "not happened" is followed by a crash.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tower::{Layer, ServiceExt};
use tower_once_idempotency::store::MemoryStore;
use tower_once_step::{Step, StepId, StepLayer, StepRequest, Verified};

/// A note the downstream creates when the request arrives, before it answers.
struct Note(&'static str);

impl StepRequest for Note {}

/// The notes service: creates the note at once, then answers after `delay` (so a caller
/// with a shorter timeout never learns the outcome).
#[derive(Clone, Default)]
struct Notes {
    created: Arc<Mutex<Vec<String>>>,
    calls: Arc<AtomicUsize>,
}

impl Notes {
    fn tool(
        &self,
        delay: Duration,
    ) -> impl tower::Service<Note, Response = String, Error = std::io::Error, Future = impl Send>
           + Clone
           + Send {
        let notes = self.clone();
        tower::service_fn(move |Note(text)| {
            let notes = notes.clone();
            async move {
                notes.calls.fetch_add(1, SeqCst);
                notes.created.lock().unwrap().push(text.to_owned());
                tokio::time::sleep(delay).await;
                Ok::<_, std::io::Error>(format!("note: {text}"))
            }
        })
    }

    /// What a downstream lookup finds: the note with this text, if it was created.
    fn find(&self, text: &str) -> Option<String> {
        let created = self.created.lock().unwrap();
        created
            .iter()
            .any(|n| n == text)
            .then(|| format!("note: {text}"))
    }
}

fn note(run: &str) -> Step<Note> {
    Step::new(StepId::new(run, 3, "note"), Note("refunded")).arguments("refunded")
}

#[tokio::test(start_paused = true)]
async fn a_call_that_timed_out_and_happened_is_recorded_from_the_lookup_and_never_sent_again() {
    let notes = Notes::default();
    let lookups = Arc::new(AtomicUsize::new(0));
    let (finder, counted) = (notes.clone(), Arc::clone(&lookups));
    let steps = StepLayer::new(MemoryStore::new())
        .verify(move |_: &StepId, _: SystemTime| {
            counted.fetch_add(1, SeqCst);
            let found = finder.find("refunded");
            async move { found.map_or(Verified::NotHappened, Verified::Happened) }
        })
        .layer(tower::timeout::Timeout::new(
            notes.tool(Duration::from_secs(5)),
            Duration::from_secs(1),
        ));
    let first = steps.clone().oneshot(note("run-1")).await.unwrap();
    assert!(first.is_verified() && first.is_recorded(), "{first:?}");
    assert_eq!(first.value(), "note: refunded");
    let again = steps.oneshot(note("run-1")).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(notes.calls.load(SeqCst), 1, "sent once");
    assert_eq!(lookups.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_call_that_timed_out_and_did_not_happen_is_sent_by_the_next_attempt() {
    let notes = Notes::default();
    let steps = StepLayer::new(MemoryStore::new())
        .verify(|_: &StepId, _: SystemTime| async { Verified::<String>::NotHappened })
        .layer(tower::timeout::Timeout::new(
            notes.tool(Duration::from_secs(5)),
            Duration::from_secs(1),
        ));
    let failed = steps.clone().oneshot(note("run-2")).await.unwrap_err();
    assert!(
        failed.is_inner(),
        "the call failed and did not happen: {failed}"
    );
    assert_eq!(notes.calls.load(SeqCst), 1);
    // Sent again: the lookup said the first one did not happen.
    let _ = steps.oneshot(note("run-2")).await;
    assert_eq!(notes.calls.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_dead_owners_call_is_looked_up_by_the_next_owner_before_anything_is_sent() {
    let notes = Notes::default();
    let finder = notes.clone();
    let store = MemoryStore::new();
    let lease = Duration::from_secs(2);
    // The first owner is cut off while its call runs (its future dropped, as a killed
    // process's would stop): the note was created, nothing was recorded.
    let hanging = StepLayer::new(store.clone())
        .lease(lease)
        .layer(notes.tool(Duration::from_secs(3600)));
    let cut = tokio::time::timeout(Duration::from_secs(1), hanging.oneshot(note("run-3"))).await;
    assert!(cut.is_err(), "cut off mid-call");
    assert_eq!(notes.calls.load(SeqCst), 1);

    let steps = StepLayer::new(store)
        .lease(lease)
        .verify(move |_: &StepId, _: SystemTime| {
            let found = finder.find("refunded");
            async move { found.map_or(Verified::NotHappened, Verified::Happened) }
        })
        .layer(notes.tool(Duration::ZERO));
    let settled = steps.clone().oneshot(note("run-3")).await.unwrap();
    assert!(settled.is_verified(), "{settled:?}");
    assert_eq!(notes.calls.load(SeqCst), 1, "never sent twice");
    assert!(steps.oneshot(note("run-3")).await.unwrap().is_replayed());
}

#[tokio::test(start_paused = true)]
async fn without_a_hook_or_when_it_cannot_tell_the_outcome_is_recorded_unknown() {
    let notes = Notes::default();
    let steps = StepLayer::new(MemoryStore::new())
        .verify(|_: &StepId, _: SystemTime| async { Verified::<String>::Unknown })
        .layer(tower::timeout::Timeout::new(
            notes.tool(Duration::from_secs(5)),
            Duration::from_secs(1),
        ));
    let unknown = steps.clone().oneshot(note("run-4")).await.unwrap_err();
    assert!(unknown.is_unknown(), "{unknown}");
    assert!(unknown.sent_at().is_some());
    assert_eq!(
        unknown.idempotency_key(),
        Some(StepId::new("run-4", 3, "note").idempotency_key().as_str())
    );
    let again = steps.oneshot(note("run-4")).await.unwrap_err();
    assert!(again.is_unknown(), "recorded: {again}");
    assert_eq!(notes.calls.load(SeqCst), 1, "never sent twice");
}

const LEASE: Duration = Duration::from_secs(2);

/// A hook that gives `answers` in turn (the last one after that), counting its calls.
fn scripted(
    answers: Vec<Verified<String>>,
) -> (
    Arc<AtomicUsize>,
    impl Fn(&StepId, SystemTime) -> std::future::Ready<Verified<String>> + Clone,
) {
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&asked);
    let hook = move |_: &StepId, _: SystemTime| {
        let n = counted.fetch_add(1, SeqCst);
        std::future::ready(answers[n.min(answers.len() - 1)].clone())
    };
    (asked, hook)
}

#[tokio::test(start_paused = true)]
async fn a_verify_hook_that_panics_sends_nothing_and_the_next_attempt_asks_again() {
    let notes = Notes::default();
    let (finder, panicked_once) = (notes.clone(), Arc::new(AtomicUsize::new(0)));
    let first = Arc::clone(&panicked_once);
    let steps = StepLayer::new(MemoryStore::new())
        .verify(move |_: &StepId, _: SystemTime| {
            if first.fetch_add(1, SeqCst) == 0 {
                panic!("the lookup's client panicked");
            }
            let found = finder.find("refunded");
            async move { found.map_or(Verified::NotHappened, Verified::Happened) }
        })
        .layer(tower::timeout::Timeout::new(
            notes.tool(Duration::from_secs(5)),
            Duration::from_secs(1),
        ));
    let panicked = tokio::spawn(steps.clone().oneshot(note("run-5")))
        .await
        .unwrap_err();
    assert!(panicked.is_panic());
    support::settle().await;

    let start = tokio::time::Instant::now();
    let settled = steps.clone().oneshot(note("run-5")).await.unwrap();
    assert!(settled.is_verified(), "{settled:?}");
    assert_eq!(start.elapsed(), Duration::ZERO, "released by the panic");
    assert!(steps.oneshot(note("run-5")).await.unwrap().is_replayed());
    assert_eq!(notes.calls.load(SeqCst), 1, "never sent twice");
    assert_eq!(panicked_once.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_lookup_slower_than_the_lease_keeps_the_step_and_a_second_owner_waits() {
    // Crate docs: "in progress elsewhere (task, process, replica) | waits ... until it is done,
    // its owner's lease ends" and the lease is "renewed every third of it" while the owner
    // works. A dead owner's call is looked up by the next owner; the lookup (an HTTP search
    // with its own retries) takes longer than the lease. The lease is not renewed while the
    // hook runs, so a third attempt takes the step over, asks too, and both send the call.
    let notes = Notes::default();
    let (asking, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (now_asking, at_most) = (Arc::clone(&asking), Arc::clone(&most));
    let store = MemoryStore::new();
    let dead = StepLayer::new(store.clone())
        .lease(LEASE)
        .layer(notes.tool(Duration::from_secs(3600)));
    support::kill_after(dead.oneshot(note("run-6")), Duration::from_millis(10)).await;
    assert_eq!(notes.calls.load(SeqCst), 1, "the dead owner sent it");

    // The downstream has no such note (the dead owner's request never arrived, say).
    let steps = StepLayer::new(store)
        .lease(LEASE)
        .verify(move |_: &StepId, _: SystemTime| {
            let (now_asking, at_most) = (Arc::clone(&now_asking), Arc::clone(&at_most));
            async move {
                let n = now_asking.fetch_add(1, SeqCst) + 1;
                at_most.fetch_max(n, SeqCst);
                tokio::time::sleep(LEASE + Duration::from_secs(1)).await;
                now_asking.fetch_sub(1, SeqCst);
                Verified::<String>::NotHappened
            }
        })
        .layer(notes.tool(Duration::ZERO));
    let second = tokio::spawn(steps.clone().oneshot(note("run-6")));
    // The second owner takes the step at the dead owner's lease end (2 s) and asks until 5 s.
    tokio::time::sleep(LEASE + Duration::from_millis(2500)).await;
    let third = tokio::spawn(steps.clone().oneshot(note("run-6")));
    let (second, third) = (second.await.unwrap(), third.await.unwrap());
    assert_eq!(
        most.load(SeqCst),
        1,
        "two owners asked at once, and the call was sent {} times in all (second: {second:?}, \
         third: {third:?}: neither could record, its claim had lapsed while it asked)",
        notes.calls.load(SeqCst)
    );
    assert_eq!(notes.calls.load(SeqCst), 2, "sent again once, by one owner");
}

#[tokio::test(start_paused = true)]
async fn a_found_result_the_codec_cannot_keep_is_not_recorded_and_never_sent() {
    // `Verified::Happened`: "recorded as the step's result, nothing sent"; `Json`: a value
    // whose JSON does not read back is refused. The lookup finds the call with a NaN in it:
    // nothing can be recorded, and the call must still never be sent again.
    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Score {
        ratio: f64,
    }
    let (calls, scorer) = support::tool(|_: support::Lookup, _| async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok::<_, std::io::Error>(Score { ratio: 0.5 })
    });
    let lookups = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&lookups);
    let steps = StepLayer::new(MemoryStore::new())
        .verify(move |_: &StepId, _: SystemTime| {
            counted.fetch_add(1, SeqCst);
            std::future::ready(Verified::Happened(Score { ratio: f64::NAN }))
        })
        .layer(tower::timeout::Timeout::new(scorer, Duration::from_secs(1)));
    let id = StepId::new("run-7", 1, "score");
    for _ in 0..3 {
        let out = steps
            .clone()
            .oneshot(Step::new(id.clone(), support::Lookup("A7")))
            .await
            .unwrap();
        assert!(!out.is_recorded(), "{out:?}");
        assert!(out.value().ratio.is_nan(), "the lookup's value is returned");
    }
    assert_eq!(calls.load(SeqCst), 1, "never sent twice");
    assert_eq!(lookups.load(SeqCst), 3, "each attempt asks again");
}

#[tokio::test(start_paused = true)]
async fn a_call_sent_again_after_a_lookup_and_then_killed_is_looked_up_again() {
    // "Not happened: it is sent" -- under the earlier attempt's mark, which stays: the owner
    // that sent it again is killed mid-call, and the next owner asks again rather than
    // sending it blindly a third time.
    let notes = Notes::default();
    let store = MemoryStore::new();
    let dead = StepLayer::new(store.clone())
        .lease(LEASE)
        .layer(notes.tool(Duration::from_secs(3600)));
    support::kill_after(
        dead.clone().oneshot(note("run-8")),
        Duration::from_millis(10),
    )
    .await;

    let (asked, hook) = scripted(vec![
        Verified::NotHappened,
        Verified::Happened("note: refunded".into()),
    ]);
    let hanging = StepLayer::new(store.clone())
        .lease(LEASE)
        .verify(hook.clone())
        .layer(notes.tool(Duration::from_secs(3600)));
    // Waits out the first owner's lease, hears "not happened", sends, and is killed.
    support::kill_after(
        hanging.oneshot(note("run-8")),
        LEASE + Duration::from_millis(500),
    )
    .await;
    assert_eq!(notes.calls.load(SeqCst), 2);

    let steps = StepLayer::new(store)
        .lease(LEASE)
        .verify(hook)
        .layer(notes.tool(Duration::ZERO));
    let settled = steps.clone().oneshot(note("run-8")).await.unwrap();
    assert!(settled.is_verified(), "{settled:?}");
    assert!(steps.oneshot(note("run-8")).await.unwrap().is_replayed());
    assert_eq!(notes.calls.load(SeqCst), 2, "never sent a third time");
    assert_eq!(asked.load(SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_step_that_waited_out_a_dead_owner_says_it_waited_when_the_lookup_settles_it() {
    // `StepOutput::waited`: "The step waited for another task, process or replica running
    // it." The next owner waits a whole lease for the dead one, then the lookup finds the call.
    let notes = Notes::default();
    let finder = notes.clone();
    let store = MemoryStore::new();
    let dead = StepLayer::new(store.clone())
        .lease(LEASE)
        .layer(notes.tool(Duration::from_secs(3600)));
    support::kill_after(dead.oneshot(note("run-9")), Duration::from_millis(10)).await;

    let steps = StepLayer::new(store)
        .lease(LEASE)
        .verify(move |_: &StepId, _: SystemTime| {
            let found = finder.find("refunded");
            async move { found.map_or(Verified::NotHappened, Verified::Happened) }
        })
        .layer(notes.tool(Duration::ZERO));
    let start = tokio::time::Instant::now();
    let settled = steps.oneshot(note("run-9")).await.unwrap();
    assert!(settled.is_verified(), "{settled:?}");
    assert!(
        start.elapsed() >= LEASE - Duration::from_millis(10),
        "it waited the lease"
    );
    assert!(
        settled.waited(),
        "waited {:?} for the dead owner, and says it did not",
        start.elapsed()
    );
    assert_eq!(notes.calls.load(SeqCst), 1);
}
