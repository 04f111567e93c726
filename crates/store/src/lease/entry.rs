//! One leased key's state on a node: its slices, its cached refusal, its refill in flight and
//! its measured rate ([`State`]), behind a lock of its own ([`Entry`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tollgate_core::{Algorithm, Decision, Limit, Snapshot};

use crate::Check;

/// How often the rates are measured (and cold keys let go).
pub(super) const EPOCH_NS: u64 = 20_000_000;

/// One leased key.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) scope: Box<str>,
    pub(super) key: Box<[u8]>,
    pub(super) limit: Limit,
    pub(super) state: Mutex<State>,
    pub(super) notify: tokio::sync::Notify,
    /// Bumped by every refill answered, so that a waiter never misses one.
    pub(super) generation: AtomicU64,
}

impl Entry {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the refill in flight (answered, failed or abandoned), under the entry's lock: the
    /// requests waiting for it leave the model's count and are woken by [`Entry::wake`].
    pub(super) fn end_refill(&self, st: &mut State) {
        st.in_flight = false;
        if let Some(model) = st.model.as_mut() {
            model.waiting = Waiting::default();
        }
        // Under the lock, so that a waiter leaving reads it with the count it was added to.
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Wakes the requests that waited for the refill just ended.
    pub(super) fn wake(&self) {
        self.notify.notify_waiters();
    }

    pub(super) fn is(&self, check: &Check<'_>) -> bool {
        *self.key == *check.key && *self.scope == *check.scope && self.limit.algorithm() == check.limit.algorithm()
    }
}

/// Units debited for this node, to spend before `expires` (node's clock).
#[derive(Debug, Clone, Copy)]
pub(super) struct Slice {
    pub(super) units: u64,
    pub(super) expires: u64,
    /// The store's instant of the debit, and the node's when the call was sent.
    pub(super) server_at: u64,
    pub(super) sent: u64,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) current: Option<Slice>,
    pub(super) next: Option<Slice>,
    /// The key as the store last answered: requests it refuses are refused locally while the
    /// store has nothing left, or while a refill is in flight.
    pub(super) model: Option<Model>,
    /// Bumped when a refund or reset on this node may have freed units: a lease reply to a call
    /// sent before it cannot start a model.
    pub(super) freed: u64,
    /// The latest lease call's round trip on the node's clock.
    pub(super) round_trip: u64,
    pub(super) in_flight: bool,
    /// After a failed lease call: decided exactly until then.
    pub(super) backoff_until: u64,
    /// The latest grant: what the store had left then, how many nodes lease, and when.
    pub(super) left: u64,
    pub(super) lessees: u64,
    pub(super) last_server_at: u64,
    pub(super) last_sent: u64,
    /// A refill is sent once the node holds this much or less: half the slice size at the
    /// latest grant.
    pub(super) refill_at: u64,
    /// Units wanted this epoch, and the rate measured (units a second).
    pub(super) epoch_start: u64,
    pub(super) epoch_units: u64,
    pub(super) rate: f64,
    pub(super) last_active: u64,
    pub(super) cool_since: Option<u64>,
}

impl State {
    /// Closes the epoch if it is over, measuring the rate: up at once, down smoothly.
    pub(super) fn roll(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.epoch_start);
        if elapsed >= EPOCH_NS {
            let measured = self.epoch_units as f64 * 1e9 / elapsed as f64;
            self.rate = if measured > self.rate { measured } else { 0.7 * self.rate + 0.3 * measured };
            self.epoch_start = now;
            self.epoch_units = 0;
        }
        if self.epoch_units > 0 {
            self.last_active = now;
        }
    }

    /// Units this node holds.
    pub(super) fn held(&self) -> u64 {
        self.current.map_or(0, |s| s.units) + self.next.map_or(0, |s| s.units)
    }

    /// The decision of a unit spent from a slice: `remaining` is what this node holds plus what
    /// the store had left at its latest grant (an estimate), `reset_after` the grant's, aged.
    pub(super) fn admitted(&self, limit: &Limit, now: u64) -> Decision {
        let remaining = self.held().saturating_add(self.left).min(limit.capacity());
        let reset_after_ns = if limit.algorithm().is_bucket() {
            (limit.capacity() - remaining).saturating_mul(limit.emission_interval_ns())
        } else {
            let server_now = self.last_server_at + now.saturating_sub(self.last_sent);
            limit.window_at(server_now).1 - server_now
        };
        Decision { allowed: true, limit: limit.capacity(), remaining, retry_after_ns: 0, reset_after_ns }
    }
}

