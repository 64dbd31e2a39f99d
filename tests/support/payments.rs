//! A fake payments API for the agent example's tests, on a loopback port and a runtime of its
//! own (so the tests that drive the example as a process stay synchronous):
//!
//! - `GET /orders/{run}`: the order, no side effect;
//! - `POST /refunds` (`{"run", "amount"}`): honours `Idempotency-Key` as Stripe does: a key whose
//!   first request finished gets that request's stored status and body back (nothing applied), a
//!   key whose first request is still running gets `409`, a key sent again with another body gets
//!   `400`; the refund itself runs on a task of its own, so a client that gives up mid-request does
//!   not cancel it (it is applied all the same, as a real service would);
//! - `POST /notes` (`{"run", "text"}`): ignores `Idempotency-Key`: every request creates a note,
//!   on arrival, before any delay.
//!
//! Each tool's first request for a run can be delayed ([`Behaviour`]): a sleep, or a hang until
//! [`Payments::release`]. Every request is counted per run ([`RunLog`]), and anything the spec does
//! not allow (an unknown path, a body without its fields) is kept in [`Payments::unexpected`].

use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long a tool's first request for a run takes before it is answered.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) enum Delay {
    #[default]
    None,
    Sleep(Duration),
    /// Until [`Payments::release`].
    Hang,
}

/// The delays of each tool's first request per run (retries and other runs are answered at once).
#[derive(Clone, Debug, Default)]
pub(crate) struct Behaviour {
    pub(crate) lookup_first: Delay,
    pub(crate) refund_first: Delay,
    pub(crate) note_first: Delay,
    /// Only these runs' first requests are delayed; every run's when empty.
    pub(crate) only_runs: Vec<String>,
}

/// What the API received and did for one run.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunLog {
    /// `GET /orders/{run}` requests.
    pub(crate) lookups: u64,
    /// `POST /refunds` requests, replays and `409`s included.
    pub(crate) refund_requests: u64,
    /// The amount of each refund actually applied.
    pub(crate) refunds: Vec<u64>,
    /// The `Idempotency-Key` of every refund request, in arrival order.
    pub(crate) refund_keys: Vec<Option<String>>,
    /// The text of every note created (one per request: the service ignores keys).
    pub(crate) notes: Vec<String>,
}

#[derive(Default)]
struct Log {
    requests: u64,
    runs: HashMap<String, RunLog>,
    unexpected: Vec<String>,
    /// (tool, run) pairs whose first request arrived.
    arrived: HashSet<(&'static str, String)>,
    /// Refund keys: the first request's body, and its answer once it finished.
    keys: HashMap<String, (Value, Option<(u16, String)>)>,
    refund_ids: u64,
    note_ids: u64,
}

struct Api {
    log: Mutex<Log>,
    behaviour: Mutex<Behaviour>,
    released: watch::Sender<bool>,
}

impl Api {
    /// Counts the request and returns the delay it gets: a first arrival of `tool` for `run`.
    fn arrive(&self, tool: &'static str, run: &str, log: &mut Log) -> Delay {
        let first = log.arrived.insert((tool, run.to_owned()));
        let b = self.behaviour.lock().unwrap();
        if !first || !(b.only_runs.is_empty() || b.only_runs.iter().any(|r| r == run)) {
            return Delay::None;
        }
        match tool {
            "lookup" => b.lookup_first,
            "refund" => b.refund_first,
            _ => b.note_first,
        }
    }

    async fn delay(&self, delay: Delay) {
        match delay {
            Delay::None => {}
            Delay::Sleep(d) => tokio::time::sleep(d).await,
            Delay::Hang => {
                let mut released = self.released.subscribe();
                let _ = released.wait_for(|r| *r).await;
            }
        }
    }

