//! The memory store's reservations (see [`crate::reservation`]): a table of records by token,
//! bounded ([`MAX_OPEN_RESERVATIONS`]), each kept until its deadline (a settled one as a
//! tombstone, so that a second settle is told so) and dropped a second later, as Redis drops its
//! records: an index by deadline is swept on each reserve and settle (each record visited once). Reserving holds the
//! table's lock across the decision, so that a reservation refused for a full table charges
//! nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard};

use super::MemoryStore;
use crate::remote::Charge;
use crate::reservation::{Held, Id, Refusal, Reservation, Settled, deadline_ms};
use crate::{Check, Refund, Reserved, StoreError, all_allowed};

/// The most reservations a memory store keeps at once (open, or settled and not past their
/// deadline): 100,000. Past it, a reserve is refused ([`Refusal::Full`]) until some reach their
/// deadline. Their records are also bounded in bytes: a sixteenth of the store's `max_memory`
/// (taken from the states' share), each counted as [`record_bytes`] until it is dropped.
pub const MAX_OPEN_RESERVATIONS: usize = 100_000;

/// How long a record is kept past its deadline, as Redis keeps its own: a settle then is told
/// "expired" (or "settled already") rather than "no open reservation".
const KEPT_PAST_DEADLINE_MS: u64 = 1_000;

