//! Deciding a request: [`Engine::admit`], [`Engine::admit_within`] and [`Engine::admit_now`]
//! (the same decision, for a store that decides in place: its steps in line, the usual single
//! plain rule checked without a future, the rarer paths polled once), timed by
//! [`Engine::timed`] (`admit_now` alike); then `decide_plan`, the order every decision follows
//! (the measured rates, mitigations in force, the plan, the rates over `when_rate_above`,
//! carries, then the store), with the usual case of one plain rule decided here (`admit_one`)
//! and the others handed to `enforce`. What is decided is typed in `admission` ([`Admission`]).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::Decision;
use tollgate_rules::{Plan, Request};
use tollgate_store::{Check, Store, StoreError};

use crate::engine::duration_ns;
use crate::measure::{Rates, rate};
use crate::mitigation::Routes;
use crate::{Admission, Answer, Engine, Frontend, Outcome, Pending, Policy, Proceed};

/// A rule that applies to the request, with its key (borrowed from the plan), cost and the key's
/// measured rate (if the rule is measured).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applies<'p> {
    pub(crate) rule: usize,
    pub(crate) key: &'p [u8],
    pub(crate) cost: u64,
    pub(crate) rate: Option<f64>,
}

/// The plan's only rule if it is the usual kind, which rejects when over and counts every request
/// (no dry-run, delay, shadow-ban, mitigation timeout, `count_status` or cost read from the
/// response): then a plain check decides the request.
fn single<'p>(policy: &Policy, plan: &'p Plan) -> Option<Applies<'p>> {
    let (rule, key, cost) = plan.single()?;
    // Compiled with the policy (`Policy::plain`): the rule's fields lie on several cache lines.
    policy.plain[rule].then_some(Applies { rule, key, cost, rate: None })
}

impl<S: Store> Engine<S> {
    /// Decides what to do with `request` under `policy` (see the crate docs; `policy` is
    /// [`current`](Self::current), which front ends also read the request's headers by). Timed
    /// as the middleware's decisions ([`Frontend::Middleware`]).
    pub async fn admit(&self, policy: &Arc<Policy>, request: &Request<'_>) -> Admission {
        self.admit_within(policy, request, None).await
    }

    /// [`admit`](Self::admit) for a request that has `within` left (its front end's request
    /// timeout, less what it took so far): a delay that would not end before is refused at once.
    pub async fn admit_within(
        &self,
        policy: &Arc<Policy>,
        request: &Request<'_>,
        within: Option<Duration>,
    ) -> Admission {
        let within_ns = within.map_or(u64::MAX, duration_ns).min(self.max_wait_ns);
        self.timed(Frontend::Middleware, self.decide(policy, request, within_ns)).await
    }

    /// Runs `decision` and counts the time it took in `frontend`'s decision latency, by the
    /// engine's clock (whose reads cost less than `std::time::Instant`'s). The engine's own
    /// decisions are timed so; a front end deciding on the store itself (Envoy's gRPC service)
    /// wraps its decision in it.
    pub async fn timed<T>(&self, frontend: Frontend, decision: impl Future<Output = T>) -> T {
        let started = self.clock.now_ns();
        let result = decision.await;
        let elapsed = self.clock.now_ns().saturating_sub(started);
        self.metrics.observe_decision(frontend, Duration::from_nanos(elapsed));
        result
    }

    /// [`admit_within`](Self::admit_within), untimed.
    async fn decide(&self, policy: &Arc<Policy>, request: &Request<'_>, within_ns: u64) -> Admission {
        let mut plan = Plan::default();
        let planned = policy.rules.plan(request, &mut plan);
        self.decide_plan(policy, Some(request), &plan, planned, within_ns).await
    }

    /// Decides a planned request (`request`: none for a caller naming a rule and key, whose plan
    /// is that rule alone and mitigates that key alone), which has `within_ns` left.
    pub(crate) async fn decide_plan(
        &self,
        policy: &Arc<Policy>,
        request: Option<&Request<'_>>,
        plan: &Plan,
        planned: Result<(), tollgate_rules::RequestError>,
        within_ns: u64,
    ) -> Admission {
        // The measured rates: every request a measured rule counts, whatever is decided for it.
        let rates = self.measure(policy, plan, planned.is_ok(), || self.clock.now_ns());
        self.decide_measured(policy, request, plan, planned, rates, within_ns).await
    }

