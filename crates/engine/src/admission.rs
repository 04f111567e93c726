//! What the engine decides for a request ([`Admission`]): let it through, perhaps after a
//! delay, with the reservations to settle once its response's status is known ([`Proceed`],
//! [`Pending`]); or answer it instead ([`Answer`]).

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, Limit};

use crate::Policy;
use crate::settle::Slot;
use crate::waiting::Waiting;

/// What to do with a request.
#[derive(Debug)]
pub enum Admission {
    /// Pass it on (after `delay`), then give its response's status to [`Engine::complete`](crate::Engine::complete).
    Proceed(Proceed),
    /// Answer this instead; the request goes no further.
    Answer(Answer),
}

/// A request let through.
#[derive(Debug)]
pub struct Proceed {
    /// How long to hold it first (a delay rule's slot): see [`wait`](Self::wait).
    pub delay: Duration,
    /// The tightest rule and its decision (see [`fields`](Self::fields)).
    pub(crate) tightest: Option<(usize, Decision)>,
    /// What few requests carry: boxed, as for [`Answer::ShadowBan`].
    pub(crate) rare: Option<Box<Rare>>,
    /// What to settle once the response's status is known.
    pub pending: Pending,
}

impl Proceed {
    pub(crate) fn free() -> Self {
        Proceed { delay: Duration::ZERO, tightest: None, rare: None, pending: Pending::default() }
    }

    /// Holds the request until its slot ([`delay`](Self::delay)), then gives back its place among
    /// the requests waiting (dropped while it waits, the place is given back too).
    pub async fn wait(&mut self) {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if let Some(rare) = &mut self.rare {
            rare.waiting = None;
        }
    }

    /// The tightest rule's name, limit and decision, for the RateLimit fields (built only when a
    /// front end writes them), under the `policy` the request was admitted with.
    #[must_use]
    pub fn fields(&self, policy: &Policy) -> Option<Fields> {
        let (rule, decision) = self.tightest?;
        let rule = policy.rules.rules.get(rule)?;
        Some(Fields { policy: rule.name.clone(), limit: rule.limit.clone(), decision, rate_per_s: None })
    }
}

/// What few admitted requests carry.
#[derive(Debug, Default)]
pub(crate) struct Rare {
    /// The first dry-run rule and what it would have decided (admitted whatever it says).
    pub(crate) dry_run: Option<(usize, Decision)>,
    /// Its place among the requests waiting for their slot (see `waiting`), while it waits.
    pub(crate) waiting: Option<Waiting>,
}

/// A rule's state as the RateLimit header fields report it.
#[derive(Debug, Clone)]
pub struct Fields {
    /// The rule's name (the policy name).
    pub policy: String,
    /// Its limit.
    pub limit: Limit,
    /// The decision.
    pub decision: Decision,
    /// The key's measured rate, cost per second, when the request was mitigated.
    pub rate_per_s: Option<f64>,
}

/// A request answered by the engine.
#[derive(Debug)]
pub enum Answer {
    /// 429, with the rule's fields.
    TooMany(Fields),
    /// A shadow-ban's fake success.
    ShadowBan {
        /// Status code.
        status: u16,
        /// Body.
        body: String,
        /// Content type.
        content_type: String,
        /// The rule's fields (what a caller naming the rule is told: see
        /// [`Engine::check_named`](crate::Engine::check_named)); boxed, as a shadow-ban is rare and
        /// every admission is moved at this enum's size.
        fields: Box<Fields>,
    },
    /// Send it to this quarantine upstream instead (action `route`); a front end that cannot
    /// route answers it as [`TooMany`](Self::TooMany) with `fields`.
    Route {
        /// The quarantine's base URL.
        upstream: String,
        /// The rule's fields.
        fields: Fields,
    },
    /// 400: the request cannot be counted (a bad cost header, a missing key part).
    BadRequest(String),
    /// 503: the store failed and the rules say not to let requests through then.
    Unavailable(String),
}

/// Reservations of `count_status` rules, settled by [`Engine::complete`](crate::Engine::complete)
/// (or with no status, all refunded, by an [`Unsettled`](crate::Unsettled) dropped first).
/// Dropping it unsettled leaves them counted (an under-grant, never an over-grant); either way
/// they are no longer in flight.
#[derive(Debug, Default)]
pub struct Pending {
    pub(crate) policy: Option<Arc<Policy>>,
    pub(crate) reservations: Vec<Reservation>,
}

#[derive(Debug)]
pub(crate) struct Reservation {
    pub(crate) rule: usize,
    pub(crate) key: Vec<u8>,
    pub(crate) cost: u64,
    pub(crate) at: u64,
    pub(crate) decision: Decision,
    /// Where it is counted in flight.
    pub(crate) slot: Slot,
}

impl Pending {
    /// Adds a reservation of `cost` for `key` under rule `rule`, made at `at` (counted in flight
    /// until this is dropped), keeping the rules it was made under (to settle it under them).
    pub(crate) fn hold(
        &mut self,
        policy: &Arc<Policy>,
        (rule, key, cost): (usize, &[u8], u64),
        at: u64,
        decision: Decision,
    ) {
        let policy = self.policy.get_or_insert_with(|| policy.clone());
        let slot = policy.in_flight.add(&policy.rules.rules[rule].name, key, cost);
        self.reservations.push(Reservation { rule, key: key.to_vec(), cost, at, decision, slot });
    }

    /// Adds `other`'s reservations (made under the same rules).
    pub(crate) fn take(&mut self, mut other: Pending) {
        if let Some(policy) = other.policy.take() {
            self.policy.get_or_insert(policy);
        }
        self.reservations.append(&mut other.reservations);
    }

    /// Whether there is nothing to settle.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(policy) = &self.policy {
            for reservation in &self.reservations {
                policy.in_flight.remove(reservation.slot, reservation.cost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every admission is returned and moved at these sizes (the middleware polls it inline):
    /// a variant that grows them costs every request. Measured: fields added unboxed to
    /// `ShadowBan` and `Proceed` (192 and 144 bytes) put the middleware bench's overhead at
    /// 2.24-2.38x tower_governor's, against 2.02-2.23x at these sizes.
    #[test]
    fn admissions_stay_small() {
        assert!(std::mem::size_of::<super::Admission>() <= 160, "{}", std::mem::size_of::<super::Admission>());
        assert!(std::mem::size_of::<super::Proceed>() <= 104, "{}", std::mem::size_of::<super::Proceed>());
    }
}
