//! The engine itself ([`Engine`]: its store, the policy in force, clock, tables and metrics)
//! and the accessors every other part of it reads through: [`Engine::policy`],
//! [`Engine::current`], [`Engine::store`], [`Engine::metrics`], and `counted` (a store error
//! counted on its way through). What the engine does is in the files named for it: `builder`,
//! `admit` (deciding a request), `enforce`, `mitigation`, `measure`, `shared`, `settle`,
//! `carry`, `descriptors` (Envoy's), `direct` and `reload`.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::Clock;
use tollgate_store::{Store, StoreError};

use crate::{Current, Metrics, Policy, blocks, rates, settle, waiting};

/// The policy engine (see the crate docs). Share it behind an `Arc`.
#[derive(Debug)]
pub struct Engine<S> {
    pub(crate) store: S,
    /// The store Envoy's descriptors are decided on, if not `store` (the same backend with the
    /// deadline of Envoy's front end: see [`EngineBuilder::envoy_store`](crate::EngineBuilder::envoy_store)).
    pub(crate) envoy_store: Option<S>,
    pub(crate) policy: ArcSwap<Policy>,
    /// Held while a reload builds the next policy from the one in force, so that two reloads
    /// (of the rules and of Envoy's configuration) never lose one another's part.
    pub(crate) reloading: std::sync::Mutex<()>,
    /// Held by [`reload_file`](crate::reload::reload_file) from reading a file to swapping it in,
    /// so that a reload that read an older version never swaps it in after one that read a newer.
    pub(crate) loading: std::sync::Mutex<()>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) blocks: blocks::Blocks,
    pub(crate) rates: rates::Rates,
    pub(crate) routes: bool,
    pub(crate) metrics: Metrics,
    /// The reservations this engine opened (reserve → settle), for their metrics.
    pub(crate) reservations: Arc<crate::reserve::Opened>,
    /// The `count_status` reservations not settled yet.
    pub(crate) in_flight: Arc<settle::InFlight>,
    /// The requests waiting for their slot.
    pub(crate) places: waiting::Places,
    /// The longest any request may wait for its slot
    /// ([`EngineBuilder::max_wait`](crate::EngineBuilder::max_wait); `u64::MAX`: its rule's
    /// `max_delay`).
    pub(crate) max_wait_ns: u64,
}

/// `duration` in ns, saturating.
pub(crate) fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl<S: Store> Engine<S> {
    /// The policy in force (the rules, and Envoy's configuration).
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Counts a store error; the result passes through.
    pub(crate) fn counted<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(error) = &result {
            self.metrics.store_error(error);
        }
        result
    }

    /// The rules in force, for one request: taking them touches no shared reference count (an
    /// `Arc` clone would, on every request, from every core). Hold it while admitting a request,
    /// not across long waits.
    pub fn current(&self) -> Current {
        self.policy.load()
    }
}
