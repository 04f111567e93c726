//! The ledger: what a node knows of each key of a remote store, so that deciding locally never
//! lets the node admit more than the limit.
//!
//! Per key (bounded like the memory store, see `table`):
//! - the **snapshot** of the key from the latest reply the node received (the remote's state,
//!   every node's admissions included, as of that reply);
//! - the **in-flight** cost: calls sent and not answered yet, which the remote may still admit;
//! - the **debt**: what this node admitted locally and the remote has not recorded yet, as charges
//!   `(at, cost)` sent with every call for the key (and by the background flush) until a reply
//!   confirms them. The remote applies each unit once (the node numbers its charges to the key by
//!   their running total, and the remote keeps the highest total it applied from the node: see
//!   [`Origin`] and `pending`), then lowers the key to what the node knows of it, debt included
//!   but for what the remote may hold already ([`Charge::known_remaining`]), so a remote that lost
//!   the key (expired while the node decided alone, restarted empty, a replica promoted without
//!   the last writes) is given back what the node's decisions relied on.
//!
//! [`Origin`]: crate::remote::Origin
//! [`Charge::known_remaining`]: crate::remote::Charge::known_remaining
//!
//! A local decision rebuilds the key's state from the snapshot, charges it with the debt and with
//! the in-flight cost (as if every call still in flight were admitted), and decides on that.
//! Instants are on the remote's clock (the node's clock plus the offset seen in replies).

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::{Decision, Limit, Snapshot, State};

use super::merge::later_part;
use super::pending::{Charges, Numbering, Pending};
use crate::remote::{RESEND_HORIZON, Reply};
use crate::table::{Shard, Slot, SlotTable};
use crate::{Check, StoreError};

/// What the node knew of a key it owes nothing on, for a remote that may have lost it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct View {
    /// The key's index in the call's checks.
    pub(crate) check: usize,
    /// Its remaining at the call's now, as the node follows it.
    pub(crate) remaining: u64,
    /// The remote's snapshot it follows from.
    pub(crate) seen: Snapshot,
}

/// What a key owes the remote, with what is needed to send it.
#[derive(Debug, Clone)]
pub(crate) struct Debt {
    pub(crate) scope: Box<str>,
    pub(crate) key: Box<[u8]>,
    pub(crate) limit: Limit,
    pub(crate) charges: Vec<Pending>,
    /// The origin id its charges are sent under (see `pending`).
    pub(crate) origin: u64,
    /// The key's remaining as this node follows it (the latest snapshot charged with the debt),
    /// when the debt was taken to be sent.
    pub(crate) known_remaining: Option<u64>,
    /// That latest snapshot.
    pub(crate) seen: Option<Snapshot>,
}

struct Entry {
    fingerprint: u64,
    /// The latest snapshot received, and when its state is idle.
    seen: Option<(Snapshot, u64)>,
    /// How many calls had failed when the call that brought `seen` was sent: a failure since
    /// (a restart, a failover) may have lost the key on the remote.
    seen_epoch: u64,
    /// The highest running total of the key's charges sent when `seen` came (under its origin
    /// id): `seen` may hold them (a call that carried them may have run before, its reply lost or
    /// not yet in), and holds none sent after.
    seen_sent: Option<(u64, u64)>,
    in_flight: u64,
    debt: Option<Box<Debt>>,
    /// How the key's charges are numbered, past each debt (see `pending`).
    numbering: Numbering,
}

impl Entry {
    fn new(fingerprint: u64) -> Self {
        Entry {
            fingerprint,
            seen: None,
            seen_epoch: 0,
            seen_sent: None,
            in_flight: 0,
            debt: None,
            numbering: Numbering::default(),
        }
    }
}

impl Slot for Entry {
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    fn idle_at(&self) -> u64 {
        if self.in_flight > 0 || self.debt.is_some() { u64::MAX } else { self.seen.map_or(0, |(_, idle)| idle) }
    }

    fn heap_bytes(&self) -> usize {
        self.debt.as_ref().map_or(0, |d| {
            let charges = d.charges.capacity() * std::mem::size_of::<Pending>();
            std::mem::size_of::<Debt>() + d.scope.len() + d.key.len() + charges
        })
    }
}

