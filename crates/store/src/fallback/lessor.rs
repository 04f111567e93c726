//! A [`Fallback`] lends through its remote, behind the breaker of the key's server, the refill
//! counted in flight by the ledger until it is answered (a local decision meanwhile leaves room
//! for it): while the breaker is open a lease fails at once (the key is then decided exactly, by the failure policy), and a grant is recorded
//! like any reply, so that a local decision during a later outage starts from the state after it.
//! A request that waited on a lease call that failed is answered by the policy at once.

use std::time::Duration;

use super::{FailurePolicy, Fallback, InFlight};
use crate::lease::{Grant, Lessor};
use crate::remote::{Remote, Reply};
use crate::{Check, StoreError};

impl<R: Remote + Lessor> Lessor for Fallback<R> {
    async fn lease(&self, check: Check<'_>, want: u64, lessee: u64, lifetime: Duration) -> Result<Grant, StoreError> {
        timed!(self.shared.timer.as_ref(), self.lease_untimed(check, want, lessee, lifetime))
    }

    fn fall_back(&self, checks: &[Check<'_>]) -> Option<Result<crate::Reserved, StoreError>> {
        Some(self.shared.fall_back(checks))
    }
}

impl<R: Remote + Lessor> Fallback<R> {
    async fn lease_untimed(
        &self,
        check: Check<'_>,
        want: u64,
        lessee: u64,
        lifetime: Duration,
    ) -> Result<Grant, StoreError> {
        let sh = &self.shared;
        let breakers = sh.breakers_of(&[check]);
        if let Some((domain, _)) = breakers.iter().find(|(_, b)| b.is_open()) {
            return Err(StoreError::Backend(format!("circuit breaker open for {}", super::store::named(domain))));
        }
        // The refill may take up to `want` units: counted in flight, as any call is, so that a
        // request decided locally meanwhile cannot spend them too.
        let now = sh.now();
        let epoch = sh.epoch();
        let in_flight_checks = [Check { cost: want.clamp(1, check.limit.capacity().max(1)), ..check }];
        let in_flight = (sh.policy == FailurePolicy::Local).then(|| {
            sh.ledger.begin(&in_flight_checks, now);
            InFlight { ledger: &sh.ledger, checks: &in_flight_checks, now }
        });
        let result = sh.remote.lease(check, want, lessee, lifetime).await;
        match result {
            Ok(grant) => {
                let reply = Reply::new(vec![grant.decision], vec![grant.snapshot], grant.at);
                sh.answered(&[Check { cost: grant.granted, ..check }], &[], &reply, &breakers, epoch, None);
                // In flight until its reply is recorded: a request decided locally in between
                // would otherwise see the refill neither in flight nor in the snapshot (counted
                // twice for that instant instead: stricter).
                drop(in_flight);
                Ok(grant)
            }
            Err(error) => {
                if error.is_backend() {
                    sh.failed(&error, &breakers);
                }
                Err(error)
            }
        }
    }
}
