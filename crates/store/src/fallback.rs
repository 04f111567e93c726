//! [`Fallback`]: what any store answers when its backend fails — fail-open, fail-closed, or a
//! local in-memory store — with a count of backend errors.
//!
//! Only backend errors ([`StoreError::is_backend`]: unreachable, timed out) are covered; a bad
//! request (a cost above the capacity) or a bad key is still an error.
//!
//! **The local fallback's over-grant bound.** While the backend is down, each process decides
//! from its own memory, starting from a full bucket. With `k` processes, a key can be admitted up
//! to `k * (capacity + outage / T)` times during an outage of that length, on top of what the
//! backend had already admitted — against `capacity + outage / T` for the fleet when healthy.
//! Fail-closed never over-grants and fail-open has no bound; the local fallback keeps a per-process
//! limit in force, which is usually the right trade.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{Decision, Limit};

use crate::{Check, MemoryStore, Store, StoreError};

/// What to answer while the backend fails.
#[derive(Debug)]
pub enum FailurePolicy {
    /// Admit every request (availability first): `remaining` is reported as the capacity left
    /// after the cost, `retry_after` and `reset_after` as 0.
    Open,
    /// Deny every request (protection first): `retry_after` is one emission interval.
    Closed,
    /// Decide with this in-memory store, under the same limits.
    Local(MemoryStore),
}

/// A store that answers by `policy` whenever `inner` fails.
#[derive(Debug)]
pub struct Fallback<S> {
    inner: S,
    policy: FailurePolicy,
    backend_errors: AtomicU64,
}

impl<S: Store> Fallback<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, policy: FailurePolicy) -> Self {
        Fallback { inner, policy, backend_errors: AtomicU64::new(0) }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Backend errors so far: each one was answered by the policy.
    pub fn backend_errors(&self) -> u64 {
        self.backend_errors.load(Ordering::Relaxed)
    }

    fn answer(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        self.backend_errors.fetch_add(1, Ordering::Relaxed);
        match &self.policy {
            FailurePolicy::Local(local) => local.check_all_sync(checks),
            FailurePolicy::Open => Ok(checks.iter().map(|c| open(c.limit, c.cost)).collect()),
            FailurePolicy::Closed => Ok(checks.iter().map(|c| closed(c.limit)).collect()),
        }
    }
}

fn open(limit: &Limit, cost: u64) -> Decision {
    let capacity = limit.capacity();
    Decision {
        allowed: true,
        limit: capacity,
        remaining: capacity.saturating_sub(cost),
        retry_after_ns: 0,
        reset_after_ns: 0,
    }
}

fn closed(limit: &Limit) -> Decision {
    Decision {
        allowed: false,
        limit: limit.capacity(),
        remaining: 0,
        retry_after_ns: limit.emission_interval_ns(),
        reset_after_ns: 0,
    }
}

impl<S: Store> Store for Fallback<S> {
    async fn check(&self, key: &str, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        if cost > limit.capacity() {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost, capacity: limit.capacity() }.into());
        }
        match self.inner.check(key, limit, cost).await {
            Err(e) if e.is_backend() => Ok(self.answer(&[Check { key, limit, cost }])?.remove(0)),
            other => other,
        }
    }

    async fn check_all(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        match self.inner.check_all(checks).await {
            Err(e) if e.is_backend() => self.answer(checks),
            other => other,
        }
    }

    async fn reset(&self, key: &str, limit: &Limit) -> Result<(), StoreError> {
        if let FailurePolicy::Local(local) = &self.policy {
            local.reset_sync(key, limit);
        }
        self.inner.reset(key, limit).await
    }
}
