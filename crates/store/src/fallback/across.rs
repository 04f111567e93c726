//! A request across several servers that failed part way ([`StoreError::Partial`]): what the
//! servers that answered decided stands, and the failure policy answers the rest, all or nothing.
//!
//! - The answered keys' admissions are counted on the remote already: a request the policy
//!   admits keeps them (they never become this node's debt), a request it denies gives them back
//!   (a refund; one that fails may have run and is not tried again: the admission may stay
//!   counted, an under-grant). So under `closed` a denied request consumes nothing, and under
//!   `local` the debt holds only what the remote did not admit. Before, the whole request became
//!   the policy's: the answered keys were charged twice under `local`, and kept under `closed`.
//! - The policy decides only the checks no server answered, all or nothing; a server that denied
//!   denies the request, whatever the failed server would have said; every check answered (a
//!   server failed with charges only), the answers stand.
//! - The failed server's call may have run: if it admitted, that admission counts besides the
//!   policy's answer, as for any call whose reply is lost (an under-grant of that call).
//! - The charges that rode on an answered server's call are paid, as its snapshot (kept) holds
//!   them; the failed server's are sent again (its call may have run: the remote applies each
//!   unit once).
//! - The failure counts against the failed servers' breakers only.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tollgate_core::{Decision, Snapshot};

use super::ledger::Debt;
use super::{FailurePolicy, Shared};
use crate::remote::{Decided, Partial, Remote, Reply};
use crate::{Check, Refund, Reserved, StoreError};

impl<R: Remote> Shared<R> {
    /// Answers `checks`, whose call (sent with `debts`' charges when `epoch` calls had failed)
    /// failed part way as `partial` says (see the module docs).
    pub(super) async fn fall_back_partly(
        self: &Arc<Self>,
        checks: &[Check<'_>],
        partial: &Partial,
        debts: &[Debt],
        epoch: u64,
    ) -> Result<Reserved, StoreError> {
        let decided = &partial.decided;
        if decided.len() != checks.len() {
            return Err(StoreError::Backend(format!(
                "a remote answered {} of a call's {} checks",
                decided.len(),
                checks.len()
            )));
        }
        let failed: Vec<Check<'_>> = partial.failed.iter().filter_map(|&i| checks.get(i).copied()).collect();
        let failing = self.breakers_of(&failed);
        let reached: Vec<Check<'_>> = (0..checks.len())
            .filter(|i| decided[*i].is_some() && !partial.failed.contains(i))
            .map(|i| checks[i])
            .collect();
        for (domain, breaker) in self.breakers_of(&reached) {
            if !failing.iter().any(|(d, _)| *d == domain) {
                breaker.success();
            }
        }
        self.failed(&partial.error, &failing);
        self.fallbacks.fetch_add(1, Ordering::Relaxed);

        let at = self.now();
        if self.policy == FailurePolicy::Local {
            let (seen, snapshots): (Vec<Check<'_>>, Vec<Snapshot>) =
                checks.iter().zip(decided).filter_map(|(c, d)| Some((*c, d.as_ref()?.snapshot))).unzip();
            self.ledger.record(&seen, &Reply::new(Vec::new(), snapshots, at), at, epoch);
            // An answered key's charges rode on its server's call: paid (else counted twice, in its
            // snapshot and in the debt, and the next call would tell the remote so).
            let answered = |d: &Debt| {
                checks.iter().zip(decided).any(|(c, decided)| {
                    decided.is_some()
                        && c.scope == &*d.scope
                        && c.key == &*d.key
                        && c.limit.algorithm() == d.limit.algorithm()
                })
            };
            self.paid(debts.iter().filter(|d| answered(d)), at);
        }
        // The policy decides the checks no server answered (after a denial, it only peeks).
        let denied = decided.iter().flatten().any(|d| !d.decision.allowed);
        let unanswered: Vec<usize> = (0..checks.len()).filter(|&i| decided[i].is_none()).collect();
        let asked: Vec<Check<'_>> =
            unanswered.iter().map(|&i| if denied { peek(&checks[i]) } else { checks[i] }).collect();
        let mut policy = self.by_policy(&asked, at)?.into_iter();
        let admitted = !denied && policy.len() == asked.len() && policy.as_slice().iter().all(|d| d.allowed);
        if !admitted && !denied {
            self.give_back(checks, decided).await;
        }
        // An answered check reports what its server said while the request stands as answered
        // there (admitted, or denied there), else what the policy sees of it.
        let seen_by_policy = if admitted || denied {
            Vec::new()
        } else {
            let peeks: Vec<Check<'_>> =
                (0..checks.len()).filter(|&i| decided[i].is_some()).map(|i| peek(&checks[i])).collect();
            self.by_policy(&peeks, at)?
        };
        let mut seen_by_policy = seen_by_policy.into_iter();
        let decisions = decided
            .iter()
            .map(|d| match d {
                Some(d) if admitted || denied => Some(d.decision),
                Some(_) => seen_by_policy.next(),
                None => policy.next(),
            })
            .collect::<Option<Vec<Decision>>>()
            .ok_or(StoreError::NoChecks)?;
        let per_check = decided.iter().map(|d| d.map_or(at, |d| d.snapshot.at)).collect();
        // A hold a server answered stands with its answer.
        let held = if admitted || denied {
            (0..checks.len()).filter(|&i| decided[i].is_some_and(|d| d.held)).collect()
        } else {
            Vec::new()
        };
        Ok(Reserved { decisions, at, per_check, held })
    }

    /// Gives back on the remote what `decided` says stays counted there, unless its server's
    /// breaker is open (then it stays counted: an under-grant).
    async fn give_back(self: &Arc<Self>, checks: &[Check<'_>], decided: &[Option<Decided>]) {
        let refunds: Vec<Refund<'_>> = checks
            .iter()
            .zip(decided)
            .filter_map(|(c, d)| {
                let d = d.filter(|d| d.consumed)?;
                Some(Refund { check: *c, at: d.snapshot.at, decision: d.decision })
            })
            .collect();
        let refunded: Vec<Check<'_>> = refunds.iter().map(|r| r.check).collect();
        let breakers = self.breakers_of(&refunded);
        if refunds.is_empty() || breakers.iter().any(|(_, b)| b.is_open()) {
            return;
        }
        if let Err(error) = self.remote.refund(&refunds).await
            && error.is_backend()
        {
            self.failed(&error, &breakers);
        }
    }
}

/// `check` as a peek.
fn peek<'a>(check: &Check<'a>) -> Check<'a> {
    Check { cost: 0, ..*check }
}
