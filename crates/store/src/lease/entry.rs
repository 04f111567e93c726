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

    pub(super) fn refilled(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
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
    /// The key with nothing left, as the store answered: its requests are refused locally
    /// until a unit frees.
    pub(super) denied: Option<Denial>,
    /// Bumped when a refund or reset on this node may have freed units: a lease reply to a call
    /// sent before it cannot start a cached denial.
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

/// A key the store found with nothing left, decided locally from the state it answered with.
///
/// Until a unit frees nothing can be admitted, so nothing changes the key but a refund, a reset,
/// a hold or a charge: the state the store answered with is its state, and the algorithm decides
/// a request on it as the store would. The store's instant is estimated as its instant in the
/// reply plus the node's time since the call was sent: never earlier than the store's own, later
/// by at most the call's round trip. So a local denial is one the store would make (without an
/// admission a key only frees capacity as time passes: denied at the later instant, denied at
/// the earlier), and its figures are the store's at most a round trip ahead (`retry_after` and
/// `reset_after` smaller by at most that, `remaining` as large or larger).
#[derive(Debug, Clone)]
pub(super) struct Denial {
    state: tollgate_core::State,
    server_at: u64,
    sent: u64,
    /// The node's instant from which the store may admit a unit (estimated as above), or the
    /// end of the cap: the local answers end then.
    pub(super) until: u64,
}

impl Denial {
    /// The key as the store answered a call sent at the node's `sent` (its state `snapshot` at its
    /// instant `server_at`), if a unit request would be denied then; answered locally for at most
    /// `cap`.
    pub(super) fn new(limit: &Limit, snapshot: &Snapshot, server_at: u64, sent: u64, cap: u64) -> Option<Denial> {
        let state = tollgate_core::State::from_snapshot(limit, snapshot);
        let unit = state.clone().check(server_at, limit, 1).ok()?;
        (!unit.allowed).then(|| Denial {
            state,
            server_at,
            sent,
            until: sent.saturating_add(unit.retry_after_ns.min(cap)),
        })
    }

    /// The store's estimated instant at the node's `now`.
    pub(super) fn server_now(&self, now: u64) -> u64 {
        self.server_at.saturating_add(now.saturating_sub(self.sent))
    }

    /// The denial of `cost` at the node's `now`, while the local answers last; `None` when the
    /// store must decide (never an admission made here).
    pub(super) fn decide(&self, limit: &Limit, cost: u64, now: u64) -> Option<Decision> {
        if now >= self.until {
            return None;
        }
        // A denial leaves the state unchanged; the clone keeps an admission from changing it.
        let decision = self.state.clone().check(self.server_now(now), limit, cost).ok()?;
        (!decision.allowed).then_some(decision)
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
