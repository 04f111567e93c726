//! What following a topology takes, whatever the topology (a cluster's slot map, a Sentinel
//! group's primary): the servers connected so far, by address, and a re-read of the topology
//! that is serialized and throttled, so that a failing server triggers one re-read per
//! [`REFRESH_EVERY`], not one per failed call.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::RedisResult;

use super::node::{Node, Settings};
use super::target::Address;

/// The least time between two re-reads of the topology (unless a call cannot go anywhere).
pub(super) const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// The servers connected so far, by address: a server named again (a primary switched back, a
/// node the slot map names anew) keeps its connection.
pub(super) struct Nodes {
    settings: Arc<Settings>,
    known: Mutex<HashMap<Address, Arc<Node>>>,
}

impl Nodes {
    pub(super) fn new(settings: Arc<Settings>) -> Self {
        Nodes { settings, known: Mutex::new(HashMap::new()) }
    }

    /// The server at `address`, connected once (on first use).
    pub(super) fn get(&self, address: &Address) -> RedisResult<Arc<Node>> {
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(node) = known.get(address) {
            return Ok(node.clone());
        }
        let node = Node::open(address.clone(), self.settings.clone())?;
        known.insert(address.clone(), node.clone());
        Ok(node)
    }

    /// Every address connected so far.
    pub(super) fn addresses(&self) -> Vec<Address> {
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys().cloned().collect()
    }

    /// How long a topology query may take: the call timeout, at least 200 ms.
    pub(super) fn query_timeout(&self) -> Duration {
        self.settings.timeout.max(Duration::from_millis(200))
    }
}

/// A re-read of the topology: serialized, and at most one per [`REFRESH_EVERY`].
#[derive(Default)]
pub(super) struct Refresh {
    /// Held while re-reading; when the last re-read ended.
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl Refresh {
    /// Runs `read` unless another re-read ended after this was asked, or (unless `needed`: a call
    /// has nowhere to go) within [`REFRESH_EVERY`].
    pub(super) async fn run<F: Future<Output = RedisResult<()>>>(
        &self,
        needed: bool,
        read: impl FnOnce() -> F,
    ) -> RedisResult<()> {
        let asked = Instant::now();
        let mut last = self.last.lock().await;
        if last.is_some_and(|at| at >= asked || (!needed && at.elapsed() < REFRESH_EVERY)) {
            return Ok(());
        }
        let result = read().await;
        *last = Some(Instant::now());
        result
    }

    /// Whether a background re-read is worth a task now: none runs, and none ended within
    /// [`REFRESH_EVERY`] (cheap enough to ask on every failed call).
    pub(super) fn due(&self) -> bool {
        self.last.try_lock().is_ok_and(|last| last.is_none_or(|at| at.elapsed() >= REFRESH_EVERY))
    }
}

/// Runs `refresh` on a task of its own, if inside a tokio runtime.
pub(super) fn in_background(refresh: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(refresh);
    }
}
