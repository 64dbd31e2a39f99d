//! The rounds' samples, by row, and the table printed from them.

use crate::report::{median, median_ratio, Table};
use crate::rows::{self, Row, BASELINE, COMPARISONS, ROWS};
use crate::runner::Sample;

/// Every row's samples, one per round, in the order of [`ROWS`].
#[derive(Debug)]
pub(crate) struct Results {
    rows: Vec<(&'static Row, Vec<Sample>)>,
}

impl Results {
    pub(crate) fn new() -> Self {
        Self {
            rows: ROWS.iter().map(|row| (row, Vec::new())).collect(),
        }
    }

    pub(crate) fn push(&mut self, row: &'static Row, sample: Sample) {
        let (_, samples) = self
            .rows
            .iter_mut()
            .find(|(r, _)| r.name == row.name)
            .expect("every row is declared in ROWS");
        samples.push(sample);
    }

    /// The per-round rates of the row named `name`.
    fn rates(&self, name: &str) -> Vec<f64> {
        let row = rows::named(name);
        let (_, samples) = self
            .rows
            .iter()
            .find(|(r, _)| r.name == row.name)
            .expect("every row is declared in ROWS");
        samples.iter().map(|s| s.per_sec).collect()
    }

    /// Prints the table, then the declared comparisons.
    pub(crate) fn print(&self) {
        let bare = self.rates(BASELINE);
        println!();
        let table = Table::new(&[
            "route",
            "req/s, median",
            "rounds",
            "ratio to bare",
            "server CPU µs/req",
            "load generator CPU µs/req",
            "redis-server CPU µs/req",
            "answers not as expected",
        ]);
        for (row, samples) in &self.rows {
            let rates: Vec<f64> = samples.iter().map(|s| s.per_sec).collect();
            let ratio = if row.over_http() {
                format!("{:.2}", median_ratio(&rates, &bare))
            } else {
                "–".to_owned()
            };
            let rounds: Vec<String> = rates.iter().copied().map(rate).collect();
            table.row(&[
                row.label.to_owned(),
                rate(median(rates.iter().copied())),
                rounds.join(", "),
                ratio,
                cpu(samples, |s| s.server_cpu_us),
                cpu(samples, |s| s.client_cpu_us),
                cpu(samples, |s| s.redis_cpu_us),
                samples
                    .iter()
                    .map(|s| s.unexpected)
                    .sum::<u64>()
                    .to_string(),
            ]);
        }
        let comparisons: Vec<String> = COMPARISONS
            .iter()
            .map(|c| {
                let ratio = median_ratio(&self.rates(c.row), &self.rates(c.against));
                format!("{}: {ratio:.2} ({})", c.label, c.note)
            })
            .collect();
        println!();
        println!("{}", comparisons.join("; "));
        println!(
            "Ratios are medians of per-round ratios. The load generator runs on the same cores as \
             the server (and redis-server): its CPU is part of every request's cost, which pulls \
             the ratios towards 1."
        );
    }
}

/// Requests per second, in thousands from 1000 up.
pub(crate) fn rate(per_sec: f64) -> String {
    if per_sec >= 1000.0 {
        format!("{:.1} k", per_sec / 1000.0)
    } else {
        format!("{per_sec:.0}")
    }
}

/// The median of one CPU column, or `n/a` where a round could not read it.
fn cpu(samples: &[Sample], pick: fn(&Sample) -> Option<f64>) -> String {
    match samples.iter().map(pick).collect::<Option<Vec<f64>>>() {
        Some(values) => format!("{:.1}", median(values)),
        None => "n/a".to_owned(),
    }
}
