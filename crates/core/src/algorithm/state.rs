//! [`State`]: the state of any algorithm, chosen at run time by the limit's [`Algorithm`].

use super::{FixedWindow, Gcra, LeakyBucket, RateState, SlidingLog, SlidingWindow, Snapshot, SubWindow, TokenBucket};
use crate::{Algorithm, Decision, Error, Limit};

/// The state of one key under any of the seven algorithms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum State {
    Gcra(Gcra),
    TokenBucket(TokenBucket),
    LeakyBucket(LeakyBucket),
    FixedWindow(FixedWindow),
    SlidingLog(SlidingLog),
    SlidingWindow(SlidingWindow),
    SubWindow(SubWindow),
}

impl State {
    /// The idle state of `limit`'s algorithm.
    #[must_use]
    pub fn idle(limit: &Limit) -> State {
        match limit.algorithm() {
            Algorithm::Gcra => State::Gcra(Gcra::idle(limit)),
            Algorithm::TokenBucket => State::TokenBucket(TokenBucket::idle(limit)),
            Algorithm::LeakyBucket => State::LeakyBucket(LeakyBucket::idle(limit)),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindow::idle(limit)),
            Algorithm::SlidingLog => State::SlidingLog(SlidingLog::idle(limit)),
            Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindow::idle(limit)),
            Algorithm::SubWindow => State::SubWindow(SubWindow::idle(limit)),
        }
    }

    /// The algorithm this state belongs to.
    #[must_use]
    #[inline]
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::Gcra(_) => Algorithm::Gcra,
            State::TokenBucket(_) => Algorithm::TokenBucket,
            State::LeakyBucket(_) => Algorithm::LeakyBucket,
            State::FixedWindow(_) => Algorithm::FixedWindow,
            State::SlidingLog(_) => Algorithm::SlidingLog,
            State::SlidingWindow(_) => Algorithm::SlidingWindow,
            State::SubWindow(_) => Algorithm::SubWindow,
        }
    }

    /// Decides a request (see [`RateState::check`]). A state of another algorithm than the
    /// limit's is replaced by the limit's idle state first: callers key state by algorithm, so
    /// this only happens when a key's configured algorithm changed.
    #[inline(always)]
    pub fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        if self.algorithm() != limit.algorithm() {
            return self.check_as_idle(now, limit, cost);
        }
        self.check_own(now, limit, cost)
    }

    /// [`check`](Self::check) on a state of another algorithm than the limit's: decided on the
    /// limit's idle state, which replaces this one if it consumed.
    #[cold]
    #[inline(never)]
    fn check_as_idle(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        limit.check_cost(cost)?;
        let mut fresh = State::idle(limit);
        let decision = fresh.check_own(now, limit, cost)?;
        if decision.allowed && cost > 0 {
            *self = fresh;
        }
        Ok(decision)
    }

    /// [`check`](Self::check) on a state of the limit's algorithm.
    #[inline(always)]
    fn check_own(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, Error> {
        // Each arm unwraps its own result, so that the arms meet on a bare `Decision` (kept in
        // registers) rather than on a `Result` laid out in memory.
        Ok(match self {
            State::Gcra(s) => s.check(now, limit, cost)?,
            State::TokenBucket(s) => s.check(now, limit, cost)?,
            State::LeakyBucket(s) => s.check(now, limit, cost)?,
            State::FixedWindow(s) => s.check(now, limit, cost)?,
            State::SlidingLog(s) => s.check(now, limit, cost)?,
            State::SlidingWindow(s) => s.check(now, limit, cost)?,
            State::SubWindow(s) => s.check(now, limit, cost)?,
        })
    }

    /// When this state becomes equivalent to idle (see [`RateState::idle_at`]).
    #[must_use]
    #[inline]
    pub fn idle_at(&self, limit: &Limit) -> u64 {
        match self {
            State::Gcra(s) => s.idle_at(limit),
            State::TokenBucket(s) => s.idle_at(limit),
            State::LeakyBucket(s) => s.idle_at(limit),
            State::FixedWindow(s) => s.idle_at(limit),
            State::SlidingLog(s) => s.idle_at(limit),
            State::SlidingWindow(s) => s.idle_at(limit),
            State::SubWindow(s) => s.idle_at(limit),
        }
    }

    /// Charges an admission of `cost` at `at` whatever the limit says (see [`RateState::charge`]).
    /// A state of another algorithm than the limit's is replaced by the limit's idle state first.
    pub fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), Error> {
        if self.algorithm() != limit.algorithm() {
            *self = State::idle(limit);
        }
        match self {
            State::Gcra(s) => s.charge(at, limit, cost),
            State::TokenBucket(s) => s.charge(at, limit, cost),
            State::LeakyBucket(s) => s.charge(at, limit, cost),
            State::FixedWindow(s) => s.charge(at, limit, cost),
            State::SlidingLog(s) => s.charge(at, limit, cost),
            State::SlidingWindow(s) => s.charge(at, limit, cost),
            State::SubWindow(s) => s.charge(at, limit, cost),
        }
    }

    /// Withdraws a reservation (see [`RateState::refund`]); nothing for a state of another
    /// algorithm than the limit's.
    pub fn refund(&mut self, at: u64, decision: &Decision, limit: &Limit, cost: u64) {
        if self.algorithm() != limit.algorithm() {
            return;
        }
        match self {
            State::Gcra(s) => s.refund(at, decision, limit, cost),
            State::TokenBucket(s) => s.refund(at, decision, limit, cost),
            State::LeakyBucket(s) => s.refund(at, decision, limit, cost),
            State::FixedWindow(s) => s.refund(at, decision, limit, cost),
            State::SlidingLog(s) => s.refund(at, decision, limit, cost),
            State::SlidingWindow(s) => s.refund(at, decision, limit, cost),
            State::SubWindow(s) => s.refund(at, decision, limit, cost),
        }
    }

    /// What this state has consumed, seen at `now` (see [`RateState::snapshot`]); an idle
    /// snapshot for a state of another algorithm than the limit's.
    #[must_use]
    pub fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        if self.algorithm() != limit.algorithm() {
            return Snapshot { at: now, ..Snapshot::default() };
        }
        match self {
            State::Gcra(s) => s.snapshot(now, limit),
            State::TokenBucket(s) => s.snapshot(now, limit),
            State::LeakyBucket(s) => s.snapshot(now, limit),
            State::FixedWindow(s) => s.snapshot(now, limit),
            State::SlidingLog(s) => s.snapshot(now, limit),
            State::SlidingWindow(s) => s.snapshot(now, limit),
            State::SubWindow(s) => s.snapshot(now, limit),
        }
    }

    /// A state of `limit`'s algorithm deciding at least as strictly as the one `snapshot` was
    /// taken of (see [`RateState::from_snapshot`]).
    #[must_use]
    pub fn from_snapshot(limit: &Limit, snapshot: &Snapshot) -> State {
        match limit.algorithm() {
            Algorithm::Gcra => State::Gcra(Gcra::from_snapshot(limit, snapshot)),
            Algorithm::TokenBucket => State::TokenBucket(TokenBucket::from_snapshot(limit, snapshot)),
            Algorithm::LeakyBucket => State::LeakyBucket(LeakyBucket::from_snapshot(limit, snapshot)),
            Algorithm::FixedWindow => State::FixedWindow(FixedWindow::from_snapshot(limit, snapshot)),
            Algorithm::SlidingLog => State::SlidingLog(SlidingLog::from_snapshot(limit, snapshot)),
            Algorithm::SlidingWindow => State::SlidingWindow(SlidingWindow::from_snapshot(limit, snapshot)),
            Algorithm::SubWindow => State::SubWindow(SubWindow::from_snapshot(limit, snapshot)),
        }
    }

    /// Bytes this state holds on the heap (the sliding log's entries, the sub-window's ring).
    #[must_use]
    #[inline]
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::SlidingLog(s) => s.heap_bytes(),
            State::SubWindow(s) => s.heap_bytes(),
            _ => 0,
        }
    }
}
