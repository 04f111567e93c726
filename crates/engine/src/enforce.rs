//! The enforced rules of a request, all or nothing: one reservation for all of them, and the
//! action of the first one over its limit. Then the rules on trial (`dry-run`), each on its own
//! and never refusing, counted only when the request was charged (admitted or quarantined): what
//! they would count enforced, as a request another rule refuses consumes nothing anywhere (nor
//! is a key one of them holds, which it would answer enforced, charging nothing). This
//! is the order of every all-or-nothing decision of the engine; Envoy's descriptors follow it
//! too, their `shadow_mode` being the rules' `dry-run` ([`asks`](crate::asks)).
//!
//! A `route` rule does not end the request, it sends it elsewhere: so a rule that rejects (or
//! shadow-bans) wins over it, and a quarantined request is still charged to every other rule (a
//! quarantine that is a cheaper replica must not be a way around them). When only route rules
//! are over, they are set aside and the others reserved again: each round sets aside at least one
//! rule, so there are at most as many rounds as rules. What a quarantined request reserves for
//! `count_status` rules stays counted (its response is the quarantine's, not seen here): an
//! under-grant, never an over-grant.
//!
//! A `count_status` rule refusing a request only because of the reservations in flight (see
//! `settle`) does not act as over: another rule really over acts instead, or the request is
//! refused on its own (a 429 to retry within a second), and nothing is held. A `delay` rule is
//! checked under a shaper as wide as the request may wait (see `waiting`); refused only for want
//! of a place among the requests waiting, the request is not over either.
//!
//! [`Engine`]'s methods here: `enforce_plan` (the rounds), `enforce` (one reservation),
//! `went_over` and `check_dry_run`, called by `admit` for a request more than one plain rule
//! counts.

use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::{Decision, Limit};
use tollgate_rules::{Action, Plan};
use tollgate_store::{Check, Store};

use crate::admission::{Admission, Pending, Proceed, Rare};
use crate::admit::Applies;
use crate::measure::{Rates, rate};
use crate::metrics::Outcome;
use crate::mitigation::{Route, Routes};
use crate::settle::busy;
use crate::waiting::{delays, narrowed, wanted_a_place};
use crate::{Engine, Policy};

