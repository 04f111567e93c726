//! The memory store as a [`Remote`]: charges and snapshots, so that a failure policy can be put in
//! front of it (for tests of the policy with faults injected, and for embedding a memory store
//! behind another process's front end).

use crate::remote::{Charge, Remote, Reply};
use crate::{Check, MemoryStore, StoreError};

impl Remote for MemoryStore {
    async fn decide(&self, checks: &[Check<'_>], charges: &[Charge<'_>]) -> Result<Reply, StoreError> {
        crate::remote::check_totals(charges)?;
        self.as_remote.store(true, std::sync::atomic::Ordering::Relaxed);
        let now = self.clock.now_ns();
        let charges: Vec<(Charge<'_>, u64)> = charges.iter().map(|c| (*c, now.saturating_sub(c.age_ns))).collect();
        self.check_many(checks, &charges, true)
    }

    async fn probe(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
