//! Settling `count_status` reservations once a request's fate is known, and what the engine knows
//! of the reservations still in flight meanwhile.
//!
//! - **Settled with its status** ([`Engine::complete`]): each rule keeps what it reserved if it
//!   counts the status, and gives it back otherwise.
//! - **Settled later** ([`Unsettled::settle_later`]: the client left while the service was
//!   answering): the service acted on the request all the same, so the status it comes to counts
//!   as if the client had waited (else an attacker hanging up after each guessed password would
//!   never be counted).
//! - **Settled with no status** ([`Unsettled`] dropped before a status exists: the request never
//!   reached the service, the service failed or panicked): every reservation is given back.
//! - **Settled with what the response cost** ([`Unsettled::complete_with`]): a rule whose cost is
//!   read from the response (LLM tokens) reserved an estimate; less is refunded, more charged
//!   past the limit ([`Store::charge`]: the next requests pay), and a response that does not say
//!   leaves the estimate charged. Dropped before a status exists, it is refunded like the others.
//! - **Kept** (a caller naming a rule has no response status; a quarantined request's response
//!   is the quarantine's): every reservation stays counted.
//!
//! **In flight.** Until it is settled (or its [`Pending`] dropped), a reservation is counted in a
//! table of this engine's reservations in flight per (rule, key) ([`InFlight`]), so that a
//! request a `count_status` rule refuses only because of them is told so rather than taken for
//! a key over its limit (see [`Engine::only_in_flight`]): no mitigation hold starts on statuses
//! nobody has seen yet. The table holds only what is in flight (an entry leaves at 0), so it is
//! bounded by the requests in flight.
//!
//! [`Engine`]'s methods here: [`Engine::unsettled`], [`Engine::abandoned`], [`Engine::complete`],
//! `keep` and `settle` (a request's reservations, once its fate is known), `refuse_busy` and
//! `only_in_flight` (what the reservations in flight mean for a refusal).

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use tollgate_core::Decision;
use tollgate_rules::ResponseCost;
use tollgate_store::{Check, Refund, Store};

use crate::admission::{Answer, Fields, Pending};
use crate::admit::Applies;
use crate::metrics::Outcome;
use crate::sharded::Sharded;
use crate::{Engine, Policy};

/// What a response says a request cost under a rule whose cost is read from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actual {
    /// The response is whole: this is what it cost.
    Final(u64),
    /// The response was cut short (the client left mid-stream): it cost at least this (the last
    /// cumulative count it gave), perhaps more. Settled at the larger of this and the estimate:
    /// more is charged, nothing refunded.
    AtLeast(u64),
}

/// The longest a request refused only by reservations in flight is told to wait: those are
/// usually answered within it.
pub(crate) const IN_FLIGHT_RETRY_NS: u64 = 1_000_000_000;

/// The cost reserved and not yet settled per (rule, key), on this engine.
#[derive(Debug)]
pub(crate) struct InFlight(Sharded<u64>);

/// Where a reservation is counted in [`InFlight`]: its shard and fingerprint.
pub(crate) type Slot = (usize, u64);

impl InFlight {
    pub(crate) fn new() -> Self {
        InFlight(Sharded::new())
    }

    /// Counts `cost` in flight for `key` under `rule`; where it is counted.
    pub(crate) fn add(&self, rule: &str, key: &[u8], cost: u64) -> Slot {
        let (shard, fingerprint) = self.0.locate(rule, key);
        *self.0.shard(shard).entry(fingerprint).or_insert(0) += cost;
        (shard, fingerprint)
    }

    /// Takes `cost` out of what is in flight at `slot`.
    pub(crate) fn remove(&self, (shard, fingerprint): Slot, cost: u64) {
        let mut map = self.0.shard(shard);
        if let Some(left) = map.get_mut(&fingerprint) {
            *left = left.saturating_sub(cost);
            if *left == 0 {
                map.remove(&fingerprint);
            }
        }
    }

    /// The cost in flight for `key` under `rule`.
    pub(crate) fn of(&self, rule: &str, key: &[u8]) -> u64 {
        let (shard, fingerprint) = self.0.locate(rule, key);
        self.0.shard(shard).get(&fingerprint).copied().unwrap_or(0)
    }
}

