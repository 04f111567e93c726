//! [`Book`]: one node's leases, as logic without I/O. It answers what to do with a request
//! ([`Spend`]) and which refill to send ([`Order`]); the caller sends it and reports the result.
//! [`Leased`](super::Leased) drives it with a store; the simulation in `tests/lease_bound.rs`
//! drives it with adversarial schedules on a manual clock.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hashbrown::HashMap;
use tollgate_core::{Decision, Limit};

use super::entry::{EPOCH_NS, Entry, Model, Slice, State, Verdict, is_window, whole_units};
use super::hot::HotKeys;
use super::{Grant, LeaseMode, LeaseOptions, LeaseStats, leasable};
use crate::Check;

/// A leased key under a quarter of the hot rate for this long is decided exactly again.
const COOL_NS: u64 = 1_000_000_000;

/// What to do with a request.
#[derive(Debug)]
pub enum Spend {
    /// Decided from a slice (admitted) or refused as the store would refuse it.
    Local {
        /// The decision.
        decision: Decision,
        /// The store's instant, estimated from the latest grant.
        at: u64,
        /// A refill to send.
        order: Option<Order>,
    },
    /// The slice is spent and a refill is in flight: wait for it ([`Refill::wait`]) and ask
    /// again, or decide exactly.
    Wait {
        /// The refill to send, if this call started it.
        order: Option<Order>,
        /// What to wait on.
        refill: Refill,
    },
    /// Decide exactly: the key is not leased, or its slice cannot cover the cost.
    Exact {
        /// A refill to send meanwhile.
        order: Option<Order>,
    },
}

/// A refill to send: `want` units of the entry's key, asked at the node's `sent`. Report its
/// result with [`Book::granted`]; dropped unreported, it is abandoned (the next request may send
/// another).
#[derive(Debug)]
pub struct Order {
    entry: Arc<Entry>,
    /// Units wanted.
    pub want: u64,
    /// When it was sent, on the node's clock.
    pub sent: u64,
    /// The entry's `freed` when it was sent.
    freed: u64,
    done: bool,
}

impl Order {
    /// The check to lease (cost 0; the units wanted are [`want`](Self::want)).
    #[must_use]
    pub fn check(&self) -> Check<'_> {
        Check {
            scope: &self.entry.scope,
            key: &self.entry.key,
            limit: &self.entry.limit,
            cost: 0,
            hold: false,
            reporting: false,
        }
    }
}

impl Drop for Order {
    fn drop(&mut self) {
        if !self.done {
            self.entry.end_refill(&mut self.entry.lock());
            self.entry.wake();
        }
    }
}

/// A handle to wait for an entry's next refill. While it is held and that refill is in flight,
/// its request counts as waiting in the key's model (see `entry::Model`); dropped, it no longer
/// does.
#[derive(Debug)]
pub struct Refill {
    entry: Arc<Entry>,
    generation: u64,
    /// The request's cost, counted in the model's waiting requests (0: not counted).
    counted: u64,
}

impl Refill {
    /// Resolves once the entry's refill that was in flight has been answered (or failed).
    pub async fn wait(self) {
        let notified = self.entry.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.entry.generation.load(Ordering::Acquire) == self.generation {
            notified.await;
        }
    }
}

