//! What the engine does once a key is over: mitigations in force (a rule's `timeout`), the
//! measured rate ([`rates`](crate::rates)) and its `when_rate_above` condition, the rule's action
//! (429, shadow-ban, route to a quarantine, dry-run's log line), and a store error answered by
//! `on_error`, never silently.

use std::sync::Arc;

use smallvec::SmallVec;
use tollgate_core::Decision;
use tollgate_rules::{Action, OnError, Plan, Request};
use tollgate_store::{Store, StoreError};

use crate::admission::{Admission, Answer, Fields, Pending, Proceed};
use crate::metrics::Outcome;
use crate::rates::{Measured, Talker};
use crate::{Applies, Engine, EngineError, Policy};

/// The measured rate of each rule of a plan, in plan order (`None` for a rule not measured;
/// empty when no rule is).
pub(crate) type Rates = SmallVec<[Option<Measured>; 4]>;

/// The rate of the plan's `i`-th rule, if measured.
pub(crate) fn rate(rates: &Rates, i: usize) -> Option<f64> {
    rates.get(i).copied().flatten().map(|m| m.rate)
}

/// A rule sending the request to its quarantine, with the decision to report.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) rule: usize,
    pub(crate) decision: Decision,
    pub(crate) rate: Option<f64>,
}

/// The rules sending a request to their quarantine (usually none).
pub(crate) type Routes = SmallVec<[Route; 2]>;

/// A denial that lasts `wait`.
fn denied(rule: &tollgate_rules::Rule, wait: u64) -> Decision {
    Decision { allowed: false, limit: rule.limit.capacity(), remaining: 0, retry_after_ns: wait, reset_after_ns: wait }
}

impl<S: Store> Engine<S> {
    /// Counts the request in the measured rate of every measured rule of `plan` (none if it was
    /// refused).
    pub(crate) fn measure(&self, policy: &Policy, plan: &Plan, planned: bool) -> Rates {
        if !planned || !policy.measures || plan.is_empty() {
            return Rates::new();
        }
        let now = self.clock.now_ns();
        plan.iter()
            .map(|(rule, key, cost)| {
                let r = &policy.rules.rules[rule];
                r.measured.then(|| self.rates.record(&policy.names[rule], r.rate_half_life_ns, key, cost, now))
            })
            .collect()
    }

    /// Whether rule `rule` sends what it mitigates to a quarantine (a `route` rule, on a front end
    /// that routes).
    pub(crate) fn routes_for(&self, policy: &Policy, rule: usize) -> bool {
        self.routes && matches!(policy.rules.rules[rule].action, Action::Route { .. })
    }

    /// The answer of a mitigation in force for `request` (a key a rule blocked for its
    /// `timeout`), if any; dry-run rules only log, and route rules are added to `routes` (the
    /// request is still charged to the other rules). `plan` and `rates` are the counting plan's,
    /// for the rate to report.
    /// `request`: none for a caller naming a rule and key, whose mitigating plan is `plan`.
    pub(crate) fn in_force(
        &self,
        policy: &Policy,
        request: Option<&Request<'_>>,
        plan: &Plan,
        rates: &Rates,
        routes: &mut Routes,
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
            let Some(until) = self.blocks.until(&rule.name, key, now) else { continue };
            let rate = plan.iter().position(|(r, k, _)| r == rule_index && k == key).and_then(|i| rate(rates, i));
            if rule.action == Action::DryRun {
                self.dry_run(policy, rule_index, key, rate);
                continue;
            }
            let decision = denied(rule, until - now);
            if self.routes_for(policy, rule_index) {
                routes.push(Route { rule: rule_index, decision, rate });
                continue;
            }
            return Some(self.mitigate(policy, rule_index, decision, rate));
        }
        None
    }

    /// The rules of `plan` whose key is over their `when_rate_above`: the first reject or
    /// shadow-ban answers the request (its limit is not asked); route rules are added to
    /// `routes`; dry-run ones are logged, and their plan positions added to `flagged` so that they
    /// are not logged twice.
    pub(crate) fn over_rate(
        &self,
        policy: &Policy,
        plan: &Plan,
        rates: &Rates,
        flagged: &mut SmallVec<[usize; 4]>,
        routes: &mut Routes,
    ) -> Option<Answer> {
        for (i, (rule_index, key, cost)) in plan.iter().enumerate() {
            let rule = &policy.rules.rules[rule_index];
            let (Some(above), Some(Some(measured))) = (rule.when_rate_above, rates.get(i)) else { continue };
            if measured.rate <= above {
                continue;
            }
            // The rate decays by half every half-life; the retry itself then adds its weight, so
            // the wait is until the rate is that much below the threshold (the rules make the
            // threshold above one request's weight; the floor covers large costs).
            #[allow(clippy::cast_precision_loss)]
            let target = (above - measured.per_unit * cost as f64).max(above / 2.0);
            #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let wait = ((measured.rate / target).log2() * rule.rate_half_life_ns as f64).ceil() as u64;
            if rule.action == Action::DryRun {
                self.rates.limited(&rule.name, key, self.clock.now_ns().saturating_add(wait));
                self.dry_run(policy, rule_index, key, Some(measured.rate));
                flagged.push(i);
                continue;
            }
            self.over(policy, rule_index, key, wait);
            let decision = denied(rule, wait);
            if self.routes_for(policy, rule_index) {
                routes.push(Route { rule: rule_index, decision, rate: Some(measured.rate) });
                continue;
            }
            return Some(self.mitigate(policy, rule_index, decision, Some(measured.rate)));
        }
        None
    }

    /// `key` went over under rule `rule` for `wait`: blocked for the rule's `timeout` (if any),
    /// and reported limited by [`top`](Self::top).
    pub(crate) fn over(&self, policy: &Policy, rule: usize, key: &[u8], wait: u64) {
        let rule = &policy.rules.rules[rule];
        let now = self.clock.now_ns();
        let until = now.saturating_add(rule.timeout_ns.max(wait));
        if rule.timeout_ns > 0 {
            let dropped = self.blocks.block(&rule.name, key, until, now);
            self.metrics.blocks_dropped.inc_by(dropped);
            self.metrics.blocked.set(i64::try_from(self.blocks.len()).unwrap_or(i64::MAX));
        }
        self.rates.limited(&rule.name, key, until);
    }

    /// The keys of rule `name` with the highest measured rates, highest first (at most `n`, at
    /// most 100).
    pub fn top(&self, name: &str, n: usize) -> Result<Vec<Talker>, EngineError> {
        let policy = self.policy.load();
        let (_, rule) = policy.rules.named(name).ok_or_else(|| EngineError::UnknownRule(name.to_string()))?;
        if !rule.measured {
            return Err(EngineError::NotMeasured(name.to_string()));
        }
        Ok(self.rates.top(name, n, rule.when_rate_above, self.clock.now_ns()))
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

/// Keeps `Arc` in use for the names the rates are scoped by.
pub(crate) fn names(rules: &tollgate_rules::Rules) -> Vec<Arc<str>> {
    rules.rules.iter().map(|r| Arc::from(r.name.as_str())).collect()
}
