//! All-or-nothing checks of several keys ([`MemoryStore::check_all_sync`]).
//!
//! Every shard involved is locked for write, GCRA shards before the others and each table's in
//! ascending order (single-key checks hold one lock at a time, so this order cannot deadlock).
//! Holding the write locks excludes the lock-free GCRA path too, since it runs under the read
//! lock. The checks are then decided in order on scratch copies (a key named twice sees its
//! first check's effect), and the copies are written back only if every check admitted.

use std::sync::RwLockWriteGuard;

use tollgate_core::{Algorithm, Decision, Limit, State, algorithm::Gcra};

use super::MemoryStore;
use super::slots::{GcraSlot, StateSlot};
use super::table::Shard;
use crate::{Check, StoreError};

/// A check's key and what deciding it in order produced.
struct Pending<'a> {
    fingerprint: u64,
    limit: &'a Limit,
    /// The state after this check, if it consumed: a TAT or a `State`.
    after: Option<After>,
}

enum After {
    Tat(u64),
    State(State),
}

impl MemoryStore {
    pub(super) fn check_many(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        let now = self.clock.now_ns();
        let mut pending: Vec<Pending<'_>> = checks
            .iter()
            .map(|c| Pending { fingerprint: self.fingerprint(c.limit.algorithm(), c.key), limit: c.limit, after: None })
            .collect();
        let is_gcra = |p: &Pending<'_>| p.limit.algorithm() == Algorithm::Gcra;

        let mut gcra_shards: Vec<usize> =
            pending.iter().filter(|p| is_gcra(p)).map(|p| self.gcra.shard_of(p.fingerprint)).collect();
        let mut state_shards: Vec<usize> =
            pending.iter().filter(|p| !is_gcra(p)).map(|p| self.states.shard_of(p.fingerprint)).collect();
        for shards in [&mut gcra_shards, &mut state_shards] {
            shards.sort_unstable();
            shards.dedup();
        }
        let mut gcra_guards: Vec<(usize, RwLockWriteGuard<'_, Shard<GcraSlot>>)> =
            gcra_shards.iter().map(|&i| (i, self.gcra.write(i))).collect();
        let mut state_guards: Vec<(usize, RwLockWriteGuard<'_, Shard<StateSlot>>)> =
            state_shards.iter().map(|&i| (i, self.states.write(i))).collect();

        // Decide in order, each check seeing the pending effect of earlier checks of its key.
        let mut decisions = Vec::with_capacity(checks.len());
        for i in 0..pending.len() {
            let (fingerprint, limit, cost) = (pending[i].fingerprint, pending[i].limit, checks[i].cost);
            let earlier = pending[..i].iter().rev().find(|p| p.fingerprint == fingerprint && p.after.is_some());
            let decision = if is_gcra(&pending[i]) {
                let tat = match earlier.and_then(|p| p.after.as_ref()) {
                    Some(After::Tat(tat)) => *tat,
                    _ => guard_of(&gcra_guards, self.gcra.shard_of(fingerprint))
                        .slots
                        .find(fingerprint, |s| s.fingerprint == fingerprint)
                        .map_or(0, |s| s.tat.load(std::sync::atomic::Ordering::Acquire)),
                };
                let (decision, next) = Gcra::step(tat, now, limit, cost)?;
                pending[i].after = next.map(After::Tat);
                decision
            } else {
                let mut state = match earlier.and_then(|p| p.after.as_ref()) {
                    Some(After::State(state)) => state.clone(),
                    _ => guard_of(&state_guards, self.states.shard_of(fingerprint))
                        .slots
                        .find(fingerprint, |s| s.fingerprint == fingerprint)
                        .map_or_else(|| State::idle(limit), |s| s.state.clone()),
                };
                let decision = state.check(now, limit, cost)?;
                if decision.allowed && cost > 0 {
                    pending[i].after = Some(After::State(state));
                }
                decision
            };
            decisions.push(decision);
        }

        if decisions.iter().all(|d| d.allowed) {
            // Commit in order: a key named twice ends with its last check's state.
            for p in pending.iter_mut() {
                match p.after.take() {
                    Some(After::Tat(tat)) => {
                        let shard = guard_of_mut(&mut gcra_guards, self.gcra.shard_of(p.fingerprint));
                        match shard.slots.find(p.fingerprint, |s| s.fingerprint == p.fingerprint) {
                            Some(slot) => slot.tat.store(tat, std::sync::atomic::Ordering::Release),
                            None => self.gcra.insert(shard, GcraSlot::new(p.fingerprint, tat), now),
                        }
                    }
                    Some(After::State(state)) => {
                        let shard = guard_of_mut(&mut state_guards, self.states.shard_of(p.fingerprint));
                        let slot = StateSlot::new(p.fingerprint, state, p.limit);
                        match shard.slots.find_mut(p.fingerprint, |s| s.fingerprint == p.fingerprint) {
                            Some(existing) => {
                                shard.heap_bytes =
                                    shard.heap_bytes + slot.state.heap_bytes() - existing.state.heap_bytes();
                                *existing = slot;
                            }
                            None => self.states.insert(shard, slot, now),
                        }
                    }
                    None => {}
                }
            }
            return Ok(decisions);
        }

        // Denied: nothing is written; the checks that did not block report their state as is.
        for (i, decision) in decisions.iter_mut().enumerate().filter(|(_, d)| d.allowed) {
            let (fingerprint, limit) = (pending[i].fingerprint, pending[i].limit);
            *decision = if limit.algorithm() == Algorithm::Gcra {
                let tat = guard_of(&gcra_guards, self.gcra.shard_of(fingerprint))
                    .slots
                    .find(fingerprint, |s| s.fingerprint == fingerprint)
                    .map_or(0, |s| s.tat.load(std::sync::atomic::Ordering::Acquire));
                Gcra::step(tat, now, limit, 0)?.0
            } else {
                guard_of(&state_guards, self.states.shard_of(fingerprint))
                    .slots
                    .find(fingerprint, |s| s.fingerprint == fingerprint)
                    .map_or_else(|| State::idle(limit), |s| s.state.clone())
                    .check(now, limit, 0)?
            };
        }
        Ok(decisions)
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
