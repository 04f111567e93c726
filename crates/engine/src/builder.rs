//! Building an engine: [`Engine::builder`] and its options ([`EngineBuilder`]), each with its
//! default beside it, and [`EngineBuilder::build`], which compiles the first policy and
//! registers the metrics. The only place an [`Engine`] is made.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use prometheus_client::registry::Registry;
use tollgate_core::{Clock, SystemClock};
use tollgate_rules::Rules;
use tollgate_store::Store;

use crate::engine::duration_ns;
use crate::{
    DEFAULT_MAX_BLOCKS, DEFAULT_MAX_DELAYED, DEFAULT_MAX_RATED_KEYS, Engine, Metrics, Policy, blocks, rates, settle,
    waiting,
};

/// Options of an [`Engine`].
#[derive(Debug)]
pub struct EngineBuilder<S> {
    store: S,
    envoy_store: Option<S>,
    rules: Rules,
    envoy: Option<Arc<tollgate_envoy::Config>>,
    clock: Arc<dyn Clock>,
    max_blocks: usize,
    max_rated_keys: usize,
    routes: bool,
    max_delayed: usize,
    max_wait: Option<Duration>,
}

impl<S: Store> EngineBuilder<S> {
    /// The clock (default: the system clock). Tests pass a manual one, as to the store.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// At most this many keys under a mitigation timeout (default 100,000).
    #[must_use]
    pub fn max_blocks(mut self, max: usize) -> Self {
        self.max_blocks = max.max(1);
        self
    }

    /// At most this many (rule, key) pairs have a measured rate (default 100,000): the busiest.
    #[must_use]
    pub fn max_rated_keys(mut self, max: usize) -> Self {
        self.max_rated_keys = max.max(1);
        self
    }

    /// Whether the front end sends what a `route` rule quarantines to its upstream (`tollgate
    /// proxy` does): then such requests are answered [`Answer::Route`](crate::Answer::Route). Off
    /// (the default), a `route` rule rejects (429), as no request it mitigates may be served.
    #[must_use]
    pub fn routes(mut self, routes: bool) -> Self {
        self.routes = routes;
        self
    }

    /// At most this many requests wait for their slot under `delay` rules at once, across every
    /// key (default [`DEFAULT_MAX_DELAYED`]): beyond, a request that would wait is refused (429)
    /// at once, charging nothing; one that need not wait still passes. 0: no request ever waits.
    #[must_use]
    pub fn max_delayed(mut self, max: usize) -> Self {
        self.max_delayed = max;
        self
    }

    /// The longest any request may wait for its slot (default: as long as its rule's
    /// `max_delay`): the time a front end gives a request (its request timeout), so that a
    /// delay that would outlast it is refused at once (429, nothing charged) rather than spent
    /// on a request the server ends first. A front end may give less per request
    /// ([`admit_within`](Engine::admit_within)).
    #[must_use]
    pub fn max_wait(mut self, max: Duration) -> Self {
        self.max_wait = Some(max);
        self
    }

    /// Envoy's configuration (envoyproxy/ratelimit's YAML), the policy's second source beside the
    /// rules: the engine decides Envoy's descriptors by it ([`Engine::admit_descriptors`]) and
    /// swaps it on [`Engine::reload_envoy`]. Without it (the default) there is none: every
    /// descriptor is unmatched, and Envoy's reload counter is not registered.
    #[must_use]
    pub fn envoy(mut self, config: Arc<tollgate_envoy::Config>) -> Self {
        self.envoy = Some(config);
        self
    }

    /// The store Envoy's descriptors are decided on (default: the engine's store): the same
    /// backend behind a shorter deadline, as Envoy gives up on its rate-limit service sooner
    /// than other callers would.
    #[must_use]
    pub fn envoy_store(mut self, store: S) -> Self {
        self.envoy_store = Some(store);
        self
    }

    /// Builds the engine, its metrics registered in `registry`.
    pub fn build(self, registry: &mut Registry) -> Engine<S> {
        // A store that decides in place has no backend to fail: no store error series to watch.
        let metrics = Metrics::new(registry, !self.store.decides_in_place(), self.envoy.is_some());
        let in_flight = Arc::new(settle::InFlight::new());
        let envoy = self.envoy.unwrap_or_default();
        let policy = Arc::new(Policy::compile(self.rules, envoy, &metrics, &in_flight, None));
        let reservations = Arc::new(crate::reserve::Opened::default());
        registry.register_collector(Box::new(crate::metrics::OpenCollector {
            opened: reservations.clone(),
            clock: self.clock.clone(),
        }));
        Engine {
            store: self.store,
            envoy_store: self.envoy_store,
            policy: ArcSwap::new(policy),
            reloading: std::sync::Mutex::new(()),
            loading: std::sync::Mutex::new(()),
            clock: self.clock,
            blocks: blocks::Blocks::new(self.max_blocks),
            rates: rates::Rates::new(self.max_rated_keys),
            routes: self.routes,
            metrics,
            in_flight,
            reservations,
            places: waiting::Places::new(self.max_delayed),
            max_wait_ns: self.max_wait.map_or(u64::MAX, duration_ns),
        }
    }
}

impl<S: Store> Engine<S> {
    /// An engine applying `rules` with `store`.
    pub fn builder(store: S, rules: Rules) -> EngineBuilder<S> {
        EngineBuilder {
            store,
            envoy_store: None,
            rules,
            envoy: None,
            clock: Arc::new(SystemClock::new()),
            max_blocks: DEFAULT_MAX_BLOCKS,
            max_rated_keys: DEFAULT_MAX_RATED_KEYS,
            routes: false,
            max_delayed: DEFAULT_MAX_DELAYED,
            max_wait: None,
        }
    }
}
