//! The declared rows: what each one sends, through which store, and which ratios the table
//! prints. `main` iterates over these; nothing else names a row.

use crate::server;

/// Where a row's requests are answered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Store {
    /// The bare handler, no layer.
    None,
    /// `IdempotencyLayer` on the default memory store.
    Memory,
    /// `IdempotencyLayer` on `RedisStore`.
    Redis,
    /// `IdempotencyLayer` on `PostgresStore` (the handler writes nothing to the database: the
    /// layer completes the record).
    Postgres,
}

/// The stores behind the layer, each of which the replay keys are completed on.
pub(crate) const COVERED: &[Store] = &[Store::Memory, Store::Redis, Store::Postgres];

/// What a row sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Mode {
    /// HTTP requests, a new `Idempotency-Key` each.
    Fresh,
    /// HTTP requests cycling over keys completed before the first round; each answer must carry
    /// `Idempotent-Replayed`.
    Replay,
    /// No HTTP: the Redis store's claim script sent directly on those completed records, as the
    /// store sends it for a replay.
    ClaimScript,
}

/// One line of the table.
#[derive(Debug)]
pub(crate) struct Row {
    /// Its name for `LOAD_PROFILE`.
    pub(crate) name: &'static str,
    /// Its label in the table.
    pub(crate) label: &'static str,
    pub(crate) store: Store,
    pub(crate) mode: Mode,
}

impl Row {
    /// The route its HTTP requests go to.
    pub(crate) fn path(&self) -> &'static str {
        server::path(self.store)
    }

    /// Whether every expected answer is a replay.
    pub(crate) fn replays(&self) -> bool {
        self.mode == Mode::Replay
    }

    /// Whether it sends HTTP requests (and so has a ratio to the bare handler).
    pub(crate) fn over_http(&self) -> bool {
        self.mode != Mode::ClaimScript
    }
}

/// The rows, in the order each round runs them (interleaved, so a noisy moment hurts a whole
/// round rather than one row).
pub(crate) const ROWS: &[Row] = &[
    Row {
        name: "bare",
        label: "bare handler",
        store: Store::None,
        mode: Mode::Fresh,
    },
    Row {
        name: "memory_fresh",
        label: "memory store, fresh key",
        store: Store::Memory,
        mode: Mode::Fresh,
    },
    Row {
        name: "memory_replay",
        label: "memory store, replay",
        store: Store::Memory,
        mode: Mode::Replay,
    },
    Row {
        name: "redis_fresh",
        label: "Redis store, fresh key",
        store: Store::Redis,
        mode: Mode::Fresh,
    },
    Row {
        name: "redis_replay",
        label: "Redis store, replay",
        store: Store::Redis,
        mode: Mode::Replay,
    },
    Row {
        name: "postgres_fresh",
        label: "Postgres store, fresh key",
        store: Store::Postgres,
        mode: Mode::Fresh,
    },
    Row {
        name: "postgres_replay",
        label: "Postgres store, replay",
        store: Store::Postgres,
        mode: Mode::Replay,
    },
    Row {
        name: "raw_script",
        label: "claim script sent directly (no HTTP)",
        store: Store::Redis,
        mode: Mode::ClaimScript,
    },
];

/// The row the "ratio to bare" column divides every HTTP row by.
pub(crate) const BASELINE: &str = "bare";

/// A ratio printed under the table: the median of `row`'s per-round rates over `against`'s.
#[derive(Debug)]
pub(crate) struct Comparison {
    pub(crate) row: &'static str,
    pub(crate) against: &'static str,
    pub(crate) label: &'static str,
    /// What to read it against.
    pub(crate) note: &'static str,
}

pub(crate) const COMPARISONS: &[Comparison] = &[
    Comparison {
        row: "redis_replay",
        against: "raw_script",
        label: "Redis store replay / claim script sent directly, same concurrency",
        note: "goal ≥ 0.90",
    },
    Comparison {
        row: "bare",
        against: "raw_script",
        label: "bare handler / claim script",
        note: "what HTTP alone leaves on this machine",
    },
];

/// The row named `name`.
///
/// # Panics
///
/// If there is none: a comparison or `BASELINE` names a row that is not declared.
pub(crate) fn named(name: &str) -> &'static Row {
    ROWS.iter()
        .find(|row| row.name == name)
        .unwrap_or_else(|| panic!("no row named {name}; the rows are {:?}", names()))
}

/// Every row's name.
pub(crate) fn names() -> Vec<&'static str> {
    ROWS.iter().map(|row| row.name).collect()
}
