//! The [`Store`] trait: one async interface for every place state can live.

use std::future::Future;

use tollgate_core::{Decision, Limit};

use crate::StoreError;
use crate::reservation::{Reservation, Settled};

/// One limit to check as part of a request: whose state (scope and key), under which limit, at
/// which cost.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// Whose limit this is: a rule's or a named limit's name, so that two of them never share
    /// state for the same key; empty for ad-hoc limits (`CL.THROTTLE`, `TG.CHECK`), which share
    /// state per (algorithm, key) as redis-cell does.
    pub scope: &'a str,
    /// The key whose state is checked (any bytes, e.g. `user:42`).
    pub key: &'a [u8],
    /// The limit for this key; each key may have its own.
    pub limit: &'a Limit,
    /// The cost of the request under this limit (0 peeks).
    pub cost: u64,
    /// Whether a hold on this scope and key ([`Store::hold`]) applies to this check: a live one
    /// denies it, and so the whole request (nothing is charged anywhere), its decision giving the
    /// rest of the hold as its retry, and [`Reserved::held`] naming it. Read in the same call as
    /// the decision (on Redis, one more key read by the same script). Ignored in charges and
    /// refunds.
    pub hold: bool,
    /// Whether this check only reports (a rule on trial, `dry-run`): in a reservation
    /// ([`Store::reserve_until`]) it may cost 0, a peek admitted whatever the state, whose settle
    /// then charges the actual. Any other check of a reservation costs at least 1.
    pub reporting: bool,
}

impl<'a> Check<'a> {
    /// An ad-hoc check (empty scope).
    #[must_use]
    pub fn new(key: &'a [u8], limit: &'a Limit, cost: u64) -> Self {
        Check { scope: "", key, limit, cost, hold: false, reporting: false }
    }

    /// This check in `scope` (a rule's or named limit's name).
    #[must_use]
    pub fn scoped(self, scope: &'a str) -> Self {
        Check { scope, ..self }
    }

    /// This check, at `cost`, as one that only reports (see [`reporting`](Self::reporting)).
    #[must_use]
    pub fn reporting_at(self, cost: u64) -> Self {
        Check { cost, reporting: true, ..self }
    }

    /// This check, denied while its scope holds its key (see [`hold`](Self::hold)).
    #[must_use]
    pub fn with_hold(self) -> Self {
        Check { hold: true, ..self }
    }
}

/// The longest hold a store keeps: 100 days (longer ones are kept this long). Every hold the
/// rules make is shorter (a `timeout` is at most 50 days).
pub const MAX_HOLD_NS: u64 = 100 * 86_400 * 1_000_000_000;

/// The decision of a check denied by a live hold with `left` ns to go, under a limit whose peek
/// is `peek`: nothing is left until the hold ends.
#[must_use]
pub fn held_decision(peek: &Decision, left: u64) -> Decision {
    Decision { allowed: false, limit: peek.limit, remaining: 0, retry_after_ns: left, reset_after_ns: left }
}

/// What a store answered to a [`Store::reserve`]: the decisions, and the store's instant when it
/// made them, which a later [`Store::refund`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    /// One decision per check.
    pub decisions: Vec<Decision>,
    /// The store's now, in ns since the epoch (the Redis server's time on Redis).
    pub at: u64,
    /// Each check's instant, when they differ (keys decided slot by slot on a Redis Cluster);
    /// empty when every check was decided at `at`.
    pub per_check: Vec<u64>,
    /// The checks denied by a live hold (see [`Check::hold`]), by index, ascending; usually none.
    pub held: Vec<usize>,
}

impl Reserved {
    /// Decisions all made at `at`, none of them by a hold.
    #[must_use]
    pub fn at(decisions: Vec<Decision>, at: u64) -> Self {
        Reserved { decisions, at, per_check: Vec::new(), held: Vec::new() }
    }

    /// Whether check `i` was denied by a live hold.
    #[must_use]
    pub fn is_held(&self, i: usize) -> bool {
        self.held.contains(&i)
    }

    /// The instant check `i` was decided at.
    #[must_use]
    pub fn instant(&self, i: usize) -> u64 {
        self.per_check.get(i).copied().unwrap_or(self.at)
    }
}

/// An admission to withdraw: the check that was admitted (its `cost` is given back), when, and
/// its decision (which says where it was counted).
#[derive(Debug, Clone, Copy)]
pub struct Refund<'a> {
    /// Whose state, under which limit, and how much to give back.
    pub check: Check<'a>,
    /// [`Reserved::at`] of the admission.
    pub at: u64,
    /// The admission's decision.
    pub decision: Decision,
}

