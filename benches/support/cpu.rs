//! Where the time went: CPU time per thread group of this process, per process on this machine
//! (a PostgreSQL backend), and `redis-server`'s.
//!
//! Included by each bench that uses it (`#[path = "support/cpu.rs"] mod cpu;`); a bench uses
//! only part of it, hence `dead_code` is allowed here.

#![allow(dead_code)]

use tower_once_test_support::redis::RedisServer;

/// CPU time (ns) spent so far by this process's threads whose name starts with `prefix`, from
/// `/proc/self/task/*/schedstat`; `None` where that is not available (not Linux).
pub(crate) fn thread_cpu_ns(prefix: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if !name.starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else {
            continue;
        };
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// CPU time (ns) spent so far by the main thread of process `pid` (all of a single-threaded
/// process, such as a PostgreSQL backend), from `/proc/<pid>/schedstat`, which any user may
/// read; `None` where that is not available (not Linux, another machine, the process gone).
pub(crate) fn process_cpu_ns(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

/// `redis-server`'s CPU time so far (user + system, µs), from `INFO cpu`.
pub(crate) fn redis_cpu_us(redis: &RedisServer) -> Option<f64> {
    let info = redis.cli(&["INFO", "cpu"]);
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))?
            .trim()
            .parse()
            .ok()
    };
    Some((field("used_cpu_user")? + field("used_cpu_sys")?) * 1e6)
}
