//! [`Fallback`] as a [`Store`]: each call timed, the breaker consulted, the node's debts and
//! views ridden on the call, and the failure policy answering when the backend fails.

use tollgate_core::Limit;

use super::{FailurePolicy, Fallback, InFlight, charges_of};
use crate::remote::{Charge, Remote};
use crate::{Check, Refund, Reserved, Store, StoreError};

impl<R: Remote> Store for Fallback<R> {
    async fn reserve(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        timed!(self.shared.timer.as_ref(), self.reserve_untimed(checks))
    }

    async fn refund(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        timed!(self.shared.timer.as_ref(), self.refund_untimed(refunds))
    }

    /// On the backend, as a charge of its call (applied whenever sent), while its breakers are
    /// closed. While one is open (nothing sent), under the `local` policy the charge is owed in
    /// the ledger, as the node's local admissions are, and paid to the backend when it answers
    /// again (its next requests pay meanwhile: the node's local decisions count it); under the
    /// others, an error. A call that fails is an error too (the backend may have applied it: not
    /// charged twice): the caller keeps what it reserved (an under-count of the difference,
    /// logged by the caller).
    async fn charge(&self, checks: &[Check<'_>]) -> Result<(), StoreError> {
        timed!(self.shared.timer.as_ref(), async {
            let sh = &self.shared;
            let breakers = sh.breakers_of(checks);
            if let Some((domain, _)) = breakers.iter().find(|(_, b)| b.is_open()) {
                if sh.policy == FailurePolicy::Local {
                    sh.ledger.owe(checks, sh.now());
                    sh.start_flusher();
                    return Ok(());
                }
                return Err(StoreError::Backend(format!(
                    "circuit breaker open for {}: nothing charged",
                    named(domain)
                )));
            }
            let charges: Vec<Charge<'_>> = checks.iter().map(|c| Charge::new(*c, 0)).collect();
            match sh.remote.decide(&[], &charges).await {
                Err(error) if error.is_backend() => {
                    sh.failed(&error, &breakers);
                    Err(error)
                }
                other => other.map(drop),
            }
        })
    }

    async fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> Result<(), StoreError> {
        timed!(self.shared.timer.as_ref(), async {
            self.shared.remote.reset(scope, key, limit).await?;
            self.shared.ledger.forget(&Check { scope, key, limit, cost: 0, hold: false, reporting: false });
            Ok(())
        })
    }

    /// On the backend, while its breaker is closed (otherwise an error: the old state stays, to
    /// be carried by a later call). What this node owes the backend under the old algorithm is
    /// still sent there (recreating the old state, which a later carry moves on).
    async fn carry(&self, scope: &str, key: &[u8], from: &Limit, to: &Limit) -> Result<u64, StoreError> {
        timed!(self.shared.timer.as_ref(), async {
            let check = Check { scope, key, limit: to, cost: 0, hold: false, reporting: false };
            let breakers = self.shared.breakers_of(std::slice::from_ref(&check));
            if breakers.iter().any(|(_, b)| b.is_open()) {
                return Err(StoreError::Backend("the backend is failing: nothing carried now".into()));
            }
            match self.shared.remote.carry(scope, key, from, to).await {
                Err(error) if error.is_backend() => {
                    self.shared.failed(&error, &breakers);
                    Err(error)
                }
                other => other,
            }
        })
    }

    async fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        timed!(self.shared.timer.as_ref(), self.hold_untimed(scope, key, hold_ns))
    }
}