impl Drop for Refill {
    fn drop(&mut self) {
        if self.counted == 0 || self.entry.generation.load(Ordering::Acquire) != self.generation {
            return;
        }
        let mut st = self.entry.lock();
        // Read again under the lock: the refill may have ended (and the count restarted) since.
        if self.entry.generation.load(Ordering::Acquire) == self.generation
            && let Some(model) = st.model.as_mut()
        {
            model.waiting.remove(self.counted);
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    grants: AtomicU64,
    units_granted: AtomicU64,
    units_forfeited: AtomicU64,
    failures: AtomicU64,
    local: AtomicU64,
    exact: AtomicU64,
    hot: AtomicU64,
}

/// One node's leases (see the module docs of `lease`).
#[derive(Debug)]
pub struct Book {
    options: LeaseOptions,
    hasher: foldhash::fast::FixedState,
    entries: RwLock<HashMap<u64, Arc<Entry>, foldhash::fast::FixedState>>,
    hot: Mutex<HotKeys>,
    counters: Counters,
    last_sweep: AtomicU64,
}

impl Book {
    /// An empty book.
    #[must_use]
    pub fn new(options: LeaseOptions) -> Self {
        Book {
            hot: Mutex::new(HotKeys::new(options.hot_rate)),
            // Seeded by the node's id: a simulation with fixed ids runs the same every time.
            hasher: foldhash::fast::FixedState::with_seed(options.lessee),
            options,
            entries: RwLock::new(HashMap::with_hasher(foldhash::fast::FixedState::default())),
            counters: Counters::default(),
            last_sweep: AtomicU64::new(0),
        }
    }

    /// The options.
    #[must_use]
    pub fn options(&self) -> &LeaseOptions {
        &self.options
    }

    fn hash(&self, check: &Check<'_>) -> u64 {
        self.hasher.hash_one((check.scope, check.limit.algorithm().as_str(), check.key))
    }

    /// What to do with `check` (cost > 0) at the node's `now`. `waited` (once it has waited for a
    /// refill, [`Spend::Wait`]) changes nothing: the refill's reply answers what the store would
    /// refuse. A request told to wait counts as waiting (before the requests that come after
    /// it) for as long as it holds the [`Refill`].
    pub fn spend(&self, check: &Check<'_>, now: u64, _waited: bool) -> Spend {
        self.sweep(now);
        let entries = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = entries.get(&self.hash(check)).filter(|e| e.is(check)) else {
            return Spend::Exact { order: None };
        };
        if entry.limit != *check.limit {
            // The key's limit changed (a reload): its slices were taken under the old one.
            drop(entries);
            self.forget(check);
            return Spend::Exact { order: None };
        }
        let mut st = entry.lock();
        st.roll(now);
        self.retire(&mut st, now);
        let order = |st: &mut State| self.order(entry, st, now);
        if let Some(slice) = st.current.as_mut().filter(|s| s.units >= check.cost) {
            slice.units -= check.cost;
            let (server_at, sent) = (slice.server_at, slice.sent);
            st.epoch_units += check.cost;
            let decision = st.admitted(&entry.limit, now);
            let half = st.held() <= st.refill_at;
            let order = if half { order(&mut st) } else { None };
            self.counters.local.fetch_add(1, Ordering::Relaxed);
            return Spend::Local { decision, at: server_at + now.saturating_sub(sent), order };
        }
        st.epoch_units += check.cost;
        if st.model.as_ref().is_some_and(|m| !m.alive(now)) {
            st.model = None;
        }
        // The store's refusal, answered here (see `entry::Model`): while it has nothing left, or
        // while a refill is in flight, counting the requests waiting for it first.
        let in_flight = st.in_flight;
        let verdict = st
            .model
            .as_ref()
            .filter(|m| m.answers(now, in_flight))
            .map(|m| (m.decide(&entry.limit, check.cost, now), m.server_now(now), m.until));
        if let Some((Verdict::Refused(decision), at, until)) = verdict {
            self.counters.local.fetch_add(1, Ordering::Relaxed);
            // Asked a round trip before the store frees a unit, the next lease is answered about
            // when it does: requests then rarely wait for it. An answer that comes too early is a
            // refusal, which starts a fresh model.
            let ending = until.saturating_sub(now) <= st.round_trip;
            let order = if ending { order(&mut st) } else { None };
            return Spend::Local { decision, at, order };
        }
        let empty = st.held() == 0;
        let was_in_flight = st.in_flight;
        let order = order(&mut st);
        // A refill that left nothing for this request (another took the slice, or the store's
        // unit freed between its refusal and now): it waits for the next one (the caller bounds
        // the waits), as one call for all the waiting requests rather than one each.
        if empty && st.in_flight {
            // Counted first by the model for the requests that come while it waits.
            let mut counted = 0;
            if let Some(model) = st.model.as_mut() {
                model.waiting.add(check.cost);
                counted = check.cost;
            }
            let generation = entry.generation.load(Ordering::Acquire);
            let refill = Refill { entry: entry.clone(), generation, counted };
            debug_assert!(order.is_some() || was_in_flight);
            return Spend::Wait { order, refill };
        }
        Spend::Exact { order }
    }

    /// Counts a decision sent to the store exactly; answers a first refill when that makes the key
    /// leased (it is hot, or every key is leased).
    pub fn observe_exact(&self, check: &Check<'_>, now: u64) -> Option<Order> {
        if self.options.mode == LeaseMode::Off || check.cost == 0 || !leasable(check.limit.algorithm()) {
            return None;
        }
        let hash = self.hash(check);
        let rate = match self.options.mode {
            LeaseMode::Always => 0.0,
            _ => self.hot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).hit(hash, now)?,
        };
        let mut entries = self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.contains_key(&hash) || entries.len() >= self.options.max_keys {
            return None;
        }
        if self.options.mode == LeaseMode::Auto {
            self.counters.hot.fetch_add(1, Ordering::Relaxed);
        }
        let state = State { epoch_start: now, rate, last_active: now, ..State::default() };
        let entry = Arc::new(Entry {
            scope: check.scope.into(),
            key: check.key.into(),
            limit: check.limit.clone(),
            state: Mutex::new(state),
            notify: tokio::sync::Notify::new(),
            generation: AtomicU64::new(0),
        });
        entries.insert(hash, entry.clone());
        drop(entries);
        let mut st = entry.lock();
        self.order(&entry, &mut st, now)
    }

    /// Records what the store answered to `order` (received at the node's `now`).
    pub fn granted(&self, mut order: Order, result: Result<Grant, crate::StoreError>, now: u64) {
        order.done = true;
        let entry = order.entry.clone();
        let mut st = entry.lock();
        entry.end_refill(&mut st);
        st.round_trip = now.saturating_sub(order.sent);
        // A refund or reset on this node since the call was sent: its reply may predate it.
        let current = order.freed == st.freed;
        let cap = self.lifetime_ns();
        match result {
            Ok(grant) => {
                self.counters.grants.fetch_add(1, Ordering::Relaxed);
                self.counters.units_granted.fetch_add(grant.granted, Ordering::Relaxed);
                st.left = grant.decision.remaining;
                st.lessees = grant.lessees.max(1);
                st.last_server_at = grant.at;
                st.last_sent = order.sent;
                st.refill_at = self.size(&entry.limit, &st, now) / 2;
                if grant.granted > 0 {
                    let slice = Slice {
                        units: grant.granted,
                        expires: order.sent + self.life(&entry.limit, grant.at),
                        server_at: grant.at,
                        sent: order.sent,
                    };
                    if st.current.is_some_and(|s| s.units > 0 && s.expires > now) {
                        if let Some(old) = st.next.replace(slice) {
                            self.forfeit(old.units);
                        }
                    } else {
                        st.current = Some(slice);
                    }
                    self.retire(&mut st, now);
                }
                // The store's state after the call answers what it would refuse: requests beyond
                // the slice while it has nothing left (a refusal, or a grant of all that was
                // left), and newcomers while the next refill is in flight.
                st.model = current.then(|| Model::new(&entry.limit, &grant.snapshot, grant.at, order.sent, cap));
            }
            Err(_) => {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                st.backoff_until = now + self.lifetime_ns();
                st.model = None;
            }
        }
        drop(st);
        entry.wake();
    }

    /// Gives `check.cost` units admitted at the store's instant `at` back to the key's slice, if
    /// they can be spent within the slice's life: true if so (the caller refunds the store
    /// otherwise).
    pub fn credit(&self, check: &Check<'_>, at: u64, now: u64) -> bool {
        let entries = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(entry) = entries.get(&self.hash(check)).filter(|e| e.is(check) && e.limit == *check.limit) else {
            return false;
        };
        let mut st = entry.lock();
        self.retire(&mut st, now);
        let room = st.held() + check.cost <= self.max_held(&entry.limit);
        match st.current.as_mut() {
            // Admitted while this slice was held: the unit was debited no earlier than the slice
            // (so within its life and its window); and the node never holds more than `max_held`.
            Some(slice) if room && at >= slice.server_at => {
                slice.units += check.cost;
                true
            }
            _ => false,
        }
    }

    /// Ends the key's local refusals at once: a refund or reset on this node may have freed units
    /// (a lease call sent before cannot start another).
    pub fn freed(&self, check: &Check<'_>) {
        let entries = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = entries.get(&self.hash(check)).filter(|e| e.is(check)) {
            let mut st = entry.lock();
            st.model = None;
            st.freed += 1;
        }
    }

    /// Drops the key's lease (its units are forfeited).
    pub fn forget(&self, check: &Check<'_>) {
        let hash = self.hash(check);
        let mut entries = self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.get(&hash).is_some_and(|e| e.is(check))
            && let Some(entry) = entries.remove(&hash)
        {
            self.forfeit(entry.lock().held());
        }
    }

    /// Units this node holds for `check`'s key now (0 when it is not leased).
    #[must_use]
    pub fn held(&self, check: &Check<'_>, now: u64) -> u64 {
        let entries = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(&self.hash(check)).filter(|e| e.is(check)).map_or(0, |entry| {
            let mut st = entry.lock();
            self.retire(&mut st, now);
            st.held()
        })
    }

    /// Whether the key's latest lease call failed within a lifetime (it is decided exactly
    /// meanwhile).
    #[must_use]
    pub fn failing(&self, check: &Check<'_>, now: u64) -> bool {
        let entries = self.entries.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.get(&self.hash(check)).filter(|e| e.is(check)).is_some_and(|e| now < e.lock().backoff_until)
    }

    /// Counters for metrics.
    #[must_use]
    pub fn stats(&self) -> LeaseStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LeaseStats {
            grants: get(&c.grants),
            units_granted: get(&c.units_granted),
            units_forfeited: get(&c.units_forfeited),
            failures: get(&c.failures),
            local_decisions: get(&c.local),
            exact_decisions: get(&c.exact),
            hot_keys_detected: get(&c.hot),
            leased_keys: self.entries.read().map_or(0, |e| e.len() as u64),
        }
    }

