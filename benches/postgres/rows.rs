//! The declared rows: the route each one sends to, whether its keys are fresh or completed
//! beforehand, its peer and its goal. `main` iterates over these; nothing else names a row.

/// Where a row's requests are answered: one route of the app each (`app.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Route {
    /// No layer: the handler inserts its effect in a transaction, and nothing dedupes it.
    Effect,
    /// No layer, the hand-written dedupe: in one transaction the handler inserts its key
    /// (`INSERT ... ON CONFLICT DO NOTHING`, refusing a duplicate) and its effect.
    HandDedupe,
    /// No layer, the hand-written replay: the handler reads a stored response by its key (one
    /// primary-key `SELECT`) and answers it.
    HandSelect,
    /// The effect handler behind `IdempotencyLayer` on the default memory store.
    Memory,
    /// The effect handler behind `IdempotencyLayer` on `RedisStore`.
    Redis,
    /// The effect handler behind `IdempotencyLayer` on `PostgresStore`: the layer completes the
    /// record after the handler committed.
    PostgresPlain,
    /// `IdempotencyLayer` on `PostgresStore` over a handler that stores its response in its own
    /// transaction (`Claim::respond_in`): the layer writes nothing more.
    PostgresRespondIn,
    /// `IdempotencyLayer` on a transactional `PostgresStore`: the claim opens the handler's
    /// transaction, the handler inserts its effect on it, `Claim::commit` records and commits.
    PostgresTransactional,
}

/// The keys a row sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Keys {
    /// A new key per request.
    Fresh,
    /// Each task its own key, completed before the first round; every answer must be a replay.
    Replay,
}

/// One line of the table.
#[derive(Debug)]
pub(crate) struct Row {
    pub(crate) name: &'static str,
    pub(crate) label: &'static str,
    pub(crate) route: Route,
    pub(crate) keys: Keys,
    /// The row its rate is divided by (the median of the per-round ratios).
    pub(crate) peer: Option<&'static str>,
    /// The least ratio to the peer the goal asks for: reported, never asserted.
    pub(crate) goal: Option<f64>,
}

impl Row {
    /// Whether every expected answer is a replay.
    pub(crate) fn replays(&self) -> bool {
        self.keys == Keys::Replay
    }
}

/// The peer of the fresh rows.
const DEDUPE: &str = "hand_dedupe";
/// The peer of the replay rows.
const SELECT: &str = "hand_select";

/// The rows, in the order each round runs them (interleaved, so a noisy moment slows a whole
/// round rather than one row).
pub(crate) const ROWS: &[Row] = &[
    Row {
        name: "no_dedupe",
        label: "no layer, no dedupe: the effect in a transaction",
        route: Route::Effect,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: None,
    },
    Row {
        name: DEDUPE,
        label: "no layer: INSERT of the key ON CONFLICT DO NOTHING and the effect, one transaction",
        route: Route::HandDedupe,
        keys: Keys::Fresh,
        peer: None,
        goal: None,
    },
    Row {
        name: "postgres_respond_in",
        label: "PostgresStore, fresh key, `respond_in` in the handler's transaction",
        route: Route::PostgresRespondIn,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: Some(0.8),
    },
    Row {
        name: "postgres_transactional",
        label:
            "PostgresStore::transactional, fresh key: claim, effect and record in one transaction",
        route: Route::PostgresTransactional,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: Some(0.8),
    },
    Row {
        name: "postgres_plain",
        label: "PostgresStore, fresh key, the layer completes",
        route: Route::PostgresPlain,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: None,
    },
    Row {
        name: "memory_fresh",
        label: "memory store, fresh key (record not in the transaction)",
        route: Route::Memory,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: None,
    },
    Row {
        name: "redis_fresh",
        label: "Redis store, fresh key (record not in the transaction)",
        route: Route::Redis,
        keys: Keys::Fresh,
        peer: Some(DEDUPE),
        goal: None,
    },
    Row {
        name: SELECT,
        label: "no layer: primary-key SELECT of the stored response",
        route: Route::HandSelect,
        keys: Keys::Replay,
        peer: None,
        goal: None,
    },
    Row {
        name: "postgres_replay",
        label: "PostgresStore, replay",
        route: Route::PostgresRespondIn,
        keys: Keys::Replay,
        peer: Some(SELECT),
        goal: Some(0.9),
    },
    Row {
        name: "postgres_tx_replay",
        label: "PostgresStore::transactional, replay",
        route: Route::PostgresTransactional,
        keys: Keys::Replay,
        peer: Some(SELECT),
        goal: Some(0.9),
    },
    Row {
        name: "memory_replay",
        label: "memory store, replay",
        route: Route::Memory,
        keys: Keys::Replay,
        peer: Some(SELECT),
        goal: None,
    },
    Row {
        name: "redis_replay",
        label: "Redis store, replay",
        route: Route::Redis,
        keys: Keys::Replay,
        peer: Some(SELECT),
        goal: None,
    },
];

/// The routes whose replay keys are completed before the first round.
pub(crate) fn replayed_routes() -> Vec<Route> {
    let mut routes = Vec::new();
    for row in ROWS.iter().filter(|row| row.replays()) {
        if !routes.contains(&row.route) {
            routes.push(row.route);
        }
    }
    routes
}

/// The row named `name`.
///
/// # Panics
///
/// If there is none: a peer names a row that is not declared.
pub(crate) fn named(name: &str) -> &'static Row {
    ROWS.iter()
        .find(|row| row.name == name)
        .unwrap_or_else(|| panic!("no row named {name}; the rows are {:?}", names()))
}

/// Every row's name.
pub(crate) fn names() -> Vec<&'static str> {
    ROWS.iter().map(|row| row.name).collect()
}
