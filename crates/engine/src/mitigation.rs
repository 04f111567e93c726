//! What the engine does once a key is over: mitigations in force (a key held for its rule's
//! `timeout`, or while over for a `mitigation.match` wider than the rule's `match`), the measured
//! rate ([`rates`](crate::rates)) over its `when_rate_above` condition, the rule's action (429,
//! shadow-ban, route to a quarantine, dry-run's log line), and a store error answered by
//! `on_error`, never silently.
//!
//! [`Engine`]'s methods here, each answering a request that is (or is held) over: `in_force` and
//! `held_answer` (this engine's holds), `over_rate`, `over` (a key going over starts its hold),
//! `routes_for`, `dry_run`, `mitigate` (the rule's action) and `store_failed` (`on_error`). The
//! holds read from the store are in `shared`; the rates themselves in `measure`.

use smallvec::SmallVec;
use tollgate_core::{Algorithm, Decision, Limit};
use tollgate_rules::{Action, OnError, Plan, Request};
use tollgate_store::{Store, StoreError};

use crate::admission::{Admission, Answer, Fields, Pending, Proceed};
use crate::admit::Applies;
use crate::measure::{Rates, rate};
use crate::metrics::Outcome;
use crate::{Engine, Policy};

/// A rule mitigating the request without ending it (sending it to its quarantine, or a dry-run
/// rule holding its key), with the decision to report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) rule: usize,
    pub(crate) decision: Decision,
    pub(crate) rate: Option<f64>,
}

/// The rules sending a request to their quarantine, or dry-run rules holding its key (usually
/// none).
pub(crate) type Routes = SmallVec<[Route; 2]>;

/// A denial that lasts `wait`.
pub(crate) fn denied(rule: &tollgate_rules::Rule, wait: u64) -> Decision {
    Decision { allowed: false, limit: rule.limit.capacity(), remaining: 0, retry_after_ns: wait, reset_after_ns: wait }
}

/// How long a key stays over for a request of cost 1 once `decision` denied one of `cost` under
/// `limit` (nothing being admitted meanwhile): not at all when a unit is left (`remaining`); for
/// cost 1, the denial's wait, which every algorithm computes as the first instant it admits
/// again; for the bucket family, `cost - 1` emission intervals less (one unit frees up every
/// interval); for a fixed window, the window's end (any denial's wait). The sliding window, log
/// and sub-window counters do not tell when one unit (rather than `cost`) frees up: the denial's
/// own wait, at most that much longer than over.
fn while_over(limit: &Limit, decision: &Decision, cost: u64) -> u64 {
    if decision.remaining > 0 {
        return 0;
    }
    let wait = decision.retry_after_ns;
    match limit.algorithm() {
        Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::LeakyBucket => {
            wait.saturating_sub(cost.saturating_sub(1).saturating_mul(limit.emission_interval_ns()))
        }
        _ => wait,
    }
}

impl<S: Store> Engine<S> {
    /// Whether rule `rule` sends what it mitigates to a quarantine (a `route` rule, on a front end
    /// that routes).
    pub(crate) fn routes_for(&self, policy: &Policy, rule: usize) -> bool {
        self.routes && matches!(policy.rules.rules[rule].action, Action::Route { .. })
    }

    /// The answer of a mitigation in force in this engine's table for `request` (a key a rule
    /// holds, see [`over`](Self::over)), if any; route rules are added to `routes` (the request is
    /// still charged to the other rules), dry-run rules are logged and added to `held` (their
    /// limit is not asked: enforced, they would answer the request, charging nothing). `plan` and
    /// `rates` are the counting plan's: a key held only while over (no `timeout`) is not held for
    /// the requests its rule counts, which the limit decides itself.
    /// `request`: none for a caller naming a rule and key, whose mitigating plan is `plan`.
    /// The store's holds are asked next (`shared`).
    pub(crate) fn in_force(
        &self,
        policy: &Policy,
        request: Option<&Request<'_>>,
        plan: &Plan,
        rates: &Rates,
        routes: &mut Routes,
        held: &mut Routes,
    ) -> Option<Answer> {
        if !self.blocks.any() {
            return None;
        }
        let now = self.clock.now_ns();
        let mut of_request = Plan::default();
        let mitigating = match request {
            Some(request) => {
                policy.rules.mitigating_plan(request, &mut of_request);
                &of_request
            }
            None => plan,
        };
        for (rule_index, key, _) in mitigating.iter() {
            let rule = &policy.rules.rules[rule_index];
            let enforcing = rule.action != Action::DryRun;
            let Some(until) = self.blocks.until_for(&rule.name, key, now, enforcing) else { continue };
            let decision = denied(rule, until - now);
            if let Some(answer) = self.held_answer(policy, (rule_index, key, decision), plan, rates, routes, held) {
                return Some(answer);
            }
        }
        None
    }