/// The key as the store last answered (its state after the latest lease call), to refuse
/// locally what the store would refuse.
///
/// Nothing but an admission, a refund, a reset, a hold or a charge changes a key, and of these
/// only a refund or a reset frees capacity: from the reply on, the store's state has at most the
/// free capacity of the state it answered with, aged to the same instant (admissions by anyone,
/// this node's refill included, only take capacity). The store's instant is estimated as its
/// instant in the reply plus the node's time since the call was sent: never earlier than the
/// store's own, later by at most the call's round trip, and without admissions a key only frees
/// capacity as time passes. So a request this state refuses at the estimated instant, the store
/// refuses too.
///
/// While a refill is in flight, the requests waiting for it ([`Waiting`]) were sent before any
/// newcomer: a newcomer of cost `n` is refused if the state refuses it after the waiting
/// requests of cost at most `n` (their sum `L`). That is the store's answer, at its instant, had
/// it received the waiting requests first, in order, then the newcomer: if it admitted each of
/// those `L` units, what it has left is at most the state's free capacity less `L`, under `n`;
/// if it refused one of them (cost at most `n`), what it had left then was under `n`, and at
/// one instant nothing frees in between. A waiting request of a larger cost may be refused where
/// the newcomer would not: it is not counted. Its figures are the state's at the estimated
/// instant: the store's at most a round trip ahead when nothing else changed the key (as for a
/// denial), `remaining` never below what the waiting requests leave in this state.
#[derive(Debug, Clone)]
pub(super) struct Model {
    state: tollgate_core::State,
    server_at: u64,
    sent: u64,
    /// The node's instant until which the store has nothing left for a unit request (estimated
    /// as above), capped by `expires`: requests are refused locally until then even with no
    /// refill in flight. At or before `sent` when the reply left units.
    pub(super) until: u64,
    /// The end of the local answers: a lifetime after the call was sent, so that a refund or a
    /// reset on another node is seen within a lifetime (or once a refill in flight is answered).
    expires: u64,
    /// The requests waiting for the refill in flight (none without one).
    pub(super) waiting: Waiting,
}

/// The requests waiting for a key's refill in flight: what the local model counts before a
/// newcomer (see [`Model`]). A request leaves it when it stops waiting (its [`Refill`] handle is
/// dropped), and all leave it when the refill is answered.
///
/// [`Refill`]: super::book::Refill
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Waiting {
    /// The sum of their costs.
    units: u64,
    /// How many of them cost one unit.
    ones: u64,
    /// The largest cost among them (not lowered when one leaves: a larger bound counts fewer).
    max: u64,
}

impl Waiting {
    pub(super) fn add(&mut self, cost: u64) {
        self.units = self.units.saturating_add(cost);
        self.ones += u64::from(cost == 1);
        self.max = self.max.max(cost);
    }

    pub(super) fn remove(&mut self, cost: u64) {
        self.units = self.units.saturating_sub(cost);
        if cost == 1 {
            self.ones = self.ones.saturating_sub(1);
        }
    }

    /// A lower bound of the units of the waiting requests costing at most `cost`: all of them
    /// when none costs more, else those of one unit.
    fn at_most(&self, cost: u64) -> u64 {
        if cost >= self.max { self.units } else { self.ones }
    }
}

/// A model's answer to a request.
#[derive(Debug)]
pub(super) enum Verdict {
    /// The store would refuse it: this decision.
    Refused(Decision),
    /// The store may admit it.
    Open,
}

impl Model {
    /// The key as the store answered a call sent at the node's `sent` (its state `snapshot` at its
    /// instant `server_at`); local answers last at most `cap`.
    pub(super) fn new(limit: &Limit, snapshot: &Snapshot, server_at: u64, sent: u64, cap: u64) -> Model {
        let state = tollgate_core::State::from_snapshot(limit, snapshot);
        let until = match state.clone().check(server_at, limit, 1) {
            Ok(unit) if !unit.allowed => sent.saturating_add(unit.retry_after_ns.min(cap)),
            _ => sent,
        };
        Model { state, server_at, sent, until, expires: sent.saturating_add(cap), waiting: Waiting::default() }
    }

    /// The store's estimated instant at the node's `now`.
    pub(super) fn server_now(&self, now: u64) -> u64 {
        self.server_at.saturating_add(now.saturating_sub(self.sent))
    }

    /// Whether it answers at the node's `now`: while the store has nothing left for a unit, or a
    /// refill is in flight, within its life.
    pub(super) fn answers(&self, now: u64, in_flight: bool) -> bool {
        now < self.expires && (now < self.until || in_flight)
    }

    /// Whether it may count requests waiting for a refill at the node's `now`.
    pub(super) fn alive(&self, now: u64) -> bool {
        now < self.expires
    }

    /// The store's answer to `cost` at the node's `now`, the waiting requests first.
    pub(super) fn decide(&self, limit: &Limit, cost: u64, now: u64) -> Verdict {
        let at = self.server_now(now);
        // A refusal leaves the state unchanged; the clone keeps an admission from changing it.
        let mut state = self.state.clone();
        let before = self.waiting.at_most(cost);
        if before > 0 && !state.check(at, limit, before).is_ok_and(|d| d.allowed) {
            // The waiting requests do not all fit here (others took units since they came): which
            // of them the store would admit is unknown, so is its answer to this one.
            return Verdict::Open;
        }
        match state.check(at, limit, cost) {
            Ok(decision) if !decision.allowed => Verdict::Refused(decision),
            _ => Verdict::Open,
        }
    }
}

pub(super) fn is_window(algorithm: Algorithm) -> bool {
    matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow)
}

/// `x` rounded up to whole units (saturating; 0 for NaN or below 0).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(super) fn whole_units(x: f64) -> u64 {
    // `as` saturates and maps NaN to 0.
    x.ceil() as u64
}
