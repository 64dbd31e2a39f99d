//! A PostgreSQL server of the test's own: a fresh cluster (`initdb`) on a free loopback port,
//! which the test can stop and start again, as a database restart or crash would.

use crate::ports::{free_port, wait_for_port};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A private PostgreSQL cluster: trust auth for `postgres`, `fsync` off (a test's data), on
/// `127.0.0.1:<port>`; stopped (immediate mode, like a crash) and removed on drop.
#[derive(Debug)]
pub struct PostgresServer {
    /// The port it listens on.
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    running: bool,
}

impl PostgresServer {
    /// Creates the cluster and starts it.
    ///
    /// # Panics
    ///
    /// If the server binaries (`initdb`, `pg_ctl`) are missing or fail.
    pub fn start() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("tower-once-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster dir");
        let mut server = Self {
            port,
            bin: bin_dir(),
            dir,
            running: false,
        };
        give_to_postgres(&server.dir);
        let data = server.data();
        server.run(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "-N"],
        );
        server.restart();
        server
    }

    /// Starts the server again (after [`stop`](Self::stop)), and waits until it listens.
    pub fn restart(&mut self) {
        assert!(!self.running, "already running");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
        self.running = true;
        wait_for_port(self.port, Duration::from_secs(20));
    }

    /// Stops the server at once (immediate mode: no checkpoint, connections cut), as a crash.
    pub fn stop(&mut self) {
        if self.running {
            self.run(
                "pg_ctl",
                &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
            );
            self.running = false;
        }
    }

    /// Its URL, for the database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn run(&self, program: &str, args: &[&str]) {
        run_as_postgres(&self.bin.join(program), args, &self.dir);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The newest installed server's binaries (`/usr/lib/postgresql/<version>/bin`).
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server binaries under /usr/lib/postgresql (.ci/test installs them)")
        .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("an initdb under /usr/lib/postgresql/*/bin")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Hands `dir` to the `postgres` user when we are root (initdb refuses to run as root).
fn give_to_postgres(dir: &Path) {
    if is_root() {
        run(Command::new("chown").args(["-R", "postgres"]).arg(dir));
    }
}

/// Runs `program` as the `postgres` user when we are root, else as us.
fn run_as_postgres(program: &Path, args: &[&str], dir: &Path) {
    let mut command = if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    };
    run(command.args(args).current_dir(dir));
}

fn run(command: &mut Command) {
    let out = command
        .stdin(Stdio::null())
        .output()
        .expect("run a PostgreSQL server command");
    assert!(
        out.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
