//! [`CallTimer`]: what a [`Fallback`](super::Fallback) is told of each of its calls' duration
//! (a server's histogram, say), so that only calls through the failure policy are timed: a
//! decision answered from a leased slice above it makes no store call and is not one.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Called with the duration of every call through the failure policy: a decision, a lease, a
/// refund or a reset, failures, timeouts and an open breaker's instant answers included.
#[derive(Clone)]
pub struct CallTimer(Arc<dyn Fn(Duration) + Send + Sync>);

impl CallTimer {
    /// A timer calling `observe`.
    pub fn new(observe: impl Fn(Duration) + Send + Sync + 'static) -> Self {
        CallTimer(Arc::new(observe))
    }
}

impl std::fmt::Debug for CallTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallTimer")
    }
}

/// Runs `call`, telling `timer` (if any) how long it took.
pub(super) async fn timed<T>(timer: Option<&CallTimer>, call: impl Future<Output = T>) -> T {
    let Some(timer) = timer else { return call.await };
    let started = Instant::now();
    let result = call.await;
    (timer.0)(started.elapsed());
    result
}
