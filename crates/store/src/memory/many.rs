//! Several keys at once, atomically: all-or-nothing checks ([`MemoryStore::check_all_sync`]), and
//! the remote store's call (charges, then checks, then snapshots; see `remote`).
//!
//! Every shard involved is locked for write, GCRA shards before the others and each table's in
//! ascending order (single-key checks hold one lock at a time, so this order cannot deadlock).
//! Holding the write locks excludes the lock-free GCRA path too, since it runs under the read
//! lock. Each key's state is copied into a scratch value; charges and checks are applied in order
//! to the copies (a key named twice sees its earlier effect), and the copies are written back:
//! the charges' always, the checks' only if every check admitted. A check its scope holds (see
//! `holds`) is denied, charging nothing, as the Redis script denies it.

use std::sync::RwLockWriteGuard;

use tollgate_core::{Algorithm, Decision, Limit, Snapshot, State, algorithm::Gcra};

use super::MemoryStore;
use super::slots::{GcraSlot, StateSlot};
use crate::remote::{CHARGES_REMEMBERED, Charge, Reply};
use crate::table::Shard;
use crate::{Check, StoreError, held_decision};

/// A key's state while a call is decided: GCRA's (a slot's TAT and interval), or any other.
#[derive(Clone)]
pub(super) enum Scratch {
    Tat(Gcra),
    State(State),
}

impl Scratch {
    pub(super) fn check(&mut self, now: u64, limit: &Limit, cost: u64) -> Result<Decision, StoreError> {
        match self {
            Scratch::Tat(gcra) => Ok(tollgate_core::RateState::check(gcra, now, limit, cost)?),
            Scratch::State(state) => Ok(state.check(now, limit, cost)?),
        }
    }

    pub(super) fn charge(&mut self, at: u64, limit: &Limit, cost: u64) -> Result<(), StoreError> {
        match self {
            Scratch::Tat(gcra) => tollgate_core::RateState::charge(gcra, at, limit, cost)?,
            Scratch::State(state) => state.charge(at, limit, cost)?,
        }
        Ok(())
    }

    /// Whether this bucket differs from `read`, the state it was checked from (a refusal under
    /// another rate rewrote it); false for the window family, whose checks are not compared.
    fn rescaled(&self, read: &Scratch) -> bool {
        match (self, read) {
            (Scratch::Tat(now), Scratch::Tat(read)) => now != read,
            (Scratch::State(now @ (State::TokenBucket(_) | State::LeakyBucket(_))), Scratch::State(read)) => {
                now != read
            }
            _ => false,
        }
    }

    fn snapshot(&self, now: u64, limit: &Limit) -> Snapshot {
        match self {
            Scratch::Tat(gcra) => tollgate_core::RateState::snapshot(gcra, now, limit),
            Scratch::State(state) => state.snapshot(now, limit),
        }
    }
}

/// One key of the call: its fingerprint, its state as stored, as charged, and as checked.
struct Key<'a> {
    fingerprint: u64,
    limit: &'a Limit,
    stored: Option<Scratch>,
    charged: Option<Scratch>,
    checked: Option<Scratch>,
}

/// Shards locked for write, by index.
pub(super) type Guards<'l, S> = Vec<(usize, RwLockWriteGuard<'l, Shard<S>>)>;

/// The idle state of `limit`'s algorithm.
pub(super) fn fresh(limit: &Limit) -> Scratch {
    if limit.algorithm() == Algorithm::Gcra {
        Scratch::Tat(Gcra::default())
    } else {
        Scratch::State(State::idle(limit))
    }
}