/// A request's reservations until its response's status is known: [`complete`](Self::complete)
/// settles them with it, [`settle_later`](Self::settle_later) with the status a call left
/// running comes to; dropped before any (the request never reached the service, the service
/// failed, or panicked and the request unwinds), they are settled with no status, every one
/// refunded (see the module docs). Made by [`Engine::unsettled`].
pub struct Unsettled<S: Store + 'static> {
    engine: Arc<Engine<S>>,
    pending: Pending,
}

impl<S: Store + 'static> Unsettled<S> {
    /// Settles the reservations with the response's `status`.
    pub async fn complete(mut self, status: u16) {
        let pending = std::mem::take(&mut self.pending);
        self.engine.complete(pending, status).await;
    }

    /// Where the rules of these reservations read what the request cost from its response, each
    /// once: what a front end extracts from the response for [`complete_with`](Self::complete_with).
    #[must_use]
    pub fn response_costs(&self) -> Vec<ResponseCost> {
        let Some(policy) = &self.pending.policy else { return Vec::new() };
        let mut costs: Vec<ResponseCost> = Vec::new();
        for reservation in &self.pending.reservations {
            if let Some(from) = policy.rules.rules[reservation.rule].response_cost()
                && !costs.contains(from)
            {
                costs.push(from.clone());
            }
        }
        costs
    }

    /// Settles the reservations with the response's `status` and what it says the request cost:
    /// a rule whose cost is read from the response settles its estimate with `actual(from)`
    /// (less: the difference refunded; more: charged past the limit; [`Actual::AtLeast`]: never
    /// less than the estimate; `None`, the response did not say: the estimate stays charged); the
    /// others as [`complete`](Self::complete) does.
    pub async fn complete_with(mut self, status: u16, actual: impl Fn(&ResponseCost) -> Option<Actual> + Sync) {
        let pending = std::mem::take(&mut self.pending);
        self.engine.complete_with(pending, status, actual).await;
    }
}

impl<S: Store + 'static> Unsettled<S> {
    /// Settles the reservations with the status `answer` comes to, on a task of the current
    /// runtime: for a request whose client left while the service was answering it. The service
    /// acted on the request all the same (a login's password was checked), so its status counts
    /// as if the client had waited; `None` (the service answered nothing) refunds them. With no
    /// runtime to wait on, they are settled with no status at once (as when dropped).
    pub fn settle_later(self, answer: impl Future<Output = Option<u16>> + Send + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            if let Some(status) = answer.await {
                self.complete(status).await;
            }
        });
    }
}

impl<S: Store + 'static> Drop for Unsettled<S> {
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            self.engine.abandoned(std::mem::take(&mut self.pending));
        }
    }
}

impl<S: Store + 'static> std::fmt::Debug for Unsettled<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsettled").field("pending", &self.pending).finish_non_exhaustive()
    }
}

impl<S: Store + 'static> Engine<S> {
    /// Holds `pending` until its request's status is known (see [`Unsettled`]).
    pub fn unsettled(self: &Arc<Self>, pending: Pending) -> Unsettled<S> {
        Unsettled { engine: self.clone(), pending }
    }

    /// Settles `pending` with no status (every reservation refunded) without a future to await:
    /// at once on a store that decides in place, else on a task of the current runtime (none: the
    /// reservations stay counted, an under-grant, and a warning says so).
    pub fn abandoned(self: &Arc<Self>, pending: Pending) {
        if self.store.decides_in_place() {
            let settled = std::pin::pin!(self.settle(pending, None, &|_| None));
            if settled.poll(&mut Context::from_waker(Waker::noop())) == Poll::Pending {
                tracing::error!("the store said it decides in place, then made a refund wait: it stays counted");
            }
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let engine = self.clone();
                runtime.spawn(async move { engine.settle(pending, None, &|_| None).await });
            }
            Err(_) => tracing::warn!("a request ended with no runtime to refund it on: its reservations stay counted"),
        }
    }
}

impl<S: Store> Engine<S> {
    /// Settles a request's reservations once its response's status is known: each `count_status`
    /// rule keeps what it reserved if it counts `status`, and gives it back otherwise.
    pub async fn complete(&self, pending: Pending, status: u16) {
        self.settle(pending, Some(status), &|_| None).await;
    }

    /// Settles a request's reservations with its response's `status` and what the response says
    /// it cost (see [`Unsettled::complete_with`]).
    pub async fn complete_with(
        &self,
        pending: Pending,
        status: u16,
        actual: impl Fn(&ResponseCost) -> Option<Actual> + Sync,
    ) {
        self.settle(pending, Some(status), &actual).await;
    }