    /// Counts a decision sent to the store.
    pub fn count_exact(&self) {
        self.counters.exact.fetch_add(1, Ordering::Relaxed);
    }

    fn lifetime_ns(&self) -> u64 {
        u64::try_from(self.options.lifetime.as_nanos()).unwrap_or(u64::MAX)
    }

    /// How long a slice debited at the store's `server_at` may be spent: its lifetime, and for a
    /// window no longer than the window it was counted in (epoch-aligned or calendar, as the
    /// algorithms: `Limit::window_at`).
    fn life(&self, limit: &Limit, server_at: u64) -> u64 {
        let lifetime = self.lifetime_ns();
        if is_window(limit.algorithm()) { lifetime.min(limit.window_at(server_at).1 - server_at) } else { lifetime }
    }

    /// The most this node holds of `limit`'s capacity at once (`g_max` in the bound).
    #[must_use]
    pub fn max_held(&self, limit: &Limit) -> u64 {
        (limit.capacity().saturating_mul(self.options.share_percent) / 100).max(1)
    }

    /// The slice to ask for (see the module docs).
    fn size(&self, limit: &Limit, st: &State, now: u64) -> u64 {
        let capacity = limit.capacity();
        let since = now.saturating_sub(st.last_sent);
        // The script forgets a lessee after a lifetime: so does this count.
        let lessees = if since < self.lifetime_ns() { st.lessees.max(1) } else { 1 };
        let horizon = self.lifetime_ns() as f64 / 4e9;
        let mut want = whole_units(st.rate * horizon);
        want = want.min((self.max_held(limit) / lessees).max(1));
        if st.last_sent > 0 {
            // What the store has left now, estimated from the latest grant: refilled since for a
            // bucket, all of it in a new window.
            let server_now = st.last_server_at + since;
            let left = if limit.algorithm().is_bucket() {
                st.left.saturating_add(since / limit.emission_interval_ns()).min(capacity)
            } else if limit.window_at(server_now).0 != limit.window_at(st.last_server_at).0 {
                capacity
            } else {
                st.left
            };
            want = want.min((left / lessees).max(1));
            if is_window(limit.algorithm()) {
                let rest = limit.window_at(server_now).1 - server_now;
                want = want.min(whole_units(st.rate * rest as f64 / 1e9));
            }
        }
        want.clamp(1, capacity.max(1))
    }

