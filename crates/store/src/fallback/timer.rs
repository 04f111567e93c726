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

/// When a call started, for its timer (if any).
pub(super) struct Timing<'a>(Option<(&'a CallTimer, Instant)>);

impl<'a> Timing<'a> {
    /// A call starts now.
    pub(super) fn start(timer: Option<&'a CallTimer>) -> Self {
        Timing(timer.map(|timer| (timer, Instant::now())))
    }

    /// The call ended: its timer is told how long it took (a call given up is not timed).
    pub(super) fn stop(self) {
        if let Some((timer, started)) = self.0 {
            (timer.0)(started.elapsed());
        }
    }
}

/// Awaits `$call`, telling `$timer` (an `Option<&CallTimer>`) how long it took. A macro, so
/// that the call's future is held once, in its caller's: a function taking it (`async fn
/// timed(call: impl Future)`) holds it twice, as its argument and as what it awaits, which
/// doubled the future of every Redis decision (some 6 KB, allocated and copied per call).
macro_rules! timed {
    ($timer:expr, $call:expr) => {{
        let timing = $crate::fallback::timer::Timing::start($timer);
        let result = $call.await;
        timing.stop();
        result
    }};
}