impl<R: Remote> Fallback<R> {
    /// On the backend, while its breaker is closed; otherwise, or when it fails, an error: the
    /// caller holds the key on its own meanwhile (the failure policy keeps no holds: they are the
    /// engine's, which keeps each in its own table too).
    async fn hold_untimed(&self, scope: &str, key: &[u8], hold_ns: u64) -> Result<(), StoreError> {
        let sh = &self.shared;
        // The hold's key shares its state key's server (one hash tag): any limit names it.
        let limit = tollgate_core::Limit::per_second(1).build().map_err(StoreError::from)?;
        let check = Check { scope, key, limit: &limit, cost: 0, hold: true, reporting: false };
        let breakers = sh.breakers_of(std::slice::from_ref(&check));
        if let Some((domain, _)) = breakers.iter().find(|(_, b)| b.is_open()) {
            return Err(StoreError::Backend(format!(
                "circuit breaker open for {}: the hold is kept locally",
                named(domain)
            )));
        }
        match sh.remote.hold(scope, key, hold_ns).await {
            Err(error) if error.is_backend() => {
                sh.failed(&error, &breakers);
                Err(error)
            }
            other => other,
        }
    }

    async fn reserve_untimed(&self, checks: &[Check<'_>]) -> Result<Reserved, StoreError> {
        if checks.is_empty() {
            return Err(StoreError::NoChecks);
        }
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        let sh = &self.shared;
        let breakers = sh.breakers_of(checks);
        if breakers.iter().any(|(_, b)| b.is_open()) {
            return sh.fall_back(checks);
        }
        let local = sh.policy == FailurePolicy::Local;
        let now = sh.now();
        let epoch = sh.epoch();
        // What the call carries, its checks counted in flight (until answered, failed or given up).
        let (debts, views) = if local { sh.ledger.send(checks, now, epoch) } else { Default::default() };
        let in_flight = local.then_some(InFlight { ledger: &sh.ledger, checks, now });
        let mut charges = charges_of(&debts, now);
        // Keys seen busy before a failure: what the node knew, for a Redis that lost them.
        charges.extend(views.into_iter().map(|view| Charge {
            check: Check { cost: 0, ..checks[view.check] },
            age_ns: 0,
            origin: None,
            known_remaining: Some(view.remaining),
            seen: Some(view.seen),
            view: true,
        }));
        let result = sh.remote.decide(checks, &charges).await;
        match result {
            Ok(reply) => {
                sh.answered(checks, &debts, &reply, &breakers, epoch, in_flight);
                let per_check = if reply.snapshots.iter().all(|s| s.at == reply.now_ns) {
                    Vec::new()
                } else {
                    reply.snapshots.iter().map(|s| s.at).collect()
                };
                Ok(Reserved { decisions: reply.decisions, at: reply.now_ns, per_check, held: reply.held })
            }
            Err(StoreError::Partial(partial)) => {
                drop(in_flight);
                // Boxed: a rare path, whose future every decision's would otherwise carry.
                Box::pin(sh.fall_back_partly(checks, &partial, &debts, epoch)).await
            }
            Err(error) if error.is_backend() => {
                drop(in_flight);
                sh.failed(&error, &breakers);
                sh.fall_back(checks)
            }
            Err(error) => Err(error),
        }
    }

    /// A reservation decided locally is withdrawn from the debt; one decided by the backend is
    /// refunded there. If the backend cannot be reached, the refund is dropped: the reservation
    /// stays counted (an under-grant).
    async fn refund_untimed(&self, refunds: &[Refund<'_>]) -> Result<(), StoreError> {
        let sh = &self.shared;
        let remote: Vec<Refund<'_>> = refunds.iter().filter(|r| !sh.ledger.refund(r, sh.now())).copied().collect();
        let checks: Vec<Check<'_>> = remote.iter().map(|r| r.check).collect();
        let breakers = sh.breakers_of(&checks);
        if remote.is_empty() || breakers.iter().any(|(_, b)| b.is_open()) {
            return Ok(());
        }
        match sh.remote.refund(&remote).await {
            Err(error) if error.is_backend() => {
                sh.failed(&error, &breakers);
                Ok(())
            }
            other => other,
        }
    }
}

/// A fault domain as an error names it: its server, or the store for a remote of one server
/// (whose domain is `""`).
pub(super) fn named(domain: &str) -> &str {
    if domain.is_empty() { "the store" } else { domain }
}