    /// Starts a refill of `entry` if none is in flight and none failed lately.
    fn order(&self, entry: &Arc<Entry>, st: &mut State, now: u64) -> Option<Order> {
        if st.in_flight || now < st.backoff_until {
            return None;
        }
        // What is held and what is asked never exceed `max_held` together.
        let want = self.size(&entry.limit, st, now).min(self.max_held(&entry.limit).saturating_sub(st.held()));
        if want == 0 {
            return None;
        }
        st.in_flight = true;
        Some(Order { entry: entry.clone(), want, sent: now, freed: st.freed, done: false })
    }

    /// Moves past expired or spent slices, counting what expired unspent.
    fn retire(&self, st: &mut State, now: u64) {
        while let Some(slice) = st.current {
            if slice.expires > now && slice.units > 0 {
                break;
            }
            if slice.expires <= now {
                self.forfeit(slice.units);
            }
            st.current = st.next.take();
        }
    }

    fn forfeit(&self, units: u64) {
        if units > 0 {
            self.counters.units_forfeited.fetch_add(units, Ordering::Relaxed);
        }
    }

    /// Every epoch: lets go of keys that cooled down (their slices are forfeited).
    fn sweep(&self, now: u64) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now < last + EPOCH_NS * 5
            || self.last_sweep.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return;
        }
        let cool_rate = self.options.hot_rate as f64 / 4.0;
        let mut entries = self.entries.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.retain(|_, entry| {
            let mut st = entry.lock();
            st.roll(now);
            let idle = now.saturating_sub(st.last_active) >= COOL_NS;
            let cold = match self.options.mode {
                LeaseMode::Always => idle,
                _ => idle || (st.rate < cool_rate && st.cool_since.is_some_and(|t| now.saturating_sub(t) >= COOL_NS)),
            };
            if st.rate < cool_rate {
                st.cool_since.get_or_insert(now);
            } else {
                st.cool_since = None;
            }
            if cold && !st.in_flight {
                self.forfeit(st.held());
                return false;
            }
            true
        });
    }
}