    /// [`decide_plan`](Self::decide_plan) once the request is counted in the measured `rates`.
    async fn decide_measured(
        &self,
        policy: &Arc<Policy>,
        request: Option<&Request<'_>>,
        plan: &Plan,
        planned: Result<(), tollgate_rules::RequestError>,
        rates: Rates,
        within_ns: u64,
    ) -> Admission {
        // Rules that send the request to a quarantine: it is still charged to the others.
        let mut routes = Routes::new();
        // Dry-run rules holding the key: logged, and not asked again.
        let mut held = Routes::new();

        // 1. Mitigations in force: in this engine's table, then in the store (boxed: only rules
        // mitigating beyond their `match` ask it, and inline it would grow every request's future).
        if let Some(answer) = self.in_force(policy, request, plan, &rates, &mut routes, &mut held) {
            return Admission::Answer(answer);
        }
        if policy.shares.peeks
            && let Some(request) = request
            && let Some(answer) = Box::pin(self.in_store(policy, request, plan, &rates, &mut routes, &mut held)).await
        {
            return Admission::Answer(answer);
        }

        // 2. The plan, and the rates over `when_rate_above`.
        if let Err(error) = planned {
            tracing::debug!(%error, "request refused by the rules");
            return Admission::Answer(Answer::BadRequest(error.0));
        }
        let mut flagged = SmallVec::new();
        if let Some(answer) = self.over_rate(policy, plan, &rates, &mut flagged, &mut routes, &held).await {
            return Admission::Answer(answer);
        }
        if routes.is_empty() && plan.is_empty() {
            return Admission::Proceed(Proceed::free());
        }
        if policy.carries.any {
            // Boxed: rare, and it would grow every request's future.
            Box::pin(self.carry_plan(policy, plan)).await;
        }
        if routes.is_empty()
            && let Some(one) = single(policy, plan)
        {
            // The usual case: one plain store check, nothing to reserve or settle.
            let check =
                Check::new(one.key, &policy.checked[one.rule], one.cost).scoped(&policy.rules.rules[one.rule].name);
            let decided = self.counted(self.store.check_one(check).await);
            return self.admit_one(policy, one, decided, rate(&rates, 0)).await;
        }

        // 3. Dry-run rules on their own (never blocking); the others all or nothing. Boxed:
        // several rules on one request are the rarer case, and inline their state would double
        // the size of every request's future (moved, so copied, by `admit_now`).
        Box::pin(self.enforce_plan(policy, plan, &rates, &flagged, routes, &held, within_ns)).await
    }

    /// The admission of a request counted by a single rule (see [`single`]), once decided.
    async fn admit_one(
        &self,
        policy: &Policy,
        one: Applies<'_>,
        decided: Result<Decision, StoreError>,
        rate: Option<f64>,
    ) -> Admission {
        match decided {
            Ok(decision) if decision.allowed => self.admitted_one(policy, one.rule, decision),
            Ok(decision) => {
                let decision = self.over(policy, one.rule, one.key, decision, one.cost).await;
                Admission::Answer(self.mitigate(policy, one.rule, decision, rate))
            }
            Err(error) => self.store_failed(policy, &[one], &error, Pending::default()),
        }
    }

    /// The admission of a request `decision` allowed under the plain rule `rule` (see [`single`]).
    fn admitted_one(&self, policy: &Policy, rule: usize, decision: Decision) -> Admission {
        self.metrics.count(&policy.counters[rule], Outcome::Allowed);
        Admission::Proceed(Proceed { tightest: Some((rule, decision)), ..Proceed::free() })
    }

    /// [`admit_within`](Self::admit_within) without a future, when the store decides in place
    /// ([`Store::decides_in_place`]: its calls finish on their first poll); `None` for a store
    /// that must be waited for. The middleware answers most requests this way, with no task or
    /// allocation of its own.
    pub fn admit_now(
        &self,
        policy: &Arc<Policy>,
        request: &Request<'_>,
        within: Option<Duration>,
    ) -> Option<Admission> {
        if !self.store.decides_in_place() {
            return None;
        }
        // `admit_within`'s steps, timed the same way, without its future: a request's whole
        // decision as one future is kilobytes moved and polled; here only the store's call and
        // the rarer steps are futures, each polled once.
        let started = self.clock.now_ns();
        let mut plan = Plan::default();
        let planned = policy.rules.plan(request, &mut plan);
        let rates = self.measure(policy, &plan, planned.is_ok(), || started);
        let decided = match self.plain(policy, &plan, planned.is_ok()) {
            Some(one) => {
                // `decide_measured`'s usual case (see `plain`): the same check and admission.
                let check =
                    Check::new(one.key, &policy.checked[one.rule], one.cost).scoped(&policy.rules.rules[one.rule].name);
                poll_once(self.store.check_one(check)).and_then(|decided| match self.counted(decided) {
                    // Admitted, as most are: no future at all.
                    Ok(decision) if decision.allowed => Some(self.admitted_one(policy, one.rule, decision)),
                    decided => poll_once(self.admit_one(policy, one, decided, rate(&rates, 0))),
                })
            }
            None => {
                let within_ns = within.map_or(u64::MAX, duration_ns).min(self.max_wait_ns);
                poll_once(self.decide_measured(policy, Some(request), &plan, planned, rates, within_ns))
            }
        };
        let Some(admission) = decided else {
            // A store breaking its word: what it did so far cannot be waited for.
            tracing::error!("the store said it decides in place, then made a request wait");
            return Some(Admission::Answer(Answer::Unavailable("the rate limiter's store did not answer".into())));
        };
        let elapsed = self.clock.now_ns().saturating_sub(started);
        self.metrics.observe_decision(Frontend::Middleware, Duration::from_nanos(elapsed));
        Some(admission)
    }

    /// The plan's only rule when `decide_measured` would come to it with nothing else to do: no
    /// mitigation held in this engine (`in_force` would look no further) nor peeked at in the
    /// store, a plan the rules could make, no `when_rate_above` to weigh (`over_rate` would pass),
    /// no carries, and the rule plain (see [`single`]).
    fn plain<'p>(&self, policy: &Policy, plan: &'p Plan, planned: bool) -> Option<Applies<'p>> {
        if !planned || self.blocks.any() || policy.shares.peeks || policy.carries.any {
            return None;
        }
        single(policy, plan).filter(|one| policy.rules.rules[one.rule].when_rate_above.is_none())
    }
}

/// `future`'s output if it is ready on its first poll (a store that decides in place).
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    match std::pin::pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => Some(output),
        Poll::Pending => None,
    }
}
