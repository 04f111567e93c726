//! A [`Fallback`] lends through its remote, behind its breaker: while the breaker is open a lease
//! fails at once (the key is then decided exactly, by the failure policy), and a grant is recorded
//! like any reply, so that a local decision during a later outage starts from the state after it.
//! A request that waited on a lease call that failed is answered by the policy at once.

use std::time::Duration;

use super::Fallback;
use crate::lease::{Grant, Lessor};
use crate::remote::{Remote, Reply};
use crate::{Check, StoreError};

impl<R: Remote + Lessor> Lessor for Fallback<R> {
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
        let sh = &self.shared;
        if sh.breaker.is_open() {
            return Err(StoreError::Backend("circuit breaker open".into()));
        }
        match sh.remote.lease(check, want, lessee, lifetime).await {
            Ok(grant) => {
                let reply =
                    Reply { decisions: vec![grant.decision], snapshots: vec![grant.snapshot], now_ns: grant.at };
                sh.answered(&[Check { cost: grant.granted, ..check }], &[], &reply);
                Ok(grant)
            }
            Err(error) => {
                if error.is_backend() {
                    sh.failed(&error);
                }
                Err(error)
            }
        }
    }

    fn fall_back(&self, checks: &[Check<'_>]) -> Option<Result<crate::Reserved, StoreError>> {
        Some(self.shared.fall_back(checks))
    }
}
