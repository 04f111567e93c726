//! Holds shared through the store: an enforced rule's hold lives beside its counts
//! ([`Store::hold`]), so that every engine on the store (the nodes of a fleet sharing Redis, a
//! node restarted) holds the key as the one that put it over. This engine's own table (`blocks`)
//! is a cache in front of it: a hold it knows is answered without asking the store.
//!
//! - **Installed** by the engine that sees the key go over, before it answers the request that
//!   did (one store call per hold and node: later requests of the key are answered from the
//!   table). A store that cannot (failing, or keeping no holds) leaves the hold in this engine's
//!   table alone, as before holds were shared.
//! - **Read in the decision's own call** by the requests a rule with a `timeout` counts: each of
//!   its checks asks for its hold ([`Check::hold`]), and a live one denies the request, charging
//!   nothing, with the rest of the hold as its retry ([`Reserved::held`](tollgate_store::Reserved));
//!   the engine then keeps it in its table too. On Redis: one more key read by the same script.
//! - **Read by a peek** for the requests a rule only mitigates (its `mitigation.match` selects
//!   requests its `match` does not: every request of an IP held after failed logins): one store
//!   call ([`Store::held`]: on Redis one script call, on the memory store a table read) before
//!   the request is counted, made only for such rules, only for keys this engine does not hold
//!   already.
//! - **Dry-run holds stay in this engine** (a rule on trial changes nothing an enforced rule
//!   decides, on any node): its nodes each report what they saw go over.
//!
//! [`Engine`]'s methods here: `share_hold` (installing), `held_by_store` (a hold read in the
//! decision's call, kept in the table) and `in_store` (the peek).

use smallvec::SmallVec;
use tollgate_core::Decision;
use tollgate_rules::{Action, Plan, Request, Rules};
use tollgate_store::{Check, Store};

use crate::admission::Answer;
use crate::measure::Rates;
use crate::mitigation::{Routes, denied};
use crate::{Engine, Policy};

/// Per rule, how its holds are read from the store.
#[derive(Debug, Default)]
pub(crate) struct Shares {
    /// The requests it counts ask for its hold in their decision (an enforced rule with a
    /// `timeout`: its hold outlasts its limit's denials).
    counted: Vec<bool>,
    /// The requests it only mitigates peek at its hold (an enforced rule whose `mitigation.match`
    /// may select requests its `match` does not).
    mitigated: Vec<bool>,
    /// Whether any rule's mitigated requests peek (none: requests skip the mitigating plan
    /// until this engine holds a key).
    pub(crate) peeks: bool,
}

impl Shares {
    /// The shares of `rules`.
    pub(crate) fn of(rules: &Rules) -> Shares {
        let enforced = |r: &tollgate_rules::Rule| r.action != Action::DryRun;
        let counted: Vec<bool> = rules.rules.iter().map(|r| enforced(r) && r.timeout_ns > 0).collect();
        let mitigated: Vec<bool> =
            rules.rules.iter().map(|r| enforced(r) && r.mitigation_matcher != r.matcher).collect();
        let peeks = mitigated.iter().any(|&m| m);
        Shares { counted, mitigated, peeks }
    }

    /// Whether the requests rule `rule` counts ask for its hold.
    pub(crate) fn counted(&self, rule: usize) -> bool {
        self.counted.get(rule).copied().unwrap_or(false)
    }
}

impl<S: Store> Engine<S> {
    /// Puts the hold of `key` under rule `name`, `hold_ns` from now, in the store (see the module
    /// docs); a store that cannot leaves it in this engine's table alone.
    pub(crate) async fn share_hold(&self, name: &str, key: &[u8], hold_ns: u64) {
        // Boxed: rare (once per hold and node), and inline it would grow every request's future.
        if let Err(error) = Box::pin(self.store.hold(name, key, hold_ns)).await {
            tracing::debug!(rule = name, %error, "the hold stays on this node: the store did not take it");
        }
    }

    /// A hold the store answered for `key` under rule `rule` (its decision giving the rest of the
    /// hold), kept in this engine's table too: its next requests are answered without the store.
    pub(crate) fn held_by_store(&self, policy: &Policy, rule: usize, key: &[u8], decision: &Decision) {
        let name = &policy.rules.rules[rule].name;
        let now = self.clock.now_ns();
        let until = now.saturating_add(decision.retry_after_ns);
        let dropped = self.blocks.block(name, key, until, now, true);
        self.metrics.blocks_dropped.inc_by(dropped);
        self.metrics.blocked.set(i64::try_from(self.blocks.len()).unwrap_or(i64::MAX));
        self.rates.limited(name, key, until);
    }

    /// The answer of a hold in force in the store for `request` (see
    /// [`in_force`](Self::in_force), which asked this engine's table), among the rules that only
    /// mitigate it (see the module docs): those not counted by `plan`, whose keys this engine
    /// does not hold already. Each hold found is kept in this engine's table. A store error holds
    /// nothing (the table answered what it knew; the request's decision meets the store again).
    pub(crate) async fn in_store(
        &self,
        policy: &Policy,
        request: &Request<'_>,
        plan: &Plan,
        rates: &Rates,
        routes: &mut Routes,
        held: &mut Routes,
    ) -> Option<Answer> {
        let now = self.clock.now_ns();
        let mut mitigating = Plan::default();
        policy.rules.mitigating_plan(request, &mut mitigating);
        let asked: SmallVec<[(usize, &[u8]); 2]> = mitigating
            .iter()
            .filter(|&(rule, key, _)| {
                policy.shares.mitigated.get(rule).copied().unwrap_or(false)
                    && !plan.iter().any(|(r, k, _)| r == rule && k == key)
                    && self.blocks.until_for(&policy.rules.rules[rule].name, key, now, true).is_none()
            })
            .map(|(rule, key, _)| (rule, key))
            .collect();
        if asked.is_empty() {
            return None;
        }
        let peeks: SmallVec<[Check<'_>; 2]> = asked
            .iter()
            .map(|&(rule, key)| {
                Check::new(key, &policy.checked[rule], 0).scoped(&policy.rules.rules[rule].name).with_hold()
            })
            .collect();
        let left = match self.store.held(&peeks).await {
            Ok(left) => left,
            Err(error) => {
                tracing::debug!(%error, "the store's holds could not be read: this node's alone apply");
                return None;
            }
        };
        for (&(rule, key), left) in asked.iter().zip(left) {
            let Some(left) = left.filter(|&left| left > 0) else { continue };
            let decision = denied(&policy.rules.rules[rule], left);
            self.held_by_store(policy, rule, key, &decision);
            if let Some(answer) = self.held_answer(policy, (rule, key, decision), plan, rates, routes, held) {
                return Some(answer);
            }
        }
        None
    }
}
