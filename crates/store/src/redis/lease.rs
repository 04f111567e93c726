//! The Redis store as a [`Lessor`]: a lease is the decision script with its lease arguments (see
//! `lua/decide.lua`), one call like any decision.

use std::time::Duration;

use super::{LeaseArgs, RedisStore};
use crate::lease::{Grant, Lessor, leasable};
use crate::{Check, StoreError};

impl Lessor for RedisStore {
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
        if !leasable(check.limit.algorithm()) {
            return Err(StoreError::Unsupported(format!("leases of {}", check.limit.algorithm().as_str())));
        }
        let want = want.clamp(1, check.limit.capacity().max(1));
        let lifetime_ms = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX).max(1);
        let args = LeaseArgs { lessee, lifetime_ms };
        let (reply, lease) = self.invoke(&[Check { cost: want, ..check }], &[], &[], Some(args)).await?;
        let (granted, lessees) = lease.ok_or_else(|| StoreError::Backend("the script answered no lease".into()))?;
        Ok(Grant { decision: reply.decisions[0], granted, lessees, snapshot: reply.snapshots[0], at: reply.now_ns })
    }
}
