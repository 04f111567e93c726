//! Whether the store answers, said out loud: probed at start-up and every second after, each
//! change logged (a warning naming the store, without its credentials, and what to check; then
//! when it answers again), and reported by `GET /healthz` and `tollgate_store_up`.
//!
//! `/healthz` answers 200 as long as the process serves, with a JSON body naming the store's
//! state: `{"status": "ok" | "degraded", "store": {...}}`. A Redis outage is not made a failed
//! health check on purpose: every node would fail it at once and a load balancer would take the
//! whole fleet out, turning an outage the failure policy answers (`--on-store-error`) into a
//! total one. Alert on `"degraded"` or on `tollgate_store_up == 0` instead (the gauge every front
//! end registers with [`Health::register`]: 1 while the store is up, 0 while it is not).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::backend::Backend;
use crate::config::{Config, StoreConfig};

/// How often the store is probed.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The store's last known state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreState {
    /// It answered the last probe, and the circuit breaker lets calls through.
    Up,
    /// It did not: why, in tollgate's words.
    Down(String),
}

/// The store's health, shared by the probe and `GET /healthz`.
#[derive(Debug)]
pub struct Health {
    store: String,
    policy: Option<&'static str>,
    state: Mutex<StoreState>,
    /// Each Redis server's circuit breaker, as of the last probe.
    nodes: Mutex<Vec<NodeReport>>,
    /// `tollgate_store_up`, set with the state.
    up: Gauge,
}

/// `GET /healthz`'s body.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `ok`, or `degraded` while the store does not answer (the failure policy decides).
    pub status: &'static str,
    /// The store's side.
    pub store: StoreReport,
}

/// The store in a [`Report`].
#[derive(Debug, Serialize)]
pub struct StoreReport {
    /// `memory`, or the Redis URL without credentials.
    pub name: String,
    /// `up` or `down`.
    pub state: &'static str,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What answers while it is down (`--on-store-error`; Redis only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_store_error: Option<&'static str>,
    /// Each Redis server calls went to, and its circuit breaker (the failure policy answers the
    /// keys of a server whose breaker is open, and only those).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeReport>,
}

/// One Redis server in a [`StoreReport`].
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NodeReport {
    /// Its address (from the topology, never from a client).
    pub node: String,
    /// `closed` (calls go to it) or `open` (its keys are answered by the failure policy).
    pub breaker: &'static str,
    /// How many times its breaker opened.
    pub opened: u64,
}

impl Health {
    /// Health of `config`'s store.
    pub fn new(config: &Config) -> Self {
        let policy = match &config.store {
            StoreConfig::Memory { .. } => None,
            StoreConfig::Redis(_) => Some(config.on_store_error.as_str()),
        };
        let up = Gauge::default();
        up.set(1);
        Health {
            store: config.store.describe(),
            policy,
            state: Mutex::new(StoreState::Up),
            nodes: Mutex::new(Vec::new()),
            up,
        }
    }

    /// Registers `store_up` in `registry` (whose prefix it takes): 1 while the store is up, 0
    /// while it is not, as of the last probe.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_up",
            "1 while the store answers its probe (every second) and the circuit breaker lets calls through, else 0",
            self.up.clone(),
        );
    }

    /// Whether the store is up now.
    pub fn is_up(&self) -> bool {
        *self.lock() == StoreState::Up
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The report for `GET /healthz`.
    pub fn report(&self) -> Report {
        let state = self.lock().clone();
        let (status, state, error) = match state {
            StoreState::Up => ("ok", "up", None),
            StoreState::Down(why) => ("degraded", "down", Some(why)),
        };
        let nodes = self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        Report {
            status,
            store: StoreReport { name: self.store.clone(), state, error, on_store_error: self.policy, nodes },
        }
    }

    /// Probes `backend` once, recording and logging a change of state.
    pub async fn probe(&self, backend: &Backend) {
        let open = backend.open_breakers();
        let state = match backend.ping().await {
            Ok(()) if !open.is_empty() => StoreState::Down(format!(
                "the circuit breaker of {} is open: recent calls failed or timed out (the failure policy answers \
                 its keys)",
                open.join(", ")
            )),
            Ok(()) => StoreState::Up,
            Err(why) => StoreState::Down(why),
        };
        let nodes = backend
            .stats()
            .breakers
            .into_iter()
            .filter(|b| !b.domain.is_empty())
            .map(|b| NodeReport {
                node: b.domain.to_string(),
                breaker: if b.open { "open" } else { "closed" },
                opened: b.opened,
            })
            .collect();
        *self.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = nodes;
        self.up.set(i64::from(state == StoreState::Up));
        let previous = std::mem::replace(&mut *self.lock(), state.clone());
        match (&previous, &state) {
            (StoreState::Up, StoreState::Down(why)) | (StoreState::Down(_), StoreState::Down(why))
                if previous != state =>
            {
                let policy = self.policy.unwrap_or("closed");
                tracing::warn!(store = %self.store, "the store does not answer: {why}; --on-store-error {policy} decides until it does");
            }
            (StoreState::Down(_), StoreState::Up) => tracing::info!(store = %self.store, "the store answers again"),
            _ => {}
        }
    }

    /// Probes every [`PROBE_EVERY`] until `backend` is dropped.
    pub fn watch(self: &Arc<Self>, backend: Weak<Backend>) {
        let health = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(PROBE_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await; // the first tick is now: the start-up probe just ran
            loop {
                ticks.tick().await;
                let (Some(health), Some(backend)) = (health.upgrade(), backend.upgrade()) else { return };
                health.probe(&backend).await;
            }
        });
    }
}