impl MemoryStore {
    /// Records `charges` (`(charge, at)`: `charge.check.cost` at instant `at`, each unit at most
    /// once per origin, then the key's remaining lowered to what the charge says its sender knew),
    /// then decides `checks` all or nothing (a check whose key its scope holds denied); returns
    /// the decisions, if `snapshots` each check's snapshot, now and the checks a hold denied.
    pub(crate) fn check_many(
        &self,
        checks: &[Check<'_>],
        charges: &[(Charge<'_>, u64)],
        snapshots: bool,
    ) -> Result<Reply, StoreError> {
        let now = self.clock.now_ns();
        let every = charges.iter().map(|(c, _)| &c.check).chain(checks);
        let mut keys: Vec<Key<'_>> = Vec::new();
        for check in every.clone() {
            let fingerprint = self.fingerprint(check);
            if !keys.iter().any(|k| k.fingerprint == fingerprint) {
                keys.push(Key { fingerprint, limit: check.limit, stored: None, charged: None, checked: None });
            }
        }
        let is_gcra = |k: &Key<'_>| k.limit.algorithm() == Algorithm::Gcra;
        let mut gcra_shards: Vec<usize> =
            keys.iter().filter(|k| is_gcra(k)).map(|k| self.gcra.shard_of(k.fingerprint)).collect();
        let mut state_shards: Vec<usize> =
            keys.iter().filter(|k| !is_gcra(k)).map(|k| self.states.shard_of(k.fingerprint)).collect();
        for shards in [&mut gcra_shards, &mut state_shards] {
            shards.sort_unstable();
            shards.dedup();
        }
        let (gcra_guards, state_guards) = self.lock(&gcra_shards, &state_shards);
        let mut guards = (gcra_guards, state_guards);

        for key in &mut keys {
            key.stored = self.stored(&guards, key.fingerprint, key.limit);
        }
        let index = |keys: &[Key<'_>], check: &Check<'_>| {
            let fp = self.fingerprint(check);
            keys.iter().position(|k| k.fingerprint == fp).unwrap_or(0)
        };

        // 1. Charges, whatever the limits say, each unit once per origin: of a charge, what lies
        // above the highest running total applied from its origin (see `Charge::origin`; a part
        // counts at now).
        let mut applied: Vec<(usize, u64, u64)> = Vec::new();
        for (charge, at) in charges {
            let check = &charge.check;
            let i = index(&keys, check);
            let key = &mut keys[i];
            let mut state = key.charged.take().or_else(|| key.stored.clone()).unwrap_or_else(|| fresh(check.limit));
            let (part, at) = match charge.origin {
                None => (check.cost, *at),
                Some(origin) => {
                    let done = applied.iter().filter(|(k, n, _)| *k == i && *n == origin.node).map(|a| a.2).max();
                    let done = done.unwrap_or_else(|| self.applied.highest(key.fingerprint, origin.node, now));
                    if origin.total > done {
                        applied.push((i, origin.node, origin.total));
                    }
                    let part = check.cost.min(origin.total.saturating_sub(done));
                    (part, if part < check.cost { now } else { *at })
                }
            };
            if part > 0 {
                state.charge(at, check.limit, part)?;
            }
            // Not over a reset or refund since the sender's view, and a view only for a key this
            // store lost (see `Charge::seen` and `Charge::view`).
            let applies = charge.seen.is_none_or(|seen| {
                let behind = || {
                    let held = state.snapshot(seen.at, check.limit);
                    held.used < seen.used || held.previous < seen.previous
                };
                !self.applied.changed_since(key.fingerprint, seen.at, now) && (!charge.view || behind())
            });
            if let Some(known) = charge.known_remaining.filter(|_| applies) {
                let remaining = state.clone().check(now, check.limit, 0)?.remaining;
                if remaining > known {
                    state.charge(now, check.limit, remaining - known)?;
                }
            }
            key.charged = Some(state);
        }
        // Remembered as long as the Redis script's marker (see `remote::CHARGES_REMEMBERED`).
        let until = now.saturating_add(u64::try_from(CHARGES_REMEMBERED.as_nanos()).unwrap_or(u64::MAX));
        for &(i, node, total) in &applied {
            self.applied.remember(keys[i].fingerprint, node, total, until, now);
        }
        // 2. Checks, in order; one its scope holds is denied, consuming nothing.
        let mut decisions = Vec::with_capacity(checks.len());
        let mut held = Vec::new();
        for (c, check) in checks.iter().enumerate() {
            let i = index(&keys, check);
            let key = &mut keys[i];
            let mut state = key
                .checked
                .clone()
                .or_else(|| key.charged.clone())
                .or_else(|| key.stored.clone())
                .unwrap_or_else(|| fresh(check.limit));
            if let Some(left) = self.hold_left(check, now) {
                held.push(c);
                decisions.push(held_decision(&state.check(now, check.limit, 0)?, left));
                continue;
            }
            let decision = state.check(now, check.limit, check.cost)?;
            if decision.allowed && check.cost > 0 {
                key.checked = Some(state);
            }
            decisions.push(decision);
        }
        let admitted = decisions.iter().all(|d| d.allowed);
        let outcome = |key: &Key<'_>| {
            if admitted { key.checked.clone().or_else(|| key.charged.clone()) } else { key.charged.clone() }
        };
        if !admitted {
            // Nothing of the checks is kept; those that did not block report the state as is.
            for (check, decision) in checks.iter().zip(decisions.iter_mut()).filter(|(_, d)| d.allowed) {
                let key = &keys[index(&keys, check)];
                let mut state =
                    key.charged.clone().or_else(|| key.stored.clone()).unwrap_or_else(|| fresh(check.limit));
                *decision = state.check(now, check.limit, 0)?;
            }
            // A refusal under another rate still writes its bucket rescaled into the new rate (see
            // the core's `check`), as a single check does and the Redis script does.
            for (c, check) in checks.iter().enumerate().filter(|(c, ch)| ch.cost > 0 && !held.contains(c)) {
                let i = index(&keys, check);
                let key = &mut keys[i];
                let read = key.charged.clone().or_else(|| key.stored.clone()).unwrap_or_else(|| fresh(check.limit));
                let mut state = read.clone();
                if !decisions[c].allowed && !state.check(now, check.limit, check.cost)?.allowed && state.rescaled(&read)
                {
                    key.charged = Some(state);
                }
            }
        }
        let snapshots = checks
            .iter()
            .filter(|_| snapshots)
            .map(|check| {
                let key = &keys[index(&keys, check)];
                outcome(key)
                    .or_else(|| key.stored.clone())
                    .unwrap_or_else(|| fresh(check.limit))
                    .snapshot(now, check.limit)
            })
            .collect();

        // 3. Write back, never evicting a key of this call.
        let keep: Vec<u64> = keys.iter().map(|k| k.fingerprint).collect();
        for key in &keys {
            if let Some(state) = outcome(key) {
                self.write(&mut guards, key.fingerprint, key.limit, state, now, &keep);
            }
        }
        Ok(Reply { decisions, snapshots, now_ns: now, held })
    }

    /// The shards `gcra` and `states` (each sorted, without repeats) locked for write, GCRA's
    /// first (see the module docs).
    pub(super) fn lock(&self, gcra: &[usize], states: &[usize]) -> (Guards<'_, GcraSlot>, Guards<'_, StateSlot>) {
        (
            gcra.iter().map(|&i| (i, self.gcra.write(i))).collect(),
            states.iter().map(|&i| (i, self.states.write(i))).collect(),
        )
    }

    /// The state stored for `fp` (its shard locked in `guards`), if any.
    pub(super) fn stored(
        &self,
        guards: &(Guards<'_, GcraSlot>, Guards<'_, StateSlot>),
        fp: u64,
        limit: &Limit,
    ) -> Option<Scratch> {
        if limit.algorithm() == Algorithm::Gcra {
            guard_of(&guards.0, self.gcra.shard_of(fp))
                .slots
                .find(fp, |s| s.fingerprint == fp)
                .map(|s| Scratch::Tat(s.gcra()))
        } else {
            guard_of(&guards.1, self.states.shard_of(fp))
                .slots
                .find(fp, |s| s.fingerprint == fp)
                .map(|s| Scratch::State(s.state.clone()))
        }
    }

    /// Writes `state` as `fp`'s (its shard locked in `guards`), never evicting a key of `keep`.
    pub(super) fn write(
        &self,
        guards: &mut (Guards<'_, GcraSlot>, Guards<'_, StateSlot>),
        fp: u64,
        limit: &Limit,
        state: Scratch,
        now: u64,
        keep: &[u64],
    ) {
        match state {
            Scratch::Tat(gcra) => {
                let shard = guard_of_mut(&mut guards.0, self.gcra.shard_of(fp));
                match shard.slots.find(fp, |s| s.fingerprint == fp) {
                    Some(slot) => slot.set(gcra),
                    None => self.gcra.insert(shard, GcraSlot::new(fp, gcra), now, keep),
                }
            }
            Scratch::State(state) => {
                let shard = guard_of_mut(&mut guards.1, self.states.shard_of(fp));
                let slot = StateSlot::new(fp, state, limit);
                match shard.slots.find_mut(fp, |s| s.fingerprint == fp) {
                    Some(existing) => {
                        let (before, after) = (existing.state.heap_bytes(), slot.state.heap_bytes());
                        *existing = slot;
                        shard.heap_bytes -= before;
                        self.states.grew(shard, after, now, keep);
                    }
                    None => self.states.insert(shard, slot, now, keep),
                }
            }
        }
    }

    /// Removes `fp`'s state (its shard locked in `guards`); the state removed, if any.
    pub(super) fn take(
        &self,
        guards: &mut (Guards<'_, GcraSlot>, Guards<'_, StateSlot>),
        fp: u64,
        limit: &Limit,
    ) -> Option<Scratch> {
        if limit.algorithm() == Algorithm::Gcra {
            let slot = self.gcra.take(guard_of_mut(&mut guards.0, self.gcra.shard_of(fp)), fp)?;
            Some(Scratch::Tat(slot.gcra()))
        } else {
            let slot = self.states.take(guard_of_mut(&mut guards.1, self.states.shard_of(fp)), fp)?;
            Some(Scratch::State(slot.state))
        }
    }
}

fn guard_of<'g, S>(guards: &'g [(usize, RwLockWriteGuard<'_, Shard<S>>)], shard: usize) -> &'g Shard<S> {
    &guards.iter().find(|(i, _)| *i == shard).expect("every involved shard is locked").1
}

fn guard_of_mut<'g, 'l, S>(
    guards: &'g mut [(usize, RwLockWriteGuard<'l, Shard<S>>)],
    shard: usize,
) -> &'g mut Shard<S> {
    &mut guards.iter_mut().find(|(i, _)| *i == shard).expect("every involved shard is locked").1
}
