//! What the benches that time rounds report with: the one median (the mean of the two middle
//! values for an even count), the median of per-round ratios, and a Markdown table printer.
//!
//! Included by each bench that uses it (`#[path = "support/report.rs"] mod report;`); a bench
//! uses only part of it, hence `dead_code` is allowed here.

#![allow(dead_code)]

/// The median of `values`: the middle one, or the mean of the two middle ones for an even count.
///
/// # Panics
///
/// If `values` is empty.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.into_iter().collect();
    assert!(!values.is_empty(), "the median of no values");
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// The median of the per-round ratios `numerators[i] / denominators[i]`: rounds are interleaved,
/// so a noisy moment slows both sides of a round alike.
///
/// # Panics
///
/// If the two have different lengths, or are empty.
pub(crate) fn median_ratio(numerators: &[f64], denominators: &[f64]) -> f64 {
    assert_eq!(
        numerators.len(),
        denominators.len(),
        "one denominator per round"
    );
    median(numerators.iter().zip(denominators).map(|(n, d)| n / d))
}

/// A Markdown table printed as it goes: the header on [`new`](Self::new), a line per
/// [`row`](Self::row).
pub(crate) struct Table {
    columns: usize,
}

impl Table {
    /// Prints the header and the separator line.
    pub(crate) fn new(header: &[&str]) -> Self {
        println!("| {} |", header.join(" | "));
        println!("|{}", "---|".repeat(header.len()));
        Self {
            columns: header.len(),
        }
    }

    /// Prints one row.
    ///
    /// # Panics
    ///
    /// If it has not one cell per column.
    pub(crate) fn row<S: AsRef<str>>(&self, cells: &[S]) {
        assert_eq!(cells.len(), self.columns, "one cell per column");
        let cells: Vec<&str> = cells.iter().map(AsRef::as_ref).collect();
        println!("| {} |", cells.join(" | "));
    }
}
