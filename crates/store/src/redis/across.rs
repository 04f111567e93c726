//! Calls whose keys span Redis Cluster slots: decided slot by slot, all or nothing (what earlier
//! slots admitted is refunded once a later one denies), and charges and refunds grouped by slot.
//!
//! A slot's call may fail (its server down, slow, frozen: the call may still run) after earlier
//! slots admitted. Then the call fails with [`StoreError::Partial`], saying what each answered
//! check's server decided and whether its admission stays counted: a failure policy then keeps
//! those admissions when it admits the request (not charging them again as its own) and gives
//! them back when it denies it; a plain caller ([`Store::reserve`](crate::Store::reserve)) has them
//! given back and gets the failure. A give-back that fails may have run: it is never tried again
//! (for the window family, a refund applied twice would give back twice), and its admission may
//! stay counted (an under-grant). Before, the failure dropped what the slots had answered: the
//! earlier slots' admissions stayed counted, and the failure policy charged them again as its own.

use tollgate_core::{Decision, Snapshot};

use super::{RedisStore, keys};
use crate::remote::{Charge, Decided, Partial, Reply};
use crate::{Check, Refund, Store, StoreError};

/// One slot's share of a call: the indices of its checks in the call, and its charges.
pub(super) struct Group<'a> {
    pub(super) checks: Vec<usize>,
    pub(super) charges: Vec<Charge<'a>>,
}

impl RedisStore {
    /// Records `charges` and decides `checks` all or nothing, whatever slots their keys are in:
    /// one script call when they share one; otherwise slot by slot, in order, and once a slot
    /// denies, what the slots before it admitted is refunded (exactly, unless something else was
    /// admitted there meanwhile: then it stays counted, an under-grant) and every check that did
    /// not block reports its state as a peek would. Charges are recorded in any case. A slot that
    /// fails after others answered fails the call with [`StoreError::Partial`] (see the module
    /// docs); one that fails first, with its own error.
    pub(super) async fn decide_across(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'_>],
    ) -> Result<Reply, StoreError> {
        if let Some(c) = checks.iter().find(|c| c.cost > c.limit.capacity()) {
            return Err(tollgate_core::Error::CostExceedsCapacity { cost: c.cost, capacity: c.limit.capacity() }.into());
        }
        let groups = self.groups(checks, charges)?;
        if groups.len() <= 1 {
            return self.call(checks, charges, &[]).await;
        }
        // Boxed: the slot-by-slot path holds several calls' futures, which the one-slot call (every
        // call on one server) would otherwise carry, and copy, too.
        Box::pin(self.decide_by_slot(checks, &groups)).await
    }

    /// [`decide_across`](Self::decide_across) for keys in several slots (`groups`).
    async fn decide_by_slot(&self, checks: &[Check<'_>], groups: &[Group<'_>]) -> Result<Reply, StoreError> {
        let mut decided: Vec<Option<Decided>> = vec![None; checks.len()];
        let mut admitted: Vec<&[usize]> = Vec::new();
        let mut now_ns = 0;
        let mut denied = false;
        let mut failure: Option<(StoreError, Vec<usize>)> = None;
        for group in groups {
            // After a denial, the remaining slots are only peeked (and charged).
            let sent: Vec<Check<'_>> =
                group.checks.iter().map(|&i| if denied { Check { cost: 0, ..checks[i] } } else { checks[i] }).collect();
            let reply = match self.call(&sent, &group.charges, &[]).await {
                Ok(reply) => reply,
                Err(error) if error.is_backend() => {
                    failure = Some((error, group.checks.clone()));
                    break;
                }
                Err(error) => {
                    // The request's own error (a key holding what tollgate did not write): nothing
                    // of it stays counted.
                    self.give_back(checks, &decided).await;
                    return Err(error);
                }
            };
            now_ns = now_ns.max(reply.now_ns);
            // This slot decided all or nothing itself; after a denial, its checks report as peeks.
            let admits = !denied && reply.decisions.iter().all(|d| d.allowed);
            // Each check keeps its own slot's instant (in its snapshot): a refund needs it.
            for (k, &i) in group.checks.iter().enumerate() {
                let (decision, snapshot, held) = (reply.decisions[k], reply.snapshots[k], reply.held.contains(&k));
                decided[i] = Some(Decided { decision, snapshot, consumed: admits && checks[i].cost > 0, held });
            }
            if admits {
                admitted.push(&group.checks);
            } else {
                denied = true;
            }
        }
        if denied {
            // Given back, slot by slot: what the slots before the denial admitted, with a peek of
            // their keys in the same call.
            for indices in admitted {
                let refunds = refunds_of(checks, &decided, indices);
                let peeks: Vec<Check<'_>> = indices.iter().map(|&i| Check { cost: 0, ..checks[i] }).collect();
                match self.call(&peeks, &[], &refunds).await {
                    Ok(reply) => {
                        for (k, &i) in indices.iter().enumerate() {
                            let (decision, snapshot) = (reply.decisions[k], reply.snapshots[k]);
                            decided[i] = Some(Decided { decision, snapshot, consumed: false, held: false });
                        }
                    }
                    Err(error) => {
                        // It may have run: not tried again (see the module docs).
                        for &i in indices {
                            if let Some(d) = decided[i].as_mut() {
                                d.consumed = false;
                            }
                        }
                        if !error.is_backend() {
                            self.give_back(checks, &decided).await;
                            return Err(error);
                        }
                        failure.get_or_insert((error, indices.to_vec()));
                    }
                }
            }
        }
        match failure {
            None => {
                let held = (0..checks.len()).filter(|&i| decided[i].is_some_and(|d| d.held)).collect();
                let (decisions, snapshots) = decided
                    .into_iter()
                    .map(|d| d.map(|d| (d.decision, d.snapshot)).ok_or(StoreError::NoChecks))
                    .collect::<Result<Vec<(Decision, Snapshot)>, _>>()?
                    .into_iter()
                    .unzip();
                Ok(Reply { decisions, snapshots, now_ns, held })
            }
            // Nothing answered: the failure is the call's own.
            Some((error, _)) if decided.iter().all(Option::is_none) => Err(error),
            Some((error, failed)) => Err(StoreError::Partial(Box::new(Partial { decided, failed, error }))),
        }
    }

