//! A dependency whose health the test sets, counting the calls that reached it.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// How the dependency answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Health {
    /// `Ok`.
    Up = 0,
    /// `Err` (a failure).
    Down = 1,
    /// Never answers.
    Hangs = 2,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Dependency {
    health: Arc<AtomicU8>,
    calls: Arc<AtomicU32>,
    delay_ms: Arc<AtomicU32>,
}

impl Dependency {
    pub(crate) fn set(&self, health: Health) {
        self.health.store(health as u8, SeqCst);
    }

    /// Every answer takes this long (tokio's clock).
    pub(crate) fn delay(&self, delay: Duration) {
        self.delay_ms.store(delay.as_millis() as u32, SeqCst);
    }

    /// Calls that reached it.
    pub(crate) fn calls(&self) -> u32 {
        self.calls.load(SeqCst)
    }

    /// The dependency as a tower service of any request type.
    pub(crate) fn service<Req>(
        &self,
    ) -> impl tower::Service<
        Req,
        Response = &'static str,
        Error = std::io::Error,
        Future = Pin<Box<dyn Future<Output = Result<&'static str, std::io::Error>> + Send>>,
    > + Clone
           + Send
           + 'static {
        let dep = self.clone();
        tower::service_fn(move |_: Req| {
            dep.calls.fetch_add(1, SeqCst);
            let health = dep.health.load(SeqCst);
            let delay = Duration::from_millis(u64::from(dep.delay_ms.load(SeqCst)));
            Box::pin(async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                match health {
                    0 => Ok("ok"),
                    1 => Err(std::io::Error::other("down")),
                    _ => std::future::pending().await,
                }
            }) as Pin<Box<dyn Future<Output = _> + Send>>
        })
    }
}