    /// The answer of rule `rule`'s hold of `key` (`decision`: until its end) for a request
    /// counted by `plan` with `rates`, if it ends the request; otherwise the rule is added to
    /// `routes` or (dry-run, logged) to `held`, or left alone (a hold while over of a key the rule
    /// counts: its limit decides).
    pub(crate) fn held_answer(
        &self,
        policy: &Policy,
        (rule_index, key, decision): (usize, &[u8], Decision),
        plan: &Plan,
        rates: &Rates,
        routes: &mut Routes,
        held: &mut Routes,
    ) -> Option<Answer> {
        let rule = &policy.rules.rules[rule_index];
        let counted = plan.iter().position(|(r, k, _)| r == rule_index && k == key);
        if rule.timeout_ns == 0 && counted.is_some() {
            return None;
        }
        let rate = counted.and_then(|i| rate(rates, i));
        if rule.action == Action::DryRun {
            self.dry_run(policy, rule_index, key, rate);
            held.push(Route { rule: rule_index, decision, rate });
            return None;
        }
        if self.routes_for(policy, rule_index) {
            routes.push(Route { rule: rule_index, decision, rate });
            return None;
        }
        Some(self.mitigate(policy, rule_index, decision, rate))
    }

    /// The rules of `plan` whose key is over their `when_rate_above`: the first reject or
    /// shadow-ban answers the request (its limit is not asked); route rules are added to
    /// `routes`; dry-run ones are logged, and their plan positions added to `flagged` so that they
    /// are not logged twice (those `held` already were).
    pub(crate) async fn over_rate(
        &self,
        policy: &Policy,
        plan: &Plan,
        rates: &Rates,
        flagged: &mut SmallVec<[usize; 4]>,
        routes: &mut Routes,
        held: &Routes,
    ) -> Option<Answer> {
        for (i, (rule_index, key, cost)) in plan.iter().enumerate() {
            let rule = &policy.rules.rules[rule_index];
            let (Some(above), Some(Some(measured))) = (rule.when_rate_above, rates.get(i)) else { continue };
            if measured.rate <= above || held.iter().any(|h| h.rule == rule_index) {
                continue;
            }
            // The rate decays by half every half-life; the retry itself then adds its weight, so
            // the wait is until the rate is that much below the threshold (the rules make the
            // threshold above one request's weight; the floor covers large costs).
            #[allow(clippy::cast_precision_loss)]
            let target = (above - measured.per_unit * cost as f64).max(above / 2.0);
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let wait = ((measured.rate / target).log2() * rule.rate_half_life_ns as f64).ceil() as u64;
            let decision = self.over(policy, rule_index, key, denied(rule, wait), 1).await;
            if rule.action == Action::DryRun {
                self.dry_run(policy, rule_index, key, Some(measured.rate));
                flagged.push(i);
                continue;
            }
            if self.routes_for(policy, rule_index) {
                routes.push(Route { rule: rule_index, decision, rate: Some(measured.rate) });
                continue;
            }
            return Some(self.mitigate(policy, rule_index, decision, Some(measured.rate)));
        }
        None
    }