/// Where rate-limit state lives. Every implementation makes the decisions of `tollgate-core`
/// exactly; the time is the store's own (its clock, or the Redis server's).
///
/// A key's state belongs to its scope, the limit's algorithm and the key: the same key checked
/// under two algorithms or two scopes has independent states. Within one, each call's limit
/// applies to the state as it is (limits may differ per key and change over time).
pub trait Store: Send + Sync {
    /// Decides one request under several limits, all or nothing: the request is admitted only if
    /// every check admits it, and then every check consumed its cost. Otherwise nothing is
    /// consumed; the checks that did not block it report their current state, as a peek would
    /// (`allowed: true`, nothing consumed). See [`all_allowed`].
    fn check_all(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        async move { Ok(self.reserve(checks).await?.decisions) }
    }

    /// [`check_all`](Self::check_all), answering also the store's instant, so that what was
    /// admitted can be withdrawn later with [`refund`](Self::refund).
    fn reserve(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Reserved, StoreError>> + Send;

    /// Withdraws admissions that turned out not to count (a response whose status a rule does not
    /// count; a request denied by a limit in another Redis Cluster slot), each exactly where it
    /// was counted if the state still holds it (see `RateState::refund`): never an over-grant.
    fn refund(&self, refunds: &[Refund<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Charges each check's `cost` at the store's now whatever its limit says: an amount known
    /// only once the request was served (a response that cost more than its reservation), which
    /// the next requests pay for. The state may go into debt (bounded as `RateState::charge`
    /// says). Default: refused as unsupported (the caller keeps what it reserved).
    fn charge(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = checks;
        async { Err(StoreError::Unsupported("this store cannot charge past a limit".into())) }
    }

    /// Decides a request of `cost` for the ad-hoc `key` under `limit`, consuming capacity if
    /// admitted. `cost = 0` peeks: it reports the state, changes nothing and creates no state.
    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        async move {
            let mut decisions = self.check_all(&[Check::new(key, limit, cost)]).await?;
            decisions.pop().ok_or(StoreError::NoChecks)
        }
    }

    /// Decides one check (in any scope): [`check_all`](Self::check_all) of one, without its `Vec`.
    fn check_one(&self, check: Check<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        async move { self.check_all(&[check]).await?.pop().ok_or(StoreError::NoChecks) }
    }

    /// Reports the ad-hoc `key`'s state under `limit` without changing it.
    fn peek(&self, key: &[u8], limit: &Limit) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        self.check(key, limit, 0)
    }

    /// [`reserve`](Self::reserve), and if every check admitted, a reservation open for `ttl_ns`
    /// (at most [`MAX_RESERVATION_NS`](crate::reservation::MAX_RESERVATION_NS)) that
    /// [`settle`](Self::settle) corrects with the actual amount, exactly once; never settled, it
    /// stays charged at the checks' costs (see [`reservation`](crate::reservation)). A reserve that
    /// fails may have charged the checks (as any failed check on a remote store may): no
    /// reservation is open then, the charge expires with the state. A store that keeps no
    /// reservations answers [`StoreError::Unsupported`] (the default).
    fn reserve_until(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> impl Future<Output = Result<(Reserved, Option<Reservation>), StoreError>> + Send {
        let _ = (checks, ttl_ns);
        async { Err(StoreError::Unsupported("this store keeps no reservations".into())) }
    }

    /// Settles the reservation `id` with the `actual` amount, once: each of its checks is charged
    /// the difference above its estimate (whatever its limit says) or refunded the difference
    /// below. A settle twice, after the deadline, or of an unknown id is refused
    /// ([`StoreError::Refused`]), changing nothing. A settle that failed otherwise (the backend)
    /// may be sent again: it applies once. The default: [`StoreError::Unsupported`].
    fn settle(&self, id: &str, actual: u64) -> impl Future<Output = Result<Settled, StoreError>> + Send {
        let _ = (id, actual);
        async { Err(StoreError::Unsupported("this store keeps no reservations".into())) }
    }

    /// Forgets the state of `key` in `scope` under `limit`'s algorithm, and any hold of `key` in
    /// `scope`: the key is idle again.
    fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Carries `key`'s use in `scope` from its state under `from`'s algorithm to its state under
    /// `to`'s (a rule whose algorithm changed on a reload), atomically: the old state, if any,
    /// is read at now (what it used: `from`'s capacity less a peek's remaining; a debt beyond the
    /// capacity is not carried), removed, and that use (at most `to`'s capacity) charged to the
    /// new state at now, on top of what it holds. The units carried (0 when there was nothing,
    /// or the algorithms are the same: one state). A carry repeated finds nothing more to carry,
    /// unless the old state was written again meanwhile (by a node still on the old rules). A
    /// store that cannot answers [`StoreError::Unsupported`] (the default).
    fn carry(
        &self,
        scope: &str,
        key: &[u8],
        from: &Limit,
        to: &Limit,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        let _ = (scope, key, from, to);
        async { Err(StoreError::Unsupported("this store cannot carry a key's use to another algorithm".into())) }
    }

    /// Holds `key` in `scope` for `hold_ns` (at most [`MAX_HOLD_NS`]) from the store's now (or
    /// longer, if it already is):
    /// meanwhile every check of `key` in `scope` that asks ([`Check::hold`]) is denied, charging
    /// nothing, by whichever caller of the store (a node of a fleet sharing it, or a process
    /// restarted). The hold lives beside the key's counts and expires with itself. A store that
    /// waits for a server writes the hold to its end even if the future is dropped first (the
    /// client that put the key over hung up: its request's future is dropped, the hold must not
    /// be). A store that keeps no holds answers [`StoreError::Unsupported`] (the default): its
    /// caller holds the key on its own.
    fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = (scope, key, hold_ns);
        async { Err(StoreError::Unsupported("this store keeps no holds".into())) }
    }

    /// The rest of the live hold (ns) of each check's scope and key, `None` where there is none,
    /// deciding and charging nothing (a request a rule only mitigates: is its key held?). By
    /// default a [`reserve`](Self::reserve) of the checks as peeks asking for their holds (one
    /// call; on Redis one script call, its key's states read besides).
    fn held(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Vec<Option<u64>>, StoreError>> + Send {
        async move {
            let peeks: Vec<Check<'_>> = checks.iter().map(|c| Check { cost: 0, hold: true, ..*c }).collect();
            let reserved = self.reserve(&peeks).await?;
            let mut left = vec![None; checks.len()];
            for &i in &reserved.held {
                if let (Some(slot), Some(decision)) = (left.get_mut(i), reserved.decisions.get(i)) {
                    *slot = Some(decision.retry_after_ns);
                }
            }
            Ok(left)
        }
    }

    /// Whether every call decides in place: its future is ready on its first poll, never waits
    /// (the memory store). Callers may then decide without a task of their own (see
    /// `tollgate_engine::Engine::admit_now`). A store that says so must keep its word.
    fn decides_in_place(&self) -> bool {
        false
    }
}

/// Whether a [`Store::check_all`] admitted its request.
#[must_use]
pub fn all_allowed(decisions: &[Decision]) -> bool {
    decisions.iter().all(|d| d.allowed)
}

/// A shared store is a store.
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn check_all(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Vec<Decision>, StoreError>> + Send {
        (**self).check_all(checks)
    }

    fn reserve(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Reserved, StoreError>> + Send {
        (**self).reserve(checks)
    }

    fn refund(&self, refunds: &[Refund<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).refund(refunds)
    }

    fn charge(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).charge(checks)
    }

    fn reserve_until(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> impl Future<Output = Result<(Reserved, Option<Reservation>), StoreError>> + Send {
        (**self).reserve_until(checks, ttl_ns)
    }

    fn settle(&self, id: &str, actual: u64) -> impl Future<Output = Result<Settled, StoreError>> + Send {
        (**self).settle(id, actual)
    }

    fn check(&self, key: &[u8], limit: &Limit, cost: u64) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check(key, limit, cost)
    }

    fn check_one(&self, check: Check<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        (**self).check_one(check)
    }

    fn reset(&self, scope: &str, key: &[u8], limit: &Limit) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).reset(scope, key, limit)
    }

    fn carry(
        &self,
        scope: &str,
        key: &[u8],
        from: &Limit,
        to: &Limit,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        (**self).carry(scope, key, from, to)
    }

    fn hold(&self, scope: &str, key: &[u8], hold_ns: u64) -> impl Future<Output = Result<(), StoreError>> + Send {
        (**self).hold(scope, key, hold_ns)
    }

    fn held(&self, checks: &[Check<'_>]) -> impl Future<Output = Result<Vec<Option<u64>>, StoreError>> + Send {
        (**self).held(checks)
    }

    fn decides_in_place(&self) -> bool {
        (**self).decides_in_place()
    }
}
