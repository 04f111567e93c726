//! The server's store: the [`Backend`] its configuration names (see `tollgate_store::configured`),
//! with every call through Redis's failure policy timed for `tollgate_store_latency_seconds`.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tollgate_store::configured::BackendOptions;
pub use tollgate_store::configured::{Backend, BackendStats};
use tollgate_store::fallback::CallTimer;

use crate::config::Config;

/// Seconds per Redis call: 50 µs .. ~6.5 s, a loopback round trip up to a store timeout.
#[must_use]
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 18))
}

/// Opens the configured store, each Redis call observed in `latency`.
pub async fn open(config: &Config, latency: &Histogram) -> Result<Backend, String> {
    let latency = latency.clone();
    let options = BackendOptions {
        policy: config.on_store_error,
        timeout: config.store_timeout,
        module: config.store_module,
        breaker_threshold: config.breaker_threshold,
        breaker_probe: config.breaker_probe,
        lease: config.lease.clone(),
        clock: config.clock.clone(),
        timer: Some(CallTimer::new(move |elapsed| latency.observe(elapsed.as_secs_f64()))),
    };
    Backend::open(&config.store, options).await
}