    /// `key` went over under rule `rule`: `decision` denied a request of `cost` (any action,
    /// dry-run included: it reports what it would hold). The key is held (answered at once by
    /// [`in_force`](Self::in_force)) for the rule's `timeout`, or until the limit admits again if
    /// that is later; without a timeout, while it is over for a request of cost 1
    /// ([`while_over`]) if the rule's `mitigation.match` may select requests it does not count
    /// (otherwise the limit itself says when the key is over: nothing is held, no lookup is
    /// paid). Reported limited by [`top`](Self::top) meanwhile. The decision to answer with: the
    /// whole hold when the timeout outlasts the limit's wait (the next answers say the same).
    /// An enforced rule's hold is put in the store too, before the request is answered (see
    /// `shared`): every engine on the store holds the key from then on; once per hold and node
    /// (a hold this engine keeps already, ending within an eighth of this one, is not put again).
    pub(crate) async fn over(
        &self,
        policy: &Policy,
        rule: usize,
        key: &[u8],
        decision: Decision,
        cost: u64,
    ) -> Decision {
        let (r, wait) = (&policy.rules.rules[rule], decision.retry_after_ns);
        let hold = if r.timeout_ns > 0 {
            r.timeout_ns.max(wait)
        } else if r.mitigation_matcher != r.matcher {
            while_over(&policy.checked[rule], &decision, cost)
        } else {
            0
        };
        let now = self.clock.now_ns();
        if hold > 0 {
            let enforced = r.action != Action::DryRun;
            let end = now.saturating_add(hold);
            // Held here already, about as long (within an eighth of this hold): the store has it
            // (or could not take it), and is not asked again. Without a `timeout` every denial of
            // the requests the rule counts comes here, each with the same end (when the limit
            // admits again, give or take a round trip).
            let known = self.blocks.until_for(&r.name, key, now, true).is_some_and(|until| until >= end - hold / 8);
            let dropped = self.blocks.block(&r.name, key, end, now, enforced);
            self.metrics.blocks_dropped.inc_by(dropped);
            self.metrics.blocked.set(i64::try_from(self.blocks.len()).unwrap_or(i64::MAX));
            if enforced && !known {
                self.share_hold(&r.name, key, hold).await;
            }
        }
        self.rates.limited(&r.name, key, now.saturating_add(r.timeout_ns.max(wait)));
        if r.timeout_ns > wait { denied(r, r.timeout_ns) } else { decision }
    }

    pub(crate) fn dry_run(&self, policy: &Policy, rule: usize, key: &[u8], rate: Option<f64>) {
        self.metrics.count(&policy.counters[rule], Outcome::DryRun);
        tracing::warn!(
            rule = %policy.rules.rules[rule].name,
            key = %String::from_utf8_lossy(key),
            rate_per_s = rate.map(|r| (r * 100.0).round() / 100.0),
            "dry-run: this request is over the limit and would be mitigated"
        );
    }

    /// The answer of rule `rule`'s action to a request over it, whose key's measured rate is
    /// `rate` (if the rule is measured). A `route` rule on a front end that does not route rejects.
    pub(crate) fn mitigate(&self, policy: &Policy, rule: usize, decision: Decision, rate: Option<f64>) -> Answer {
        let r = &policy.rules.rules[rule];
        let fields = || Fields { policy: r.name.clone(), limit: r.limit.clone(), decision, rate_per_s: rate };
        match &r.action {
            Action::ShadowBan { status, body, content_type } => {
                self.metrics.count(&policy.counters[rule], Outcome::ShadowBanned);
                Answer::ShadowBan {
                    status: *status,
                    body: body.clone(),
                    content_type: content_type.clone(),
                    fields: Box::new(fields()),
                }
            }
            Action::Route { upstream } if self.routes => {
                self.metrics.count(&policy.counters[rule], Outcome::Routed);
                Answer::Route { upstream: upstream.clone(), fields: fields() }
            }
            _ => {
                self.metrics.count(&policy.counters[rule], Outcome::Rejected);
                Answer::TooMany(fields())
            }
        }
    }

    /// The store failed for the enforced rules: `on_error` decides, never silently.
    pub(crate) fn store_failed(
        &self,
        policy: &Policy,
        enforced: &[Applies<'_>],
        error: &StoreError,
        pending: Pending,
    ) -> Admission {
        for applied in enforced {
            self.metrics.count(&policy.counters[applied.rule], Outcome::Error);
        }
        match policy.rules.on_error {
            OnError::Reject => {
                tracing::warn!(%error, "store error: request answered 503 (on_error = \"reject\")");
                Admission::Answer(Answer::Unavailable(format!("the rate limiter's store failed: {error}")))
            }
            OnError::Allow => {
                tracing::warn!(%error, "store error: request let through (on_error = \"allow\")");
                Admission::Proceed(Proceed { pending, ..Proceed::free() })
            }
        }
    }
}