/// What a record of `checks` is counted in a memory store's budget: its entry in the table and
/// the index (about 100 bytes), and per check its fields and its key's and scope's bytes.
fn record_bytes(checks: &[Check<'_>]) -> usize {
    let entry = std::mem::size_of::<Entry>() + std::mem::size_of::<(u64, [u8; 16])>() + 64;
    checks.iter().map(|c| std::mem::size_of::<Held>() + c.key.len() + c.scope.len()).sum::<usize>() + entry
}

/// One reservation: its deadline and checks, `None` once settled.
#[derive(Debug)]
struct Entry {
    deadline_ms: u64,
    checks: Option<Vec<Held>>,
    /// What it is counted in the byte bound ([`record_bytes`]), until dropped.
    bytes: usize,
}

/// The records, and their tokens by deadline.
#[derive(Debug, Default)]
pub(super) struct Table {
    records: HashMap<[u8; 16], Entry>,
    by_deadline: BTreeSet<(u64, [u8; 16])>,
    /// The records' bytes ([`record_bytes`]).
    bytes: usize,
}

impl Table {
    fn insert(&mut self, token: [u8; 16], entry: Entry) {
        self.by_deadline.insert((entry.deadline_ms, token));
        self.bytes += entry.bytes;
        self.records.insert(token, entry);
    }

    fn remove(&mut self, token: &[u8; 16]) {
        if let Some(entry) = self.records.remove(token) {
            self.by_deadline.remove(&(entry.deadline_ms, *token));
            self.bytes -= entry.bytes;
        }
    }

    /// Drops the records whose deadline passed [`KEPT_PAST_DEADLINE_MS`] ago or more (expired as
    /// charged, or settled).
    fn sweep(&mut self, now_ms: u64) {
        while let Some(&(deadline, token)) = self.by_deadline.first() {
            if deadline.saturating_add(KEPT_PAST_DEADLINE_MS) > now_ms {
                break;
            }
            self.by_deadline.pop_first();
            if let Some(entry) = self.records.remove(&token) {
                self.bytes -= entry.bytes;
            }
        }
    }
}

/// The table of reservations.
#[derive(Debug)]
pub(super) struct Reservations {
    table: Mutex<Table>,
    /// The most bytes its records are counted ([`record_bytes`]).
    max_bytes: usize,
}

impl Reservations {
    /// A table whose records count at most `max_bytes`.
    pub(super) fn new(max_bytes: usize) -> Self {
        Reservations { table: Mutex::default(), max_bytes }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reservations kept now (open or settled, not yet dropped after their deadline).
    pub(super) fn len(&self) -> usize {
        self.lock().records.len()
    }
}

impl MemoryStore {
    /// [`Store::reserve_until`](crate::Store::reserve_until) without a future.
    pub fn reserve_until_sync(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> Result<(Reserved, Option<Reservation>), StoreError> {
        let mut table = self.reservations.lock();
        table.sweep(self.clock.now_ns() / 1_000_000);
        let bytes = record_bytes(checks);
        if table.records.len() >= MAX_OPEN_RESERVATIONS || table.bytes + bytes > self.reservations.max_bytes {
            return Err(StoreError::Refused(Refusal::Full(table.records.len())));
        }
        crate::reservation::validate(checks, ttl_ns)?;
        let reserved = self.reserve_sync(checks)?;
        if !all_allowed(&reserved.decisions) {
            return Ok((reserved, None));
        }
        let deadline = deadline_ms(reserved.at, ttl_ns)?;
        let id = Id::new(deadline, Vec::new())?;
        let held =
            checks.iter().enumerate().map(|(i, c)| Held::of(c, reserved.instant(i), reserved.decisions[i])).collect();
        table.insert(id.token, Entry { deadline_ms: deadline, checks: Some(held), bytes });
        let reservation = Reservation { id: id.to_string(), deadline_ns: id.deadline_ns() };
        Ok((reserved, Some(reservation)))
    }

    /// [`Store::settle`](crate::Store::settle) without a future.
    pub fn settle_sync(&self, id: &str, actual: u64) -> Result<Settled, StoreError> {
        let parsed = Id::parse(id)?;
        // The memory store's ids name no slot: one that does is not one it made.
        if !parsed.slots.is_empty() {
            return Err(StoreError::Refused(Refusal::Unknown(id.to_string())));
        }
        if actual > crate::reservation::MAX_ACTUAL {
            return Err(StoreError::Refused(Refusal::TooLarge(actual)));
        }
        let now = self.clock.now_ns();
        let checks = {
            let mut table = self.reservations.lock();
            table.sweep(now / 1_000_000);
            let entry = table.records.get_mut(&parsed.token).filter(|e| e.deadline_ms == parsed.deadline_ms);
            let Some(entry) = entry else {
                return Err(StoreError::Refused(if now / 1_000_000 >= parsed.deadline_ms {
                    Refusal::Expired(id.to_string())
                } else {
                    Refusal::Unknown(id.to_string())
                }));
            };
            // Settled already is told first, as Redis's tombstone tells it (until it is dropped).
            if entry.checks.is_none() {
                return Err(StoreError::Refused(Refusal::AlreadySettled(id.to_string())));
            }
            if now / 1_000_000 >= entry.deadline_ms {
                table.remove(&parsed.token);
                return Err(StoreError::Refused(Refusal::Expired(id.to_string())));
            }
            entry.checks.take().ok_or_else(|| StoreError::Refused(Refusal::AlreadySettled(id.to_string())))?
        };
        // The reservation's estimate: a check that only reports may have reserved 0.
        let estimate = checks.iter().map(|h| h.estimate).max().unwrap_or(0);
        self.correct(&checks, actual, now)?;
        Ok(Settled { estimate, actual })
    }

    /// Charges (at `now`) each check's actual above its estimate, refunds what is below.
    fn correct(&self, checks: &[Held], actual: u64, now: u64) -> Result<(), StoreError> {
        let refunds: Vec<Refund<'_>> =
            checks.iter().filter(|h| h.estimate > actual).map(|h| h.refund(h.estimate - actual)).collect();
        self.refund_sync(&refunds);
        let charges: Vec<(Charge<'_>, u64)> = checks
            .iter()
            .filter(|h| actual > h.estimate)
            .map(|h| (Charge::new(h.check(actual - h.estimate), 0), now))
            .collect();
        if !charges.is_empty() {
            self.check_many(&[], &charges, false)?;
        }
        Ok(())
    }

    /// Reservations kept now (open, or settled and not past their deadline).
    #[must_use]
    pub fn reservations(&self) -> usize {
        self.reservations.len()
    }
}
