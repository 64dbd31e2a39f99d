//! The `llm_failover` example (examples/README.md, facade crate docs "Client protection": retry and
//! a circuit breaker on the primary provider, fallback to the secondary, one deadline per request)
//! as a real process against two fake providers on loopback: an overloaded primary (`529`) opens
//! its circuit within tens of calls and every request is answered by the secondary; a hanging
//! primary is cut by the deadline's share and the secondary answers in time; a throttling primary
//! (`429` with `retry-after-ms`) is retried after the delay it asked for; a healthy primary answers
//! everything alone. Every test counts the calls each provider received and checks the example's
//! own counts against them.

mod support;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a fake provider answers its `n`th call (0 first).
#[derive(Clone, Copy)]
enum Behaviour {
    Ok,
    Overloaded,
    /// `429` with `retry-after-ms: 50` for the first `n` calls, then `200`.
    ThrottledFirst(u64),
    Hangs,
}

#[derive(Clone)]
struct Provider {
    calls: Arc<AtomicU64>,
    behaviour: Behaviour,
}

async fn messages(State(p): State<Provider>, body: String) -> Response {
    let n = p.calls.fetch_add(1, SeqCst);
    assert!(body.contains("\"prompt\""), "{body}");
    match p.behaviour {
        Behaviour::Ok => (StatusCode::OK, r#"{"completion":"hi"}"#).into_response(),
        Behaviour::Overloaded => (
            StatusCode::from_u16(529).unwrap(),
            r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
        )
            .into_response(),
        Behaviour::ThrottledFirst(k) if n < k => (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after-ms", "50")],
            "slow down",
        )
            .into_response(),
        Behaviour::ThrottledFirst(_) => (StatusCode::OK, r#"{"completion":"hi"}"#).into_response(),
        Behaviour::Hangs => std::future::pending().await,
    }
}

/// A fake provider on a loopback port: its base URL and its call count.
async fn provider(behaviour: Behaviour) -> (String, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .with_state(Provider {
            calls: calls.clone(),
            behaviour,
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), calls)
}

struct Run {
    ok: bool,
    lines: Vec<Value>,
    summary: Value,
    stderr: String,
    took: Duration,
}

async fn run(primary: &str, secondary: &str, extra: &[&str]) -> Run {
    let mut args = vec!["--primary", primary, "--secondary", secondary];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let output = Command::new(support::example_binary_with("llm_failover", "hyper-util"))
            .args(&args)
            .output()
            .expect("run llm_failover");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let mut lines: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let summary = lines.pop().expect("a summary line");
        Run {
            ok: output.status.success(),
            lines,
            summary,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            took: started.elapsed(),
        }
    })
    .await
    .unwrap()
}

