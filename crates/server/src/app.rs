//! What every front end of `tollgate serve` shares: the policy engine over the configured store
//! (its policy: the rules and Envoy's configuration), and the metrics registry (the engine's, the
//! store's and the server's own).

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tollgate_engine::Engine;

use crate::backend::Backend;
use crate::config::Config;
use crate::health::Health;
use crate::metrics::ServerMetrics;

/// The engine, its store and the metrics, shared by every connection.
#[derive(Debug)]
pub struct App {
    /// The policy engine (rules, named limits, ad-hoc checks, Envoy's descriptors).
    pub engine: Arc<Engine<Arc<Backend>>>,
    /// Whether the store answers.
    pub health: Arc<Health>,
    rules_file: Option<std::path::PathBuf>,
    metrics: ServerMetrics,
    registry: Registry,
}

impl App {
    /// Opens the store, probes it once (a store that does not answer is logged, and served
    /// by the failure policy), and builds the engine on the configured rules. Call it within a
    /// runtime: the store is probed every second after.
    pub async fn new(config: &Config) -> Result<Self, String> {
        let latency = crate::backend::latency_histogram();
        let store = Arc::new(crate::backend::open(config, &latency).await?);
        let health = Arc::new(Health::new(config));
        health.probe(&store).await;
        health.watch(Arc::downgrade(&store));
        // tollgate's metrics under its prefix; envoyproxy/ratelimit's names (gRPC) without it.
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("tollgate");
        // Envoy's gRPC service waits on Redis at most `grpc_store_timeout` (Envoy gives up after
        // 20 ms by default); the other front ends use `store_timeout`.
        let grpc_store = store.with_deadline(config.grpc_store_timeout).map_or_else(|| store.clone(), Arc::new);
        let stores = if Arc::ptr_eq(&grpc_store, &store) {
            vec![store.clone()]
        } else {
            vec![store.clone(), grpc_store.clone()]
        };
        let metrics = ServerMetrics::new(registry, stores, &latency);
        health.register(registry);
        // A named delay rule's reply waits for its slot: never past the HTTP request timeout (a
        // 408 would spend the slot for nothing), RESP callers alike.
        let engine = Engine::builder(store, config.rules.clone())
            .envoy(config.envoy.clone())
            .envoy_store(grpc_store)
            .clock(config.clock.clone());
        let engine = engine.max_wait(config.http.request_timeout).build(registry);
        engine.metrics().descriptors().register(&mut root);
        Ok(App { engine: Arc::new(engine), health, rules_file: config.rules_file.clone(), metrics, registry: root })
    }

    /// Why `name` is no limit here, and what is: the rules file's limits usable by name (the
    /// first 16), or that there is no rules file, or that it defines none. For `TG.LIMIT` and the
    /// HTTP `limit_name`.
    pub fn unknown_limit(&self, name: &str) -> String {
        const LISTED: usize = 16;
        let mut message = format!("no rule or limit named {name:?}");
        let policy = self.engine.current();
        let rules = &policy.rules.rules;
        let usable: Vec<&str> =
            rules.iter().filter(|rule| rule.keyed_on_callers_key()).map(|rule| rule.name.as_str()).collect();
        if !usable.is_empty() {
            let more = if usable.len() > LISTED { ", ..." } else { "" };
            message
                .push_str(&format!("; limits usable by name: {}{more}", usable[..usable.len().min(LISTED)].join(", ")));
        } else if self.rules_file.is_none() && rules.is_empty() {
            message.push_str(": the server was started without --rules FILE");
        } else {
            let file = self.rules_file.as_ref().map(|f| format!(" in {}", f.display())).unwrap_or_default();
            message.push_str(&format!(
                "; no limit is usable by name{file} (define [limits.NAME], or a rule with key = [\"key\"])"
            ));
        }
        message
    }

    /// The server's own metrics (connections).
    pub fn metrics(&self) -> &ServerMetrics {
        &self.metrics
    }

    /// Every metric in the OpenMetrics text format.
    pub fn render_metrics(&self) -> String {
        crate::metrics::render(&self.registry)
    }
}
