//! Loopback ports: a free one, and a bounded wait until something listens on one.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// A port nobody listens on (and whose cluster bus port, +10000, is in range).
pub fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind an ephemeral loopback port")
            .port();
        if port < 55_000 {
            return port;
        }
    }
}

/// Waits (bounded) until something accepts connections on `port`.
///
/// # Panics
///
/// If nothing does within `limit`.
pub fn wait_for_port(port: u16, limit: Duration) {
    let started = Instant::now();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    while TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
        assert!(
            started.elapsed() < limit,
            "nothing listens on {port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