/// `entry`'s debt, with what the node knows of the key at `now` (the remote's clock): the state
/// it last saw, charged with the debt (not with calls in flight: the remote may deny those), but
/// for what was sent before that state came, which it may hold already: counted twice, the remote
/// would be told the key is lower than it is, and lower it so (a local decision counts it:
/// stricter).
fn owed(entry: &Entry, now: u64) -> Option<Debt> {
    let mut debt = entry.debt.as_deref()?.clone();
    debt.origin = entry.numbering.origin;
    let limit = &debt.limit;
    let mut state =
        entry.seen.map_or_else(|| State::idle(limit), |(snapshot, _)| State::from_snapshot(limit, &snapshot));
    let held = entry.seen_sent.filter(|&(origin, _)| origin == debt.origin).map_or(0, |(_, total)| total);
    let charged = debt.charges.iter().filter(|c| c.total > held).try_for_each(|c| {
        let c = if c.total.saturating_sub(c.cost) < held { later_part(limit, *c, c.total - held) } else { *c };
        state.charge(c.at, limit, c.cost)
    });
    debt.known_remaining = charged.ok().and_then(|()| state.check(now, limit, 0).ok()).map(|d| d.remaining);
    debt.seen = entry.seen.map(|(snapshot, _)| snapshot);
    Some(debt)
}

/// Keeps `snapshot` (idle at `idle`) as what `entry` last saw, unless it keeps a newer one, from a
/// call sent when `epoch` calls had failed (see [`Ledger::record`]).
fn keep(entry: &mut Entry, snapshot: &Snapshot, idle: u64, epoch: u64) {
    if entry.seen.is_none_or(|(seen, _)| seen.at <= snapshot.at) {
        entry.seen = Some((*snapshot, idle));
        entry.seen_epoch = epoch;
        let charges = entry.debt.iter().flat_map(|d| &d.charges);
        let sent = charges.filter(|c| c.sent_at != 0).map(|c| c.total).max();
        entry.seen_sent = sent.map(|total| (entry.numbering.origin, total));
    }
}

/// The ledger of a failure policy.
pub(crate) struct Ledger {
    table: SlotTable<Entry>,
    hasher: foldhash::quality::RandomState,
    /// This node's id, the first of its charges' origin ids (see `pending`).
    node: u64,
    seq: AtomicU64,
    /// Origin ids given out so far.
    origins: AtomicU64,
}

impl Ledger {
    pub(crate) fn new(max_keys: usize, max_bytes: usize) -> Self {
        let shards = (max_keys / 1024).next_power_of_two().clamp(1, 64);
        let hasher = foldhash::quality::RandomState::default();
        // Random per ledger (the hasher's seed is): a restarted node is a new origin.
        let node = {
            use std::hash::BuildHasher;
            hasher.hash_one(std::time::SystemTime::now())
        };
        Ledger {
            table: SlotTable::new(shards, max_keys, max_bytes),
            hasher,
            node,
            seq: AtomicU64::new(1),
            origins: AtomicU64::new(0),
        }
    }

    /// A new origin id for a key's charges: random per process (as the node's id), never 0.
    fn new_origin(&self) -> u64 {
        loop {
            let origin = self.node.wrapping_add(self.origins.fetch_add(1, Ordering::Relaxed));
            if origin != 0 {
                return origin;
            }
        }
    }

    fn fingerprint(&self, check: &Check<'_>) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one((check.scope, check.limit.algorithm() as u8, check.key))
    }

    /// Runs `f` on the entry of `check` (created if missing and `create`).
    fn with<T>(&self, check: &Check<'_>, now: u64, create: bool, f: impl FnOnce(&mut Entry) -> T) -> Option<T> {
        let fingerprint = self.fingerprint(check);
        let mut shard = self.table.write(self.table.shard_of(fingerprint));
        if shard.slots.find(fingerprint, |e| e.fingerprint == fingerprint).is_none() {
            if !create {
                return None;
            }
            let entry = Entry::new(fingerprint);
            self.table.insert(&mut shard, entry, now, &[]);
        }
        let entry = shard.slots.find_mut(fingerprint, |e| e.fingerprint == fingerprint)?;
        let before = entry.heap_bytes();
        let result = f(entry);
        let after = entry.heap_bytes();
        shard.heap_bytes -= before;
        self.table.grew(&mut shard, after, now, &[fingerprint]);
        Some(result)
    }