    /// Gives back what `decided` says stays counted (best effort: a refund that fails may have run,
    /// and is not tried again).
    pub(super) async fn give_back(&self, checks: &[Check<'_>], decided: &[Option<Decided>]) {
        let all: Vec<usize> = (0..checks.len()).collect();
        let refunds = refunds_of(checks, decided, &all);
        if !refunds.is_empty() {
            let _ = self.refund(&refunds).await;
        }
    }

    /// The call's checks and charges grouped by slot, in order of first appearance (one group on
    /// a single server).
    pub(super) fn groups<'a>(
        &self,
        checks: &[Check<'_>],
        charges: &[Charge<'a>],
    ) -> Result<Vec<Group<'a>>, StoreError> {
        if !self.is_cluster() {
            return Ok(vec![Group { checks: (0..checks.len()).collect(), charges: charges.to_vec() }]);
        }
        let mut slots: Vec<u16> = Vec::new();
        let mut groups: Vec<Group<'a>> = Vec::new();
        let group_of = |c: &Check<'_>, slots: &mut Vec<_>, groups: &mut Vec<Group<'a>>| -> Result<usize, StoreError> {
            let slot = keys::slot(&self.state_key(c.scope, c.key, c.limit)?);
            Ok(slots.iter().position(|s| *s == slot).unwrap_or_else(|| {
                slots.push(slot);
                groups.push(Group { checks: Vec::new(), charges: Vec::new() });
                groups.len() - 1
            }))
        };
        for (i, check) in checks.iter().enumerate() {
            let g = group_of(check, &mut slots, &mut groups)?;
            groups[g].checks.push(i);
        }
        for charge in charges {
            let g = group_of(&charge.check, &mut slots, &mut groups)?;
            groups[g].charges.push(*charge);
        }
        Ok(groups)
    }
}

/// The refunds of the checks among `indices` whose admission stays counted.
fn refunds_of<'a>(checks: &[Check<'a>], decided: &[Option<Decided>], indices: &[usize]) -> Vec<Refund<'a>> {
    indices
        .iter()
        .filter_map(|&i| {
            let d = decided[i].filter(|d| d.consumed)?;
            Some(Refund { check: checks[i], at: d.snapshot.at, decision: d.decision })
        })
        .collect()
}

impl RedisStore {
    /// `items` grouped by the Redis Cluster slot of their check's key, groups in order of first
    /// appearance (one group on a single server).
    pub(super) fn by_slot<T: Copy>(
        &self,
        items: &[T],
        check: impl Fn(&T) -> Check<'_>,
    ) -> Result<Vec<Vec<T>>, StoreError> {
        if !self.is_cluster() {
            return Ok(vec![items.to_vec()]);
        }
        let mut groups: Vec<(u16, Vec<T>)> = Vec::new();
        for item in items {
            let c = check(item);
            let slot = keys::slot(&self.state_key(c.scope, c.key, c.limit)?);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(*item),
                None => groups.push((slot, vec![*item])),
            }
        }
        Ok(groups.into_iter().map(|(_, group)| group).collect())
    }
}
