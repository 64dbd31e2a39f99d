//! The rounds' samples, by row, and the table printed from them.

use crate::report::{median, median_ratio, Table};
use crate::rows::{self, Route, Row, ROWS};
use crate::usage::PerRequest;

/// What one round of one row measured.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) per_sec: f64,
    pub(crate) unexpected: u64,
    pub(crate) usage: PerRequest,
}

/// Every row's samples, one per round, and its counted round trips, in the order of [`ROWS`].
#[derive(Debug, Default)]
pub(crate) struct Results {
    samples: Vec<Vec<Sample>>,
    round_trips: Vec<Option<f64>>,
}

fn index(row: &Row) -> usize {
    ROWS.iter()
        .position(|r| r.name == row.name)
        .expect("every row is declared in ROWS")
}

impl Results {
    pub(crate) fn new() -> Self {
        Self {
            samples: ROWS.iter().map(|_| Vec::new()).collect(),
            round_trips: vec![None; ROWS.len()],
        }
    }

    pub(crate) fn push(&mut self, row: &Row, sample: Sample) {
        self.samples[index(row)].push(sample);
    }

    pub(crate) fn set_round_trips(&mut self, row: &Row, per_request: f64) {
        self.round_trips[index(row)] = Some(per_request);
    }

    fn rates(&self, row: &Row) -> Vec<f64> {
        self.samples[index(row)].iter().map(|s| s.per_sec).collect()
    }

    /// Prints the table.
    pub(crate) fn print(&self) {
        println!();
        let table = Table::new(&[
            "row",
            "req/s, median",
            "rounds",
            "ratio to peer",
            "goal",
            "Postgres round trips/req",
            "WAL bytes/req",
            "bench CPU µs/req",
            "Postgres backends CPU µs/req",
            "Redis round trips/req",
            "redis-server CPU µs/req",
            "answers not as expected",
        ]);
        for row in ROWS {
            let samples = &self.samples[index(row)];
            let rates = self.rates(row);
            let ratio = row.peer.map(|peer| {
                let peer = rows::named(peer);
                (median_ratio(&rates, &self.rates(peer)), peer.name)
            });
            let goal = match (row.goal, ratio) {
                (Some(goal), Some((ratio, _))) => format!(
                    "≥ {goal:.2}: {}",
                    if ratio >= goal { "met" } else { "not met" }
                ),
                _ => "–".to_owned(),
            };
            let redis = |pick: fn(&PerRequest) -> Option<f64>, digits: usize| {
                if row.route == Route::Redis {
                    usage(samples, pick, digits)
                } else {
                    "–".to_owned()
                }
            };
            table.row(&[
                format!("{} [`{}`]", row.label, row.name),
                rate(median(rates.iter().copied())),
                rates
                    .iter()
                    .copied()
                    .map(rate)
                    .collect::<Vec<_>>()
                    .join(", "),
                ratio.map_or_else(
                    || "(peer)".to_owned(),
                    |(ratio, peer)| format!("{ratio:.2} (of `{peer}`)"),
                ),
                goal,
                self.round_trips[index(row)].map_or_else(|| "?".to_owned(), |n| format!("{n:.1}")),
                usage(samples, |u| u.wal_bytes, 0),
                usage(samples, |u| u.bench_cpu_us, 1),
                usage(samples, |u| u.postgres_cpu_us, 1),
                redis(|u| u.redis_scripts, 2),
                redis(|u| u.redis_cpu_us, 1),
                samples
                    .iter()
                    .map(|s| s.unexpected)
                    .sum::<u64>()
                    .to_string(),
            ]);
        }
        println!();
        println!(
            "Ratios are medians of per-round ratios; the other columns medians of the rounds. \
             WAL is the whole server's (an upper bound when anything else writes meanwhile); \
             round trips were counted on sequential requests before the rounds."
        );
    }
}

/// Requests per second, in thousands from 1000 up.
fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{:.2} k", per_sec / 1000.0)
    } else {
        format!("{per_sec:.0}")
    }
}

/// The median of one usage column, or `n/a` where a round could not read it.
fn usage(samples: &[Sample], pick: fn(&PerRequest) -> Option<f64>, digits: usize) -> String {
    match samples
        .iter()
        .map(|s| pick(&s.usage))
        .collect::<Option<Vec<f64>>>()
    {
        Some(values) if !values.is_empty() => format!("{:.digits$}", median(values)),
        _ => "n/a".to_owned(),
    }
}