fn count(lines: &[Value], provider: &str) -> usize {
    lines.iter().filter(|l| l["provider"] == provider).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_primary_opens_its_circuit_and_the_secondary_answers_everything() {
    let (primary, primary_calls) = provider(Behaviour::Overloaded).await;
    let (secondary, secondary_calls) = provider(Behaviour::Ok).await;
    let run = run(
        &primary,
        &secondary,
        &["--requests", "60", "--concurrency", "4"],
    )
    .await;
    assert!(run.ok, "{}\n{}", run.summary, run.stderr);
    assert_eq!(run.lines.len(), 60);
    assert_eq!(count(&run.lines, "secondary"), 60);
    assert!(run.lines.iter().all(|l| l["status"] == 200));
    assert_eq!(run.summary["ok"], 60);
    assert_eq!(run.summary["failed"], 0);
    // The example's counts are the providers'.
    assert_eq!(run.summary["primary_calls"], primary_calls.load(SeqCst));
    assert_eq!(run.summary["secondary_calls"], secondary_calls.load(SeqCst));
    assert_eq!(secondary_calls.load(SeqCst), 60);
    // The circuit opened within tens of requests: without it, 60 requests × 3 attempts.
    assert!(
        run.summary["breaker_opens"].as_u64().unwrap() >= 1,
        "{}",
        run.stderr
    );
    let sent = primary_calls.load(SeqCst);
    assert!(sent <= 25 * 3, "{sent} calls to the overloaded primary");
    // Once open, requests go straight to the secondary: one call each.
    let straight = run.lines.iter().filter(|l| l["attempts"] == 1).count();
    assert!(
        straight >= 60 - 25,
        "{straight} of 60 went straight to the secondary"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_primary_is_cut_and_the_secondary_answers_within_the_deadline() {
    let (primary, primary_calls) = provider(Behaviour::Hangs).await;
    let (secondary, secondary_calls) = provider(Behaviour::Ok).await;
    let run = run(
        &primary,
        &secondary,
        &[
            "--requests",
            "4",
            "--concurrency",
            "4",
            "--deadline-ms",
            "2000",
        ],
    )
    .await;
    assert!(run.ok, "{}\n{}", run.summary, run.stderr);
    assert_eq!(count(&run.lines, "secondary"), 4);
    for line in &run.lines {
        let ms = line["ms"].as_u64().unwrap();
        assert!(
            (1_000..2_000).contains(&ms),
            "cut at 60 % of the deadline, answered before it: {line}"
        );
    }
    assert_eq!(secondary_calls.load(SeqCst), 4);
    // Each request: attempts cut at a quarter of the deadline, within 60 % of it.
    assert!((4..=12).contains(&primary_calls.load(SeqCst)));
    assert!(run.took < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_primary_is_retried_after_the_delay_it_asked_for() {
    let (primary, primary_calls) = provider(Behaviour::ThrottledFirst(2)).await;
    let (secondary, secondary_calls) = provider(Behaviour::Ok).await;
    let run = run(&primary, &secondary, &["--requests", "1"]).await;
    assert!(run.ok, "{}\n{}", run.summary, run.stderr);
    let line = &run.lines[0];
    assert_eq!(line["provider"], "primary");
    assert_eq!(line["attempts"], 3, "{line}");
    assert!(
        line["ms"].as_u64().unwrap() >= 100,
        "two waits of 50 ms: {line}"
    );
    assert_eq!(primary_calls.load(SeqCst), 3);
    assert_eq!(secondary_calls.load(SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_primary_answers_alone() {
    let (primary, primary_calls) = provider(Behaviour::Ok).await;
    let (secondary, secondary_calls) = provider(Behaviour::Ok).await;
    let run = run(
        &primary,
        &secondary,
        &["--requests", "30", "--concurrency", "8"],
    )
    .await;
    assert!(run.ok, "{}\n{}", run.summary, run.stderr);
    assert_eq!(count(&run.lines, "primary"), 30);
    assert_eq!(run.summary["breaker_opens"], 0);
    assert_eq!(primary_calls.load(SeqCst), 30);
    assert_eq!(secondary_calls.load(SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_providers_down_fails_with_exit_status_one_and_says_so() {
    let (primary, _) = provider(Behaviour::Overloaded).await;
    let (secondary, secondary_calls) = provider(Behaviour::Overloaded).await;
    let run = run(
        &primary,
        &secondary,
        &["--requests", "2", "--deadline-ms", "3000"],
    )
    .await;
    assert!(!run.ok);
    assert_eq!(run.summary["failed"], 2);
    assert!(run.lines.iter().all(|l| l["provider"].is_null()));
    assert!(
        run.lines.iter().all(|l| l["status"] == 529),
        "{:?}",
        run.lines
    );
    assert_eq!(
        secondary_calls.load(SeqCst),
        2 * 3,
        "the secondary's retries"
    );
}

/// The example as a process, killed after `limit`: `None` if it had not exited by then.
async fn run_bounded(
    args: Vec<std::ffi::OsString>,
    limit: Duration,
) -> Option<std::process::Output> {
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(support::example_binary_with("llm_failover", "hyper-util"))
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run llm_failover");
        let started = Instant::now();
        loop {
            if child.try_wait().unwrap().is_some() {
                return Some(child.wait_with_output().unwrap());
            }
            if started.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(Into::into).collect()
}

/// A provider answering `200` to any path, recording the paths it was asked for.
async fn recording_provider() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let paths = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = paths.clone();
    let app = Router::new().fallback(move |uri: axum::http::Uri| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(uri.path().to_owned());
            (StatusCode::OK, r#"{"completion":"hi"}"#)
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), paths)
}

/// "One deadline per request": a primary that answers `200` at once, then stalls its body
/// forever (a stream that never ends, a provider stuck mid-completion). The example reads
/// the completion; with a 1 s deadline, the run must end (the request failed, or answered by
/// the secondary) within seconds, not hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_200_body_stalls_is_cut_by_the_deadline() {
    struct Stalls(bool);
    impl http_body::Body for Stalls {
        type Data = bytes::Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>>
        {
            if std::mem::replace(&mut self.0, true) {
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
                b"{\"completion\":\"h",
            )))))
        }
    }
    let app = Router::new().route(
        "/v1/messages",
        post(|| async { Response::new(axum::body::Body::new(Stalls(false))) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let primary = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let (secondary, _) = provider(Behaviour::Ok).await;
    let out = run_bounded(
        os(&[
            "--primary",
            &primary,
            "--secondary",
            &secondary,
            "--requests",
            "1",
            "--deadline-ms",
            "1000",
        ]),
        Duration::from_secs(15),
    )
    .await;
    assert!(
        out.is_some(),
        "still running 15 s after a request with a 1 s deadline: the body read is unbounded"
    );
}

/// "Each request is `POST {provider}/v1/messages`": a primary given with a path prefix (a
/// gateway, `http://host/api`) is asked for `/api/v1/messages`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_url_with_a_path_is_posted_under_it() {
    let (base, paths) = recording_provider().await;
    let (secondary, secondary_calls) = provider(Behaviour::Ok).await;
    let run = run(&format!("{base}/api"), &secondary, &["--requests", "1"]).await;
    assert_eq!(
        *paths.lock().unwrap(),
        ["/api/v1/messages"],
        "{}\n{}",
        run.summary,
        run.stderr
    );
    assert!(run.ok);
    assert_eq!(secondary_calls.load(SeqCst), 0);
}

/// The secondary's own path prefix is kept: with the primary down (`529`), the request goes
/// to `{secondary}/v1/messages`, `/llm/v1/messages` here, not to the primary's path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_url_with_a_path_is_posted_under_it() {
    let (primary, _) = provider(Behaviour::Overloaded).await;
    let (base, paths) = recording_provider().await;
    let run = run(
        &primary,
        &format!("{base}/llm"),
        &["--requests", "1", "--deadline-ms", "2000"],
    )
    .await;
    assert_eq!(
        *paths.lock().unwrap(),
        ["/llm/v1/messages"],
        "{}\n{}",
        run.summary,
        run.stderr
    );
    assert!(run.ok);
}

/// "2 on bad arguments", never a panic: an argument that is not UTF-8 (a byte string from a
/// shell script) must get the usage message and exit status 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_that_is_not_utf8_exits_2_without_a_panic() {
    use std::os::unix::ffi::OsStringExt;
    let mut args = os(&["--primary", "http://127.0.0.1:1", "--secondary"]);
    args.push(std::ffi::OsString::from_vec(
        b"http://127.0.0.1:2/\xff".to_vec(),
    ));
    let out = run_bounded(args, Duration::from_secs(15)).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
}

/// "2 on bad arguments": each ordinary mistake gets a message on stderr and exit status 2,
/// never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_exit_2_with_a_message() {
    let p = [
        "--primary",
        "http://127.0.0.1:1",
        "--secondary",
        "http://127.0.0.1:2",
    ];
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["--primary", "http://127.0.0.1:1"],
        vec!["--primary", "ftp://x", "--secondary", "http://127.0.0.1:2"],
        vec![
            "--primary",
            "127.0.0.1:1",
            "--secondary",
            "http://127.0.0.1:2",
        ],
        vec!["--primary", "http://", "--secondary", "http://127.0.0.1:2"],
        [&p[..], &["--requests", "-1"]].concat(),
        [&p[..], &["--requests", "99999999999"]].concat(),
        [&p[..], &["--requests"]].concat(),
        [&p[..], &["--concurrency", "0"]].concat(),
        [&p[..], &["--concurrency", "100000"]].concat(),
        [&p[..], &["--deadline-ms", "1e3"]].concat(),
        [&p[..], &["--bogus"]].concat(),
    ];
    for case in cases {
        let out = run_bounded(os(&case), Duration::from_secs(15))
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{case:?}: {stderr}");
        assert!(
            !stderr.trim().is_empty() && !stderr.contains("panicked"),
            "{case:?}: {stderr}"
        );
    }
}

/// `--requests 0`: nothing to do, a summary of zeros, exit 0; a trailing slash on the URLs
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_requests_and_trailing_slashes() {
    let (primary, primary_calls) = provider(Behaviour::Ok).await;
    let (secondary, _) = provider(Behaviour::Ok).await;
    let run0 = run(&primary, &secondary, &["--requests", "0"]).await;
    assert!(run0.ok, "{}", run0.stderr);
    assert_eq!(run0.summary["ok"], 0);
    assert_eq!(run0.summary["primary_calls"], 0);
    let run1 = run(
        &format!("{primary}/"),
        &format!("{secondary}/"),
        &["--requests", "2"],
    )
    .await;
    assert!(run1.ok, "{}\n{}", run1.summary, run1.stderr);
    assert_eq!(primary_calls.load(SeqCst), 2);
}

/// A secondary that hangs while the primary is overloaded: every request fails within its
/// deadline and the run exits 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_secondary_is_cut_at_the_deadline() {
    let (primary, _) = provider(Behaviour::Overloaded).await;
    let (secondary, _) = provider(Behaviour::Hangs).await;
    let run = run(
        &primary,
        &secondary,
        &["--requests", "3", "--deadline-ms", "1000"],
    )
    .await;
    assert!(!run.ok);
    assert_eq!(run.summary["failed"], 3);
    assert!(run.took < Duration::from_secs(8), "{:?}", run.took);
    for line in &run.lines {
        assert!(line["ms"].as_u64().unwrap() < 1_500, "{line}");
    }
}
