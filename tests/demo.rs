//! The main demo (examples/README.md "The main demo": its story and its table), run as a process
//! with a fixed seed: the story and the table add up.
#![cfg(feature = "retry")]

mod support;

use std::process::Command;

fn table_value(output: &str, label: &str) -> u64 {
    output
        .lines()
        .find(|l| l.starts_with(label))
        .and_then(|l| l[label.len()..].trim().parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} row in:\n{output}"))
}

#[test]
fn the_demo_charges_each_order_once_and_dead_letters_the_rest() {
    let output = Command::new(support::example_binary("demo"))
        .args(["--seed", "42"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the demo exits 0:\n{stdout}");

    assert_eq!(table_value(&stdout, "logical operations"), 6);
    assert_eq!(
        table_value(&stdout, "effects (charges)"),
        2,
        "order-A and order-D, once each"
    );
    assert_eq!(table_value(&stdout, "duplicate effects"), 0);
    assert_eq!(
        table_value(&stdout, "replays"),
        3,
        "order-A's lost answer, its retry, its redelivery"
    );
    assert_eq!(table_value(&stdout, "gave up"), 2);
    // A 3 + redelivery 1 + B 5 (the limit) + C 1 (400, not retried) + D 2 + E 3 (deadline).
    assert_eq!(table_value(&stdout, "attempts"), 15);

    let dead: Vec<&str> = stdout
        .split("dead letters:\n")
        .nth(1)
        .map(|rest| rest.lines().take_while(|l| l.starts_with("  ")).collect())
        .unwrap_or_default();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead[0].contains("order-B") && dead[0].contains("503"));
    assert!(dead[1].contains("order-E") && dead[1].contains("(deadline)"));

    // order-B's waits grow from the backoff, jittered, never past the 400 ms cap.
    let section = |id: &str| {
        stdout
            .split("\n\n")
            .find(|s| s.starts_with(&format!("{id}:")))
            .unwrap_or_else(|| panic!("no {id} section"))
            .to_owned()
    };
    let waits: Vec<u64> = section("order-B")
        .lines()
        .filter_map(|l| {
            l.split("retrying in ")
                .nth(1)?
                .split(" ms")
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(waits.len(), 4, "5 attempts, 4 waits");
    for (n, wait) in waits.iter().enumerate() {
        assert!(
            *wait <= (100 << n).min(400),
            "wait {n} = {wait} ms exceeds its bound"
        );
    }
    assert!(section("order-C").contains("400 Bad Request (final)"));
    assert!(
        !section("order-C").contains("retrying"),
        "a 400 is not retried"
    );
    assert!(section("order-D").contains("retrying in 1000 ms (as the server asked)"));
    let a = section("order-A");
    assert_eq!(a.matches("the answer was lost").count(), 2);
    assert!(a.contains("201 Created (replayed, no new charge)"));
}