    /// Keeps every reservation counted (a caller naming a rule has no response status).
    pub(crate) fn keep(&self, pending: Pending) {
        let Some(policy) = &pending.policy else { return };
        for reservation in &pending.reservations {
            self.metrics.count(&policy.counters[reservation.rule], Outcome::Counted);
        }
    }

    /// Keeps (`status` counted) or refunds every reservation; `None` refunds them all. A rule
    /// whose cost is read from the response settles with what `actual` reads (see
    /// [`Unsettled::complete_with`]). They leave the reservations in flight once the store has
    /// them settled (as `pending` is dropped).
    async fn settle(
        &self,
        pending: Pending,
        status: Option<u16>,
        actual: &(dyn Fn(&ResponseCost) -> Option<Actual> + Sync),
    ) {
        let Some(policy) = &pending.policy else { return };
        let mut refunds = Vec::new();
        let mut charges = Vec::new();
        for reservation in &pending.reservations {
            let rule = &policy.rules.rules[reservation.rule];
            let check = |cost| Check::new(&reservation.key, &policy.checked[reservation.rule], cost).scoped(&rule.name);
            let refund = |cost| Refund { check: check(cost), at: reservation.at, decision: reservation.decision };
            let counter = &policy.counters[reservation.rule];
            match (status, rule.response_cost()) {
                (Some(_), Some(from)) => {
                    self.metrics.count(counter, Outcome::Counted);
                    let cost = match actual(from) {
                        Some(Actual::Final(cost)) => Some(cost),
                        Some(Actual::AtLeast(cost)) => Some(cost.max(reservation.cost)),
                        None => None,
                    };
                    match cost {
                        Some(cost) if cost < reservation.cost => refunds.push(refund(reservation.cost - cost)),
                        Some(cost) if cost > reservation.cost => charges.push(check(cost - reservation.cost)),
                        // As estimated, or the response did not say: the estimate stays charged.
                        _ => {}
                    }
                }
                (Some(s), None) if rule.counts_status(s) => self.metrics.count(counter, Outcome::Counted),
                _ => {
                    self.metrics.count(counter, Outcome::Refunded);
                    refunds.push(refund(reservation.cost));
                }
            }
        }
        if !refunds.is_empty()
            && let Err(error) = self.counted(self.store.refund(&refunds).await)
        {
            tracing::warn!(%error, "refund failed: the reservations stay counted");
        }
        if !charges.is_empty()
            && let Err(error) = self.counted(self.store.charge(&charges).await)
        {
            tracing::warn!(%error, "charging what responses cost beyond their estimates failed: only the estimates stay counted");
        }
    }

    /// The answer to a request refused by rule `rule` only because of the reservations in flight
    /// (see [`only_in_flight`](Self::only_in_flight)): a 429 of its own whatever the rule's action
    /// (the key is not over: no fake success, no quarantine), counted `rejected`.
    pub(crate) fn refuse_busy(&self, policy: &Policy, rule: usize, decision: Decision, rate: Option<f64>) -> Answer {
        let r = &policy.rules.rules[rule];
        self.metrics.count(&policy.counters[rule], Outcome::Rejected);
        Answer::TooMany(Fields { policy: r.name.clone(), limit: r.limit.clone(), decision, rate_per_s: rate })
    }

    /// Whether `decision`, a refusal of `applies` by a `count_status` rule, is owed only to this
    /// engine's reservations in flight for its key: without them there would be room. Such a
    /// request is not over the limit (nothing counted says so yet): it is refused on its own,
    /// holding nothing.
    pub(crate) fn only_in_flight(&self, policy: &Policy, applies: &Applies<'_>, decision: &Decision) -> bool {
        let rule = &policy.rules.rules[applies.rule];
        if !rule.settles_after() {
            return false;
        }
        let in_flight = policy.in_flight.of(&rule.name, applies.key);
        in_flight > 0 && decision.remaining.saturating_add(in_flight) >= applies.cost
    }
}

/// The answer's decision for a request refused only by reservations in flight: retry within a
/// second (they are usually answered by then; each answer the rule does not count gives its
/// reservation back).
pub(crate) fn busy(decision: Decision) -> Decision {
    Decision { retry_after_ns: decision.retry_after_ns.min(IN_FLIGHT_RETRY_NS), ..decision }
}
