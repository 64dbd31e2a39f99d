//! Example binaries, for tests that run them as processes.

use std::path::PathBuf;
use std::process::Command;

/// The path of example `name` of the package under test (`target/<profile>/examples/<name>`,
/// which `cargo test` builds beside the tests), built with `features` first when it is not
/// there (`cargo test --test <name>` builds only that target).
///
/// # Panics
///
/// If the build fails.
pub fn example_binary(name: &str, features: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let binary = profile_dir.join("examples").join(name);
    if !binary.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", name, "--features", features])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the {name} example failed");
    }
    binary
}