impl<S: Store> Engine<S> {
    /// Enforces the rules of `plan`, but those in `routes`, all or nothing; then checks its
    /// dry-run rules (never blocking; `flagged` ones were logged already, `held` ones are not
    /// asked: they say their hold) if the request was charged (see the module docs). The request
    /// has `within_ns` (a delay must end before).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn enforce_plan(
        &self,
        policy: &Arc<Policy>,
        plan: &Plan,
        rates: &Rates,
        flagged: &[usize],
        routes: Routes,
        held: &Routes,
        within_ns: u64,
    ) -> Admission {
        let mut enforced: SmallVec<[Applies<'_>; 4]> = SmallVec::new();
        let mut trials: SmallVec<[(usize, Applies<'_>); 2]> = SmallVec::new();
        for (i, (rule, key, cost)) in plan.iter().enumerate() {
            let applies = Applies { rule, key, cost, rate: rate(rates, i) };
            if policy.rules.rules[rule].action == Action::DryRun {
                trials.push((i, applies));
            } else if !routes.iter().any(|r| r.rule == rule) {
                enforced.push(applies);
            }
        }
        let (admission, charged) = self.enforce(policy, enforced, routes, within_ns).await;
        if !charged || trials.is_empty() {
            return admission;
        }
        let mut pending = Pending::default();
        // What the first dry-run rule would have said (never blocking: admitted), for a caller
        // naming that rule (see `check_named`); the RateLimit fields stay the enforced rules'.
        let mut dry: Option<(usize, Decision)> = None;
        for (i, applies) in trials {
            let said = match held.iter().find(|h| h.rule == applies.rule) {
                Some(hold) => Some((hold.rule, hold.decision)),
                None => self.check_dry_run(policy, applies, &mut pending, flagged.contains(&i)).await,
            };
            dry = dry.or(said.map(|(rule, decision)| (rule, Decision { allowed: true, ..decision })));
        }
        match admission {
            Admission::Proceed(mut proceed) => {
                proceed.pending.take(pending);
                if dry.is_some() {
                    proceed.rare.get_or_insert_default().dry_run = dry;
                }
                Admission::Proceed(proceed)
            }
            // Quarantined: its reservations stay counted, as the enforced rules' do.
            answer => answer,
        }
    }

    /// Reserves `enforced` all or nothing (see the module docs); `routes` already send the
    /// request to a quarantine. Whether the request was charged (admitted or quarantined).
    async fn enforce(
        &self,
        policy: &Arc<Policy>,
        mut enforced: SmallVec<[Applies<'_>; 4]>,
        mut routes: Routes,
        within_ns: u64,
    ) -> (Admission, bool) {
        let mut pending = Pending::default();
        // A place among the requests waiting for their slot, if a delay rule may make it wait.
        let mut place = if enforced.iter().any(|a| delays(policy, a.rule)) { self.places.take() } else { None };
        loop {
            if enforced.is_empty() {
                let admission = match routes.first() {
                    Some(route) => Admission::Answer(self.mitigate(policy, route.rule, route.decision, route.rate)),
                    None => Admission::Proceed(Proceed::free()),
                };
                return (admission, true);
            }
            let shapers: SmallVec<[Option<Limit>; 4]> =
                enforced.iter().map(|a| narrowed(policy, a.rule, place.is_some(), within_ns)).collect();
            let checks: SmallVec<[Check<'_>; 4]> = enforced
                .iter()
                .zip(&shapers)
                .map(|(a, shaper)| {
                    let limit = shaper.as_ref().unwrap_or(&policy.checked[a.rule]);
                    let check = Check::new(a.key, limit, a.cost).scoped(&policy.rules.rules[a.rule].name);
                    // A rule with a timeout: its hold, read in the same call (see `shared`).
                    if policy.shares.counted(a.rule) { check.with_hold() } else { check }
                })
                .collect();
            let reserved = match self.counted(self.store.reserve(&checks).await) {
                Ok(reserved) => reserved,
                Err(error) => return (self.store_failed(policy, &enforced, &error, pending), false),
            };
            let decisions = &reserved.decisions;
            let over = |i: &usize| !decisions[*i].allowed;
            // Over by a hold in the store (put there by this engine or another): kept in this
            // engine's table, not held anew.
            let by_hold = |i: usize| reserved.is_held(i);

            // The first rule over its limit that does not route acts; the request goes no further.
            // A refusal not owed to the key being over (reservations in flight under a
            // `count_status` rule; no place left among the requests waiting, under a delay rule
            // that would have let it wait) acts only if no other rule is over: a 429 of the
            // request's own, holding nothing.
            let refusing = |i: &usize| over(i) && !self.routes_for(policy, enforced[*i].rule);
            let not_over = |i: &usize| {
                let (applies, decision) = (&enforced[*i], decisions[*i]);
                if by_hold(*i) {
                    return None;
                }
                if self.only_in_flight(policy, applies, &decision) {
                    return Some(busy(decision));
                }
                (place.is_none() && wanted_a_place(policy, applies.rule, within_ns, &decision)).then_some(decision)
            };
            if let Some(i) = (0..enforced.len()).filter(refusing).find(|i| not_over(i).is_none()) {
                let applies = enforced[i];
                let decision = self.went_over(policy, applies, decisions[i], by_hold(i)).await;
                return (Admission::Answer(self.mitigate(policy, applies.rule, decision, applies.rate)), false);
            }
            if let Some((i, decision)) = (0..enforced.len()).filter(refusing).find_map(|i| Some((i, not_over(&i)?))) {
                let applies = enforced[i];
                let answer = self.refuse_busy(policy, applies.rule, decision, applies.rate);
                return (Admission::Answer(answer), false);
            }
            if decisions.iter().any(|d| !d.allowed) {
                // Only route rules are over: set them aside, and charge the others again.
                let mut kept = SmallVec::new();
                for (i, (applies, decision)) in enforced.iter().zip(decisions).enumerate() {
                    if decision.allowed {
                        kept.push(*applies);
                    } else {
                        let decision = match not_over(&i) {
                            Some(decision) => decision,
                            None => self.went_over(policy, *applies, *decision, by_hold(i)).await,
                        };
                        routes.push(Route { rule: applies.rule, decision, rate: applies.rate });
                    }
                }
                enforced = kept;
                continue;
            }

            // Everything admitted: the request proceeds (or goes to its quarantine, charged).
            let mut delay = 0;
            for (i, (applies, decision)) in enforced.iter().zip(decisions).enumerate() {
                let rule = &policy.rules.rules[applies.rule];
                let wait = match rule.action {
                    Action::Delay { .. } => decision.reset_after_ns.saturating_sub(rule.limit.tolerance_ns()),
                    _ => 0,
                };
                self.metrics
                    .count(&policy.counters[applies.rule], if wait > 0 { Outcome::Delayed } else { Outcome::Allowed });
                delay = delay.max(wait);
                if rule.settles_after() && routes.is_empty() {
                    let reserved_at = reserved.instant(i);
                    pending.hold(policy, (applies.rule, applies.key, applies.cost), reserved_at, *decision);
                }
            }
            if let Some(route) = routes.first() {
                return (Admission::Answer(self.mitigate(policy, route.rule, route.decision, route.rate)), true);
            }
            let tightest = enforced.iter().zip(decisions).min_by_key(|(_, d)| d.remaining).map(|(a, d)| (a.rule, *d));
            // The place is kept while the request waits, given back at once otherwise.
            let rare =
                if delay > 0 { place.take().map(|w| Box::new(Rare { dry_run: None, waiting: Some(w) })) } else { None };
            let proceed = Proceed { delay: Duration::from_nanos(delay), tightest, pending, rare };
            return (Admission::Proceed(proceed), true);
        }
    }

    /// `applies` was refused as over by `decision`: a hold the store answered (`by_hold`) is kept
    /// in this engine's table; otherwise the key is held anew ([`over`](Self::over)). The
    /// decision to answer with.
    async fn went_over(&self, policy: &Policy, applies: Applies<'_>, decision: Decision, by_hold: bool) -> Decision {
        if by_hold {
            self.held_by_store(policy, applies.rule, applies.key, &decision);
            return decision;
        }
        self.over(policy, applies.rule, applies.key, decision, applies.cost).await
    }

    /// Checks a dry-run rule on its own; `flagged`: already logged as over its `when_rate_above`.
    /// The decision it would have made, if the store gave one. Refused only because of the
    /// reservations in flight, it would not have been over: logged, nothing held.
    pub(crate) async fn check_dry_run(
        &self,
        policy: &Arc<Policy>,
        applied: Applies<'_>,
        pending: &mut Pending,
        flagged: bool,
    ) -> Option<(usize, Decision)> {
        let rule = &policy.rules.rules[applied.rule];
        let check = Check::new(applied.key, &policy.checked[applied.rule], applied.cost).scoped(&rule.name);
        match self.counted(self.store.reserve(&[check]).await) {
            Ok(reserved) if !reserved.decisions[0].allowed => {
                let refused = reserved.decisions[0];
                // Held as enforced (its timeout): reported limited and `dry_run` meanwhile.
                let decision = if self.only_in_flight(policy, &applied, &refused) {
                    busy(refused)
                } else {
                    self.over(policy, applied.rule, applied.key, refused, applied.cost).await
                };
                if !flagged {
                    self.dry_run(policy, applied.rule, applied.key, applied.rate);
                }
                Some((applied.rule, decision))
            }
            Ok(reserved) => {
                // A request already logged as over `when_rate_above` is counted once, as dry_run.
                if !flagged {
                    self.metrics.count(&policy.counters[applied.rule], Outcome::Allowed);
                }
                if rule.settles_after() {
                    let what = (applied.rule, applied.key, applied.cost);
                    pending.hold(policy, what, reserved.at, reserved.decisions[0]);
                }
                Some((applied.rule, reserved.decisions[0]))
            }
            Err(error) => {
                self.metrics.count(&policy.counters[applied.rule], Outcome::Error);
                tracing::warn!(rule = %rule.name, %error, "store error; the dry-run rule is not counted");
                None
            }
        }
    }
}
