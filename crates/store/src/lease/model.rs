//! [`LeaseModel`]: the memory store as a [`Lessor`], making exactly the grants the Redis script
//! makes. The lease simulation runs on it, and the Redis script is tested against it.

use std::sync::Mutex;
use std::time::Duration;

use foldhash::fast::FixedState;
use hashbrown::HashMap;

use super::{Grant, Lessor};
use crate::{Check, MemoryStore, Refund, Reserved, Store, StoreError};

/// Per (scope, algorithm, key): each lessee's expiry, in ns.
type Lessees = HashMap<(String, &'static str, Vec<u8>), HashMap<u64, u64, FixedState>, FixedState>;

/// A [`MemoryStore`] that also lends slices (see [`Lessor`]), counting its lessees as the Redis
/// script does.
#[derive(Debug, Clone)]
pub struct LeaseModel {
    store: std::sync::Arc<MemoryStore>,
    /// Per (scope, algorithm, key): each lessee's expiry, in ns.
    lessees: std::sync::Arc<Mutex<Lessees>>,
}

impl LeaseModel {
    /// Lends from `store` (its clock is the store's now).
    #[must_use]
    pub fn new(store: MemoryStore) -> Self {
        LeaseModel { store: std::sync::Arc::new(store), lessees: std::sync::Arc::default() }
    }

    /// The store lent from.
    #[must_use]
    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    /// [`Lessor::lease`], synchronously.
    pub fn lease_sync(
        &self,
        check: Check<'_>,
        want: u64,
        lessee: u64,
        lifetime: Duration,
    ) -> Result<Grant, StoreError> {
        if !super::leasable(check.limit.algorithm()) {
            return Err(StoreError::Unsupported(format!("leases of {}", check.limit.algorithm().as_str())));
        }
        let want = want.clamp(1, check.limit.capacity().max(1));
        let left = self.store.check_one_sync(Check { cost: 0, ..check })?.remaining;
        let wanted = want.min(left);
        let reply = self.store.check_many(&[Check { cost: wanted.max(1), ..check }], &[], true)?;
        let (decision, snapshots, at) = (reply.decisions[0], reply.snapshots, reply.now_ns);
        let granted = if decision.allowed { wanted } else { 0 };
        // In whole ms, at least one, as the script.
        let lifetime_ms = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX).max(1);
        let expires = (at / 1_000_000 + lifetime_ms) * 1_000_000;
        // The script counts in whole ms: a lessee is current while its expiry is after now.
        let now_ms = at / 1_000_000;
        let mut all = self.lessees.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = (check.scope.to_string(), check.limit.algorithm().as_str(), check.key.to_vec());
        let of_key = all.entry(id).or_default();
        of_key.retain(|_, expiry| *expiry / 1_000_000 > now_ms);
        of_key.insert(lessee, expires);
        Ok(Grant { decision, granted, lessees: of_key.len() as u64, snapshot: snapshots[0], at })
    }
}

impl Lessor for LeaseModel {
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
        self.lease_sync(check, want, lessee, lifetime)
    }
}

impl Store for LeaseModel {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        self.store.reserve_sync(checks)
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        self.store.refund_sync(refunds);
        Ok(())
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &tollgate_core::Limit) -> Result<(), StoreError> {
        self.store.reset_sync(scope, key, limit);
        Ok(())
    }
}
