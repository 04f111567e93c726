//! Calls whose keys span Redis Cluster slots: decided slot by slot, all or nothing (what earlier
//! slots admitted is refunded once a later one denies), and charges and refunds grouped by slot.

use tollgate_core::{Decision, Snapshot};

use super::{RedisStore, keys};
use crate::remote::{Charge, Reply};
use crate::{Check, Refund, StoreError};

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
    /// not block reports its state as a peek would. Charges are recorded in any case.
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
        let mut decisions: Vec<Option<Decision>> = vec![None; checks.len()];
        let mut snapshots = vec![Snapshot::default(); checks.len()];
        let mut admitted: Vec<(Vec<usize>, u64)> = Vec::new();
        let mut now_ns = 0;
        let mut denied = false;
        for group in &groups {
            // After a denial, the remaining slots are only peeked (and charged).
            let sent: Vec<Check<'_>> =
                group.checks.iter().map(|&i| if denied { Check { cost: 0, ..checks[i] } } else { checks[i] }).collect();
            let reply = self.call(&sent, &group.charges, &[]).await?;
            now_ns = now_ns.max(reply.now_ns);
            // Each check keeps its own slot's instant (in its snapshot): a refund needs it.
            for (k, &i) in group.checks.iter().enumerate() {
                decisions[i] = Some(reply.decisions[k]);
                snapshots[i] = reply.snapshots[k];
            }
            if !denied && reply.decisions.iter().all(|d| d.allowed) {
                admitted.push((group.checks.clone(), reply.now_ns));
            } else if !denied {
                denied = true;
                // This slot decided all or nothing itself; its checks that did not block already
                // report as peeks.
            }
        }
        if denied {
            for (indices, at) in &admitted {
                let refunds: Vec<Refund<'_>> = indices
                    .iter()
                    .filter_map(|&i| decisions[i].map(|decision| Refund { check: checks[i], at: *at, decision }))
                    .collect();
                self.call(&[], &[], &refunds).await?;
                let peeks: Vec<Check<'_>> = indices.iter().map(|&i| Check { cost: 0, ..checks[i] }).collect();
                let reply = self.call(&peeks, &[], &[]).await?;
                for (k, &i) in indices.iter().enumerate() {
                    decisions[i] = Some(reply.decisions[k]);
                    snapshots[i] = reply.snapshots[k];
                }
            }
        }
        let decisions = decisions.into_iter().map(|d| d.ok_or(StoreError::NoChecks)).collect::<Result<_, _>>()?;
        Ok(Reply { decisions, snapshots, now_ns })
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
