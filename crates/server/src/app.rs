//! What every front end of `tollgate serve` shares: the policy engine over the configured store,
//! and the metrics registry (the engine's, the store's and the server's own).

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tollgate_engine::Engine;

use crate::backend::Backend;
use crate::config::Config;
use crate::metrics::Metrics;

/// The engine, its store and the metrics, shared by every connection.
#[derive(Debug)]
pub struct App {
    /// The policy engine (rules, named limits, ad-hoc checks).
    pub engine: Arc<Engine<Arc<Backend>>>,
    metrics: Metrics,
    registry: Registry,
}

impl App {
    /// Opens the store and builds the engine on the configured rules.
    pub async fn new(config: &Config) -> Result<Self, String> {
        let store = Arc::new(Backend::open(config).await?);
        let mut registry = Registry::with_prefix("tollgate");
        let metrics = Metrics::new(&mut registry, store.clone());
        let engine =
            Arc::new(Engine::builder(store, config.rules.clone()).clock(config.clock.clone()).build(&mut registry));
        Ok(App { engine, metrics, registry })
    }

    /// The server's own metrics (connections).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Every metric in the OpenMetrics text format.
    pub fn render_metrics(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}
