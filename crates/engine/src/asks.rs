//! The store half of deciding Envoy's descriptors (see `descriptors`): the checks of the
//! descriptors that have a limit, decided in the order the engine decides a request's rules
//! (`enforce`): the enforced checks all or nothing, in one store call; then the shadow ones
//! (Envoy's `shadow_mode`, the rules' `dry-run`: reported, never refusing) each on its own,
//! counted only when the request was admitted. Unlike a rule, a descriptor's status is reported
//! for every check: when the request is refused, those that did not refuse it report their state
//! as a peek would (they consumed nothing).
//!
//! **Quota mode.** An enforced check in `quota_mode` refuses the request only together with
//! every other quota-mode descriptor of the request. The group is decided by rounds of the same
//! all-or-nothing call, so that no charge is ever undone: the enforced checks and the quota ones
//! still in; if the call is denied by quota checks only, those are out (over their limit, their
//! denial is their answer, they consume nothing) and the call is made again with the rest. The
//! request is refused when an ordinary enforced check denies, or when no quota check is left in
//! (and none of the request's quota-mode descriptors is within by nature: see
//! [`decide`]'s `quota_met`). Each round leaves one quota check out at least, so a request makes at
//! most one call more than it has quota checks over their limit (usually two calls: a store that
//! decides in one script reports every check that denies). Between two rounds other requests
//! may consume: a quota check is judged by the round that found it over (it is not asked again
//! if its window turns meanwhile), and the last round charges atomically what it admits; if that
//! round is denied too, nothing is consumed.

use tollgate_core::Decision;
use tollgate_store::{Check, Store, StoreError};

/// One check of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask<'a> {
    /// Its key, limit, scope and cost.
    pub(crate) check: Check<'a>,
    /// Reported, never refusing (Envoy's `shadow_mode`).
    pub(crate) shadow: bool,
    /// Refusing only with every other quota-mode descriptor (Envoy's `quota_mode`).
    pub(crate) quota: bool,
}

/// What the engine decided for a request's asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    /// Whether the request was admitted (every ordinary enforced ask admitted, some quota ask
    /// within if it has any, and not refused before).
    pub(crate) admitted: bool,
    /// One decision per ask, in order: an enforced ask's own (denied if it refused the request
    /// or, in quota mode, was over its limit; else its state, consumed only if the request was
    /// admitted); a shadow ask's (consumed only if the request was admitted; a denial refuses
    /// nothing).
    pub(crate) decisions: Vec<Decision>,
}

/// Decides `asks` on `store` (see the module docs). `refused`: the request is refused already (a
/// descriptor always over its limit): nothing is consumed, every ask reports as a peek.
/// `quota_met`: a quota-mode descriptor of the request is never over (one in shadow mode), so
/// the quota asks never refuse it.
pub(crate) async fn decide<T: Store>(
    store: &T,
    asks: &[Ask<'_>],
    refused: bool,
    quota_met: bool,
) -> Result<Asked, StoreError> {
    let mut decided: Vec<Option<Decision>> = vec![None; asks.len()];
    // The enforced asks still in the group, by index; a quota ask found over leaves it.
    let mut group: Vec<usize> = (0..asks.len()).filter(|&i| !asks[i].shadow).collect();
    let had_quota = group.iter().any(|&i| asks[i].quota);
    let admitted = loop {
        let checks: Vec<Check<'_>> =
            group.iter().map(|&i| if refused { Check { cost: 0, ..asks[i].check } } else { asks[i].check }).collect();
        let answers = if checks.is_empty() { Vec::new() } else { store.check_all(&checks).await? };
        if answers.len() != group.len() {
            return Err(StoreError::NoChecks);
        }
        let denied_quota: Vec<usize> =
            group.iter().zip(&answers).filter(|&(&i, d)| !d.allowed && asks[i].quota).map(|(&i, _)| i).collect();
        let refused_here = group.iter().zip(&answers).any(|(&i, d)| !d.allowed && !asks[i].quota);
        for (&i, answer) in group.iter().zip(&answers) {
            decided[i] = Some(*answer);
        }
        if refused || refused_here || denied_quota.is_empty() {
            // Decided: admitted if nothing denied (and not refused before).
            break !refused && !refused_here && answers.iter().all(|d| d.allowed);
        }
        // Only quota asks denied: they are over, and out of the group.
        group.retain(|i| !denied_quota.contains(i));
        if had_quota && !quota_met && !group.iter().any(|&i| asks[i].quota) {
            // Every quota ask is over: refused. The others' answers were peeks (the call was
            // denied), so nothing was consumed.
            break false;
        }
    };
    let mut decisions = Vec::with_capacity(asks.len());
    for (ask, decided) in asks.iter().zip(decided) {
        decisions.push(if ask.shadow {
            let counted = if admitted { ask.check } else { Check { cost: 0, ..ask.check } };
            store.check_one(counted).await?
        } else {
            decided.ok_or(StoreError::NoChecks)?
        });
    }
    Ok(Asked { admitted, decisions })
}
