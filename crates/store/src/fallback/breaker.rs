//! The circuit breakers: after a few consecutive failures of one server, stop waiting on it.
//!
//! There is one [`Breaker`] per fault domain (a Redis server: a cluster's primary, a Sentinel
//! group's primary), kept in [`Breakers`]: one failing server sends only its own keys to the
//! failure policy. Closed (the default), calls go to the server; each success resets the count of
//! consecutive failures. The failure that reaches the threshold opens the breaker: its calls are
//! answered by the failure policy at once, without a round trip, and one background task probes
//! that server every `probe_every` until it answers (or the topology no longer has it: a failover
//! replaced it), then closes the breaker. Callers never wait for a probe.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::remote::Domain;

/// The breaker's settings and state.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    probe_every: Duration,
    failures: AtomicU32,
    open: AtomicBool,
    opened: AtomicU64,
}

/// Consecutive failures that open the breaker by default.
pub const DEFAULT_THRESHOLD: u32 = 3;

/// How often an open breaker probes the backend by default.
pub const DEFAULT_PROBE_EVERY: Duration = Duration::from_millis(100);

impl Default for Breaker {
    fn default() -> Self {
        Breaker::new(DEFAULT_THRESHOLD, DEFAULT_PROBE_EVERY)
    }
}

impl Breaker {
    /// Opens after `threshold` consecutive failures (at least 1); probes every `probe_every`.
    #[must_use]
    pub fn new(threshold: u32, probe_every: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            probe_every,
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
            opened: AtomicU64::new(0),
        }
    }

    /// Whether calls skip the backend now.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// How many times the breaker opened.
    #[must_use]
    pub fn times_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// How often an open breaker probes.
    #[must_use]
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }

    pub(super) fn success(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure; true if this one opened the breaker (its caller starts the probe).
    pub(super) fn failure(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel) {
            self.opened.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The backend answered a probe.
    pub(super) fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.open.store(false, Ordering::Release);
    }
}

/// Domains followed at most: they come from the topology (a cluster's primaries), so this is only
/// a backstop; past it, closed breakers are forgotten.
const MAX_DOMAINS: usize = 1024;

/// A breaker's state, for metrics and health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerState {
    /// The server (its address; `""` for a store with one).
    pub domain: Domain,
    /// Whether calls to it skip it now.
    pub open: bool,
    /// How many times its breaker opened.
    pub opened: u64,
}

/// One [`Breaker`] per fault domain, made on first use with the settings of a template.
#[derive(Debug)]
pub struct Breakers {
    threshold: u32,
    probe_every: Duration,
    map: RwLock<HashMap<Domain, Arc<Breaker>>>,
    /// Openings of the breakers forgotten since.
    forgotten_openings: AtomicU64,
}

impl Breakers {
    /// Breakers with `template`'s threshold and probe interval.
    #[must_use]
    pub fn new(template: &Breaker) -> Self {
        Breakers {
            threshold: template.threshold,
            probe_every: template.probe_every,
            map: RwLock::new(HashMap::new()),
            forgotten_openings: AtomicU64::new(0),
        }
    }

    /// The breaker of `domain`, made closed on first use.
    pub(super) fn get(&self, domain: &Domain) -> Arc<Breaker> {
        if let Some(breaker) = self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(domain) {
            return breaker.clone();
        }
        let mut map = self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_DOMAINS && !map.contains_key(domain) {
            let forgotten: u64 = map.values().filter(|b| !b.is_open()).map(|b| b.times_opened()).sum();
            self.forgotten_openings.fetch_add(forgotten, Ordering::Relaxed);
            map.retain(|_, b| b.is_open());
        }
        map.entry(domain.clone()).or_insert_with(|| Arc::new(Breaker::new(self.threshold, self.probe_every))).clone()
    }

    /// Forgets `domain` (the topology no longer has it).
    pub(super) fn forget(&self, domain: &Domain) {
        if let Some(breaker) = self.map.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(domain) {
            self.forgotten_openings.fetch_add(breaker.times_opened(), Ordering::Relaxed);
        }
    }

    /// Whether any server's calls skip it now.
    #[must_use]
    pub fn any_open(&self) -> bool {
        self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner).values().any(|b| b.is_open())
    }

    /// How many times a breaker opened, all domains together.
    #[must_use]
    pub fn times_opened(&self) -> u64 {
        let live: u64 =
            self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner).values().map(|b| b.times_opened()).sum();
        live + self.forgotten_openings.load(Ordering::Relaxed)
    }

    /// Every domain's state, sorted by domain.
    #[must_use]
    pub fn states(&self) -> Vec<BreakerState> {
        let map = self.map.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut states: Vec<BreakerState> = map
            .iter()
            .map(|(domain, b)| BreakerState { domain: domain.clone(), open: b.is_open(), opened: b.times_opened() })
            .collect();
        states.sort_by(|a, b| a.domain.cmp(&b.domain));
        states
    }

    /// How often an open breaker probes.
    #[must_use]
    pub fn probe_every(&self) -> Duration {
        self.probe_every
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_once_at_the_threshold_and_closes_on_request() {
        let breaker = Breaker::new(3, Duration::from_millis(1));
        assert!(!breaker.failure() && !breaker.failure());
        breaker.success();
        assert!(!breaker.failure() && !breaker.failure() && !breaker.is_open());
        assert!(breaker.failure(), "the third consecutive failure opens it");
        assert!(breaker.is_open() && !breaker.failure(), "only once");
        breaker.close();
        assert!(!breaker.is_open());
        assert_eq!(breaker.times_opened(), 1);
    }

    #[test]
    fn one_breaker_per_domain() {
        let breakers = Breakers::new(&Breaker::new(1, Duration::from_millis(1)));
        let (a, b): (Domain, Domain) = ("10.0.0.1:7000".into(), "10.0.0.2:7000".into());
        assert!(breakers.get(&a).failure());
        assert!(breakers.get(&a).is_open() && !breakers.get(&b).is_open(), "a's failure is a's alone");
        assert!(breakers.any_open());
        assert_eq!(breakers.states().iter().map(|s| (s.open, s.opened)).collect::<Vec<_>>(), [(true, 1), (false, 0)]);
        breakers.forget(&a);
        assert!(!breakers.any_open() && breakers.times_opened() == 1, "openings are kept when a domain goes");
    }
}