    /// The body's `run` if it is JSON with a string `run` and `field` of the right kind.
    fn parse(&self, what: &str, body: &str, field: &str, log: &mut Log) -> Option<(String, Value)> {
        let v: Value = serde_json::from_str(body).ok()?;
        let ok = match field {
            "amount" => v[field].is_u64(),
            _ => v[field].is_string(),
        };
        match v["run"].as_str() {
            Some(run) if ok => Some((run.to_owned(), v.clone())),
            _ => {
                log.unexpected.push(format!("{what}: {body}"));
                None
            }
        }
    }
}

type Shared = State<Arc<Api>>;

async fn lookup(State(api): Shared, Path(run): Path<String>) -> Response {
    let delay = {
        let mut log = api.log.lock().unwrap();
        log.requests += 1;
        log.runs.entry(run.clone()).or_default().lookups += 1;
        api.arrive("lookup", &run, &mut log)
    };
    api.delay(delay).await;
    let order = json!({"order": run, "amount": 40, "currency": "eur", "status": "paid"});
    (StatusCode::OK, axum::Json(order)).into_response()
}

async fn refund(State(api): Shared, headers: HeaderMap, body: String) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (run, request, delay) = {
        let mut log = api.log.lock().unwrap();
        log.requests += 1;
        let Some((run, request)) = api.parse("POST /refunds", &body, "amount", &mut log) else {
            return StatusCode::BAD_REQUEST.into_response();
        };
        let entry = log.runs.entry(run.clone()).or_default();
        entry.refund_requests += 1;
        entry.refund_keys.push(key.clone());
        if let Some(key) = &key {
            match log.keys.get(key) {
                Some((first, _)) if *first != request => {
                    let error = "Keys for idempotent requests can only be used with the same \
                                 parameters they were first used with.";
                    return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": error})))
                        .into_response();
                }
                Some((_, Some((status, body)))) => {
                    let status = StatusCode::from_u16(*status).unwrap();
                    let replayed = [("idempotent-replayed", "true")];
                    return (status, replayed, body.clone()).into_response();
                }
                Some((_, None)) => return StatusCode::CONFLICT.into_response(),
                None => {
                    log.keys.insert(key.clone(), (request.clone(), None));
                }
            }
        }
        let delay = api.arrive("refund", &run, &mut log);
        (run, request, delay)
    };
    // The refund goes on even if the client stops waiting for it.
    let task = tokio::spawn({
        let api = api.clone();
        async move {
            api.delay(delay).await;
            let mut log = api.log.lock().unwrap();
            let amount = request["amount"].as_u64().unwrap();
            log.runs
                .entry(run.clone())
                .or_default()
                .refunds
                .push(amount);
            log.refund_ids += 1;
            let id = format!("re_{:06}", log.refund_ids);
            let answer = json!({"refund": id, "run": run, "amount": amount});
            let answer = (201, answer.to_string());
            if let Some(key) = key {
                log.keys.get_mut(&key).unwrap().1 = Some(answer.clone());
            }
            answer
        }
    });
    match task.await {
        Ok((status, body)) => (
            StatusCode::from_u16(status).unwrap(),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn note(State(api): Shared, body: String) -> Response {
    let (answer, delay) = {
        let mut log = api.log.lock().unwrap();
        log.requests += 1;
        let Some((run, request)) = api.parse("POST /notes", &body, "text", &mut log) else {
            return StatusCode::BAD_REQUEST.into_response();
        };
        let text = request["text"].as_str().unwrap().to_owned();
        log.runs.entry(run.clone()).or_default().notes.push(text);
        log.note_ids += 1;
        let answer = json!({"note": format!("nt_{:06}", log.note_ids), "run": run});
        (answer, api.arrive("note", &run, &mut log))
    };
    api.delay(delay).await;
    (StatusCode::CREATED, axum::Json(answer)).into_response()
}

async fn elsewhere(State(api): Shared, method: Method, uri: Uri) -> StatusCode {
    let mut log = api.log.lock().unwrap();
    log.requests += 1;
    log.unexpected.push(format!("{method} {uri}"));
    StatusCode::NOT_FOUND
}

/// The fake payments API, served until dropped.
pub(crate) struct Payments {
    api: Arc<Api>,
    url: String,
    _runtime: tokio::runtime::Runtime,
}

impl Payments {
    pub(crate) fn start(behaviour: Behaviour) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the fake payments API");
        let api = Arc::new(Api {
            log: Mutex::default(),
            behaviour: Mutex::new(behaviour),
            released: watch::Sender::new(false),
        });
        let app = Router::new()
            .route("/orders/{run}", get(lookup))
            .route("/refunds", post(refund))
            .route("/notes", post(note))
            .fallback(elsewhere)
            .with_state(api.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await
        });
        Self {
            api,
            url,
            _runtime: runtime,
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Changes the delays from now on (first arrivals already seen stay seen).
    pub(crate) fn set(&self, behaviour: Behaviour) {
        *self.api.behaviour.lock().unwrap() = behaviour;
    }

    /// Answers every request that hangs, and lets no later one hang.
    pub(crate) fn release(&self) {
        self.api.released.send_replace(true);
    }

    /// Every request received, on any path.
    pub(crate) fn requests(&self) -> u64 {
        self.api.log.lock().unwrap().requests
    }

    pub(crate) fn run(&self, run: &str) -> RunLog {
        let log = self.api.log.lock().unwrap();
        log.runs.get(run).cloned().unwrap_or_default()
    }

    /// Notes created, over all runs.
    pub(crate) fn notes(&self) -> usize {
        let log = self.api.log.lock().unwrap();
        log.runs.values().map(|r| r.notes.len()).sum()
    }

    /// Requests outside the spec: unknown paths, bodies without their fields.
    pub(crate) fn unexpected(&self) -> Vec<String> {
        self.api.log.lock().unwrap().unexpected.clone()
    }
}
