//! Deciding a request: [`Engine::admit`], [`Engine::admit_within`] and [`Engine::admit_now`]
//! (the same decision, polled once, for a store that decides in place), timed by
//! [`Engine::timed`]; then `decide_plan`, the order every decision follows (mitigations in
//! force, the plan, the rates over `when_rate_above`, carries, then the store), with the usual
//! case of one plain rule decided here (`admit_one`) and the others handed to `enforce`. What is
//! decided is typed in `admission` ([`Admission`]).

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;
use tollgate_core::Decision;
use tollgate_rules::{Action, Plan, Request};
use tollgate_store::{Check, Store, StoreError};

use crate::engine::duration_ns;
use crate::measure::rate;
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
    let r = &policy.rules.rules[rule];
    let plain = r.action == Action::Reject && !r.settles_after() && r.timeout_ns == 0;
    plain.then_some(Applies { rule, key, cost, rate: None })
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
        let rates = self.measure(policy, plan, planned.is_ok());
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
            Ok(decision) if decision.allowed => {
                self.metrics.count(&policy.counters[one.rule], Outcome::Allowed);
                Admission::Proceed(Proceed { tightest: Some((one.rule, decision)), ..Proceed::free() })
            }
            Ok(decision) => {
                let decision = self.over(policy, one.rule, one.key, decision, one.cost).await;
                Admission::Answer(self.mitigate(policy, one.rule, decision, rate))
            }
            Err(error) => self.store_failed(policy, &[one], &error, Pending::default()),
        }
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
        let admission = std::pin::pin!(self.admit_within(policy, request, within));
        match admission.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(admission) => Some(admission),
            Poll::Pending => {
                // A store breaking its word: what it did so far cannot be waited for.
                tracing::error!("the store said it decides in place, then made a request wait");
                Some(Admission::Answer(Answer::Unavailable("the rate limiter's store did not answer".into())))
            }
        }
    }
}
