//! Counts carried across a reload that changes a rule's algorithm.
//!
//! A key's state lives in the store under (scope, algorithm, key): a rule that keeps its name
//! and algorithm keeps its counts as they are (the new limit reads them); one whose algorithm
//! changes finds its new state empty. So the reload remembers, per rule, the limits its state
//! was kept under before ([`Carry`]), for as long as such a state can hold anything (a full
//! bucket or two windows, and a second): the first request of a key after the reload carries
//! the key's use into the new algorithm's state ([`Store::carry`]: atomically, once; what the old
//! state used at that instant, never more), before it is decided. A key nobody asks for is never
//! carried, and its old state expires as it would have. Each request of such a rule costs one
//! more store call while the old states can hold anything.
//!
//! A request admitted before the reload and settled after it (a `count_status` reservation)
//! gives back to the old state: if that was carried already, the reservation stays counted in
//! the new one (an under-grant, never an over-grant).
//!
//! [`Engine`]'s methods here: `carry_plan` and `carry_key`, asked by `admit` before a request of
//! such a rule is decided, and by `direct` for a named limit.

use std::sync::atomic::{AtomicBool, Ordering};

use smallvec::SmallVec;
use tollgate_core::Limit;
use tollgate_rules::Plan;
use tollgate_store::{Store, StoreError};

use crate::{Engine, Policy};

/// A limit a rule's state was kept under before a reload, carried from until `until_ns`.
#[derive(Debug, Clone)]
pub(crate) struct Carry {
    pub(crate) from: Limit,
    pub(crate) until_ns: u64,
}

/// Per rule of a policy, the limits to carry its keys' use from (usually none).
#[derive(Debug, Default)]
pub(crate) struct Carries {
    per_rule: Vec<SmallVec<[Carry; 1]>>,
    /// Whether any rule has one.
    pub(crate) any: bool,
    /// Whether a store that cannot carry was reported (once per policy).
    warned: AtomicBool,
}

/// How long after a reload a state kept under `limit` can still hold anything: a full bucket, or
/// two windows (the sliding window counter's previous one), and a second.
fn horizon(limit: &Limit) -> u64 {
    limit.tolerance_ns().max(limit.period_ns().saturating_mul(2)).saturating_add(1_000_000_000)
}

impl Carries {
    /// The carries of `policy`'s rules (`checked`: the limits their states are kept under) after
    /// `previous`, reloaded at `now`: each rule named as before whose state's algorithm changed
    /// carries from the old one, and from the old ones `previous` still carried from (another
    /// algorithm than the new one's, newest first).
    pub(crate) fn after(policy_rules: &tollgate_rules::Rules, checked: &[Limit], previous: &Policy, now: u64) -> Self {
        let mut per_rule = Vec::with_capacity(checked.len());
        for (rule, to) in policy_rules.rules.iter().zip(checked) {
            let mut carries: SmallVec<[Carry; 1]> = SmallVec::new();
            if let Some((old, _)) = previous.rules.named(&rule.name) {
                let before = std::iter::once(Carry {
                    from: previous.checked[old].clone(),
                    until_ns: now.saturating_add(horizon(&previous.checked[old])),
                })
                .chain(previous.carries.per_rule[old].iter().filter(|c| c.until_ns > now).cloned());
                for carry in before {
                    let algorithm = carry.from.algorithm();
                    if algorithm != to.algorithm() && !carries.iter().any(|c| c.from.algorithm() == algorithm) {
                        carries.push(carry);
                    }
                }
            }
            per_rule.push(carries);
        }
        let any = per_rule.iter().any(|c| !c.is_empty());
        Carries { per_rule, any, warned: AtomicBool::new(false) }
    }

    /// No carries (a policy's first rules).
    pub(crate) fn none(rules: usize) -> Self {
        Carries { per_rule: (0..rules).map(|_| SmallVec::new()).collect(), any: false, warned: AtomicBool::new(false) }
    }
}

impl<S: Store> Engine<S> {
    /// Carries the use of every key of `plan` whose rule's algorithm changed on a recent reload
    /// into its new state, before the plan is decided (see the module docs). A store error is
    /// logged and counted; the request is decided on the new state as it is, and the old state
    /// stays, to be carried by a later request.
    pub(crate) async fn carry_plan(&self, policy: &Policy, plan: &Plan) {
        if !policy.carries.any {
            return;
        }
        let now = self.clock.now_ns();
        for (rule, key, _) in plan.iter() {
            self.carry_key(policy, rule, key, now).await;
        }
    }

    /// [`carry_plan`](Self::carry_plan) of one key of rule `rule`.
    pub(crate) async fn carry_key(&self, policy: &Policy, rule: usize, key: &[u8], now: u64) {
        let name = &policy.rules.rules[rule].name;
        for carry in policy.carries.per_rule[rule].iter().filter(|c| c.until_ns > now) {
            match self.store.carry(name, key, &carry.from, &policy.checked[rule]).await {
                Ok(_) => {}
                Err(error @ StoreError::Unsupported(_)) => {
                    if !policy.carries.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(rule = %name, %error, "the rule's algorithm changed: its counts start anew");
                    }
                }
                Err(error) => {
                    self.metrics.store_error(&error);
                    tracing::warn!(rule = %name, %error, "the rule's algorithm changed: a key's count was not carried yet");
                }
            }
        }
    }
}