    /// Calls for `checks` are about to be sent.
    pub(crate) fn begin(&self, checks: &[Check<'_>], now: u64) {
        for check in checks.iter().filter(|c| c.cost > 0) {
            self.with(check, now, true, |e| e.in_flight += check.cost);
        }
    }

    /// The calls for `checks` were answered, failed or given up.
    pub(crate) fn end(&self, checks: &[Check<'_>], now: u64) {
        for check in checks.iter().filter(|c| c.cost > 0) {
            self.with(check, now, false, |e| e.in_flight = e.in_flight.saturating_sub(check.cost));
        }
    }

    /// What a call for `checks` carries, in one look at each key (each once): the debts of those
    /// owing the remote, and for those owing nothing that this node saw busy (not idle at `now`)
    /// before a call failed (`epoch` failed calls now; 0: none wanted) their remaining at `now` as
    /// the node knows it, with the snapshot it comes from (a [`View`]). The remote may have lost
    /// those (restarted empty, failed over to a replica that missed the last writes): the call
    /// tells it what the node knew, for a key it lost. The call is sent at `now` (see `pending`).
    pub(crate) fn outgoing(&self, checks: &[Check<'_>], now: u64, epoch: u64) -> (Vec<Debt>, Vec<View>) {
        self.sending(checks, now, epoch, false)
    }

    /// [`outgoing`](Self::outgoing) and [`begin`](Self::begin) in the same look at each key (one
    /// lock and one lookup per key, not two): what a call for `checks` carries, its costs counted
    /// in flight from then on.
    pub(crate) fn send(&self, checks: &[Check<'_>], now: u64, epoch: u64) -> (Vec<Debt>, Vec<View>) {
        self.sending(checks, now, epoch, true)
    }

    fn sending(&self, checks: &[Check<'_>], now: u64, epoch: u64, begin: bool) -> (Vec<Debt>, Vec<View>) {
        let horizon = u64::try_from(RESEND_HORIZON.as_nanos()).unwrap_or(u64::MAX);
        // The keys looked at already (a lone check, the usual call, allocates nothing).
        let mut seen: Vec<u64> = Vec::new();
        let (mut debts, mut views) = (Vec::new(), Vec::new());
        for (i, check) in checks.iter().enumerate() {
            let fingerprint = self.fingerprint(check);
            let first = !seen.contains(&fingerprint);
            if checks.len() > 1 && first {
                seen.push(fingerprint);
            }
            let in_flight = if begin { check.cost } else { 0 };
            if !first && in_flight == 0 {
                continue;
            }
            let found = self.with(check, now, in_flight > 0, |e| {
                e.in_flight += in_flight;
                if !first {
                    return None;
                }
                if let Some(debt) = e.debt.as_deref_mut() {
                    let mut charges = Charges { list: &mut debt.charges, numbering: &mut e.numbering };
                    charges.send(now, horizon, || self.new_origin());
                }
                if let Some(debt) = owed(e, now) {
                    return Some(Ok(debt));
                }
                let (snapshot, idle) = e.seen?;
                if e.seen_epoch >= epoch || idle <= now {
                    return None;
                }
                let mut state = State::from_snapshot(check.limit, &snapshot);
                state.check(now, check.limit, 0).ok().map(|d| Err((d.remaining, snapshot)))
            });
            match found {
                Some(Some(Ok(debt))) => debts.push(debt),
                Some(Some(Err((remaining, seen)))) => views.push(View { check: i, remaining, seen }),
                _ => {}
            }
        }
        (debts, views)
    }

    /// Every debt, for the background flush (what is known of each key taken at `now`).
    pub(crate) fn debts(&self, now: u64) -> Vec<Debt> {
        (0..self.table.shard_count())
            .flat_map(|i| {
                let shard = self.table.read(i);
                shard.slots.iter().filter_map(|e| owed(e, now)).collect::<Vec<_>>()
            })
            .collect()
    }

    /// A reply confirmed these debts' charges: drop them (see `Charges::confirm`).
    pub(crate) fn settle<'d>(&self, sent: impl IntoIterator<Item = &'d Debt>, now: u64) {
        for debt in sent {
            // In sequence order, and so of total: the last is the latest.
            let Some(last) = debt.charges.last() else { continue };
            let check = Check {
                scope: &debt.scope,
                key: &debt.key,
                limit: &debt.limit,
                cost: 0,
                hold: false,
                reporting: false,
            };
            self.with(&check, now, false, |e| {
                if let Some(mine) = e.debt.as_mut() {
                    let mut charges = Charges { list: &mut mine.charges, numbering: &mut e.numbering };
                    charges.confirm(&debt.limit, debt.origin, last.seq, last.total);
                    if mine.charges.is_empty() {
                        e.debt = None;
                    }
                }
            });
        }
    }

    /// Keeps the snapshots of a reply to `checks` (newer than what is kept), from a call sent
    /// when `epoch` calls had failed, with how far the key's charges were sent then (the snapshot
    /// may hold them: the call carried them, or another that may have run before; a lease carries
    /// none).
    pub(crate) fn record(&self, checks: &[Check<'_>], reply: &Reply, now: u64, epoch: u64) {
        for (check, snapshot) in checks.iter().zip(&reply.snapshots) {
            let idle = snapshot.idle_at(check.limit);
            let fresh = snapshot.used > 0 || snapshot.previous > 0;
            self.with(check, now, fresh, |e| keep(e, snapshot, idle, epoch));
        }
    }

    /// The call for `checks` (counted in flight by [`send`](Self::send)) was answered with
    /// `reply`: [`end`](Self::end) and [`record`](Self::record) in the same look at each key, so
    /// that no local decision in between finds the call neither in flight nor in the snapshot.
    pub(crate) fn answered(&self, checks: &[Check<'_>], reply: &Reply, now: u64, epoch: u64) {
        for (i, check) in checks.iter().enumerate() {
            let snapshot = reply.snapshots.get(i).map(|s| (s, s.idle_at(check.limit)));
            let fresh = snapshot.is_some_and(|(s, _)| s.used > 0 || s.previous > 0);
            if check.cost == 0 && snapshot.is_none() {
                continue;
            }
            self.with(check, now, fresh, |e| {
                e.in_flight = e.in_flight.saturating_sub(check.cost);
                if let Some((snapshot, idle)) = snapshot {
                    keep(e, snapshot, idle, epoch);
                }
            });
        }
    }

    /// Withdraws a reservation this node decided locally (still owed, not yet charged): true if
    /// it was found in the debt.
    pub(crate) fn refund(&self, refund: &crate::Refund<'_>, now: u64) -> bool {
        self.with(&refund.check, now, false, |e| {
            let Some(debt) = e.debt.as_mut() else { return false };
            let Some(i) = debt.charges.iter().position(|c| c.at == refund.at && c.cost >= refund.check.cost) else {
                return false;
            };
            Charges { list: &mut debt.charges, numbering: &mut e.numbering }.withdraw(i, refund.check.cost);
            if debt.charges.is_empty() {
                e.debt = None;
            }
            true
        })
        .unwrap_or(false)
    }

    /// Forgets a key (after a reset).
    pub(crate) fn forget(&self, check: &Check<'_>) {
        self.table.remove(self.fingerprint(check));
    }

    /// Decides `checks` locally at `now` (the remote's clock), all or nothing; admissions become
    /// debt.
    pub(crate) fn decide(&self, checks: &[Check<'_>], now: u64) -> Result<Vec<Decision>, StoreError> {
        let fingerprints: Vec<u64> = checks.iter().map(|c| self.fingerprint(c)).collect();
        let mut shards: Vec<usize> = fingerprints.iter().map(|&f| self.table.shard_of(f)).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards: Vec<_> = shards.iter().map(|&i| (i, self.table.write(i))).collect();
        let shard_of = |guards: &mut Vec<(usize, std::sync::RwLockWriteGuard<'_, Shard<Entry>>)>, fp: u64| {
            let index = self.table.shard_of(fp);
            guards.iter().position(|(i, _)| *i == index).unwrap_or(0)
        };

        // Each key's state as this node knows it: the snapshot, charged with the debt and with
        // everything still in flight.
        let mut states: Vec<(u64, State)> = Vec::new();
        let mut decisions = Vec::with_capacity(checks.len());
        for (check, &fp) in checks.iter().zip(&fingerprints) {
            if !states.iter().any(|(f, _)| *f == fp) {
                let g = shard_of(&mut guards, fp);
                let entry = guards[g].1.slots.find(fp, |e| e.fingerprint == fp);
                let mut state = match entry.and_then(|e| e.seen) {
                    Some((snapshot, _)) => State::from_snapshot(check.limit, &snapshot),
                    None => State::idle(check.limit),
                };
                if let Some(entry) = entry {
                    for charge in entry.debt.iter().flat_map(|d| &d.charges) {
                        state.charge(charge.at, check.limit, charge.cost)?;
                    }
                    state.charge(now, check.limit, entry.in_flight)?;
                }
                states.push((fp, state));
            }
            let state = &mut states.iter_mut().find(|(f, _)| *f == fp).map(|(_, s)| s).ok_or(StoreError::NoChecks)?;
            let mut probe = state.clone();
            let decision = probe.check(now, check.limit, check.cost)?;
            if decision.allowed {
                **state = probe;
            }
            decisions.push(decision);
        }
        if decisions.iter().any(|d| !d.allowed) {
            // Nothing is admitted; the checks that did not block report the state as a peek would.
            let passed: Vec<usize> = (0..checks.len()).filter(|&i| decisions[i].allowed).collect();
            for i in passed {
                let check = &checks[i];
                let fp = fingerprints[i];
                let g = shard_of(&mut guards, fp);
                let entry = guards[g].1.slots.find(fp, |e| e.fingerprint == fp);
                let mut state = entry.and_then(|e| e.seen).map_or_else(
                    || State::idle(check.limit),
                    |(snapshot, _)| State::from_snapshot(check.limit, &snapshot),
                );
                if let Some(entry) = entry {
                    for charge in entry.debt.iter().flat_map(|d| &d.charges) {
                        state.charge(charge.at, check.limit, charge.cost)?;
                    }
                    state.charge(now, check.limit, entry.in_flight)?;
                }
                decisions[i] = state.check(now, check.limit, 0)?;
            }
            return Ok(decisions);
        }

        // Admitted: each cost is owed to the remote.
        for (check, &fp) in checks.iter().zip(&fingerprints).filter(|(c, _)| c.cost > 0) {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let g = shard_of(&mut guards, fp);
            let shard = &mut *guards[g].1;
            if shard.slots.find(fp, |e| e.fingerprint == fp).is_none() {
                let entry = Entry::new(fp);
                self.table.insert(shard, entry, now, &fingerprints);
            }
            let Some(entry) = shard.slots.find_mut(fp, |e| e.fingerprint == fp) else { continue };
            let before = entry.heap_bytes();
            self.owe_to(entry, check, now, seq);
            let after = entry.heap_bytes();
            shard.heap_bytes -= before;
            self.table.grew(shard, after, now, &fingerprints);
        }
        Ok(decisions)
    }

    /// Owes the remote `checks`' costs, charged at `now` past any limit (a charge the remote
    /// could not take: what a response cost beyond its estimate), as local admissions are owed.
    pub(crate) fn owe(&self, checks: &[Check<'_>], now: u64) {
        for check in checks.iter().filter(|c| c.cost > 0) {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            self.with(check, now, true, |entry| {
                self.owe_to(entry, check, now, seq);
            });
        }
    }

    /// Adds `check`'s cost, charged at `now` as call `seq`, to `entry`'s debt (opened for the
    /// check's key if it has none; the limit is the latest one charged).
    fn owe_to(&self, entry: &mut Entry, check: &Check<'_>, now: u64, seq: u64) {
        let debt = entry.debt.get_or_insert_with(|| {
            Box::new(Debt {
                scope: check.scope.into(),
                key: check.key.into(),
                limit: check.limit.clone(),
                charges: Vec::new(),
                origin: 0,
                known_remaining: None,
                seen: None,
            })
        });
        debt.limit = check.limit.clone();
        let mut charges = Charges { list: &mut debt.charges, numbering: &mut entry.numbering };
        charges.push(check.limit, now, check.cost, seq, || self.new_origin());
    }

    /// Keys with a debt, and live entries evicted (each can make this node over-grant).
    pub(crate) fn counts(&self) -> (usize, u64) {
        let debts = (0..self.table.shard_count())
            .map(|i| self.table.read(i).slots.iter().filter(|e| e.debt.is_some()).count())
            .sum();
        (debts, self.table.evictions().1)
    }
}
