//! One leased key's state on a node: its slices, its cached refusal, its refill in flight and
//! its measured rate ([`State`]), behind a lock of its own ([`Entry`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tollgate_core::{Algorithm, Decision, Limit};

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
    /// A refused lease, answered locally until `until`.
    pub(super) denied: Option<(u64, Decision)>,
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
            limit.period_ns() - (self.last_server_at + now.saturating_sub(self.last_sent)) % limit.period_ns()
        };
        Decision { allowed: true, limit: limit.capacity(), remaining, retry_after_ns: 0, reset_after_ns }
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
