//! Reservations on Redis (see [`crate::reservation`]).
//!
//! - **Reserve**: the checks are decided as [`Store::reserve`] decides them (slot by slot on a
//!   cluster, all or nothing); if every one admitted, each group of checks sharing a slot gets a
//!   record, `PREFIX:rsv:{TAG}:TOKEN` with `TAG` a short tag of that slot, written with `SET … PX`
//!   for the reservation's life (and the TTL margin of a caller-side clock). A reserve whose
//!   record cannot be written refunds its estimate (best effort, at the decision's instant)
//!   before it answers the error: no reservation, nothing left charged.
//! - **Settle**: per slot the id names, the record is read (a plain `GET`, to learn its checks),
//!   then the settle script (`lua/settle.lua`) runs in that slot: it applies the corrections only
//!   if the record still holds what was read, and leaves a tombstone, in one atomic call. So a
//!   settle applies once whichever node sends it, and however often: one that failed (its call
//!   may have run) is never sent again by the store, and a caller sending it again is told
//!   [`Refusal::AlreadySettled`] if it ran. A reservation whose checks span several slots is
//!   settled slot by slot, every slot's record read and checked first: a slot with no record (an
//!   added slot, a record lost to a failover) refuses the settle before any slot is applied. Off
//!   a cluster an id names exactly slot 0. A settle sent again after one that failed part way
//!   settles the slots that one had not reached (with the actual it is given: send the same), and
//!   is told [`Refusal::AlreadySettled`] only when every slot was.
//!
//! The record lives in Redis, not in a tollgate process: a node that dies between the two calls
//! leaves it to expire as charged, or to be settled by another node.

use std::sync::OnceLock;

use super::{Guarded, RedisStore, keys, reply::script_error};
use crate::remote::Charge;
use crate::reservation::{self, Held, Id, Refusal, Reservation, Settled};
use crate::{Check, Refund, Reserved, Store, StoreError, all_allowed};

/// The record a settle call is guarded by: its key, what it held when read, and the deadline.
pub(super) struct Guard<'a> {
    pub(super) record: &'a [u8],
    pub(super) content: String,
    pub(super) deadline_ms: u64,
}

/// A short hash tag for each of the 16,384 cluster slots (the first decimal number that hashes
/// there), so that a record lands in the slot of the states it settles.
fn slot_tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); 16_384];
        let mut left = tags.len();
        let mut n: u64 = 0;
        while left > 0 {
            let tag = n.to_string();
            let slot = usize::from(keys::slot(format!("{{{tag}}}").as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
}

impl RedisStore {
    /// The key of a reservation's record in `slot`.
    fn record_key(&self, slot: u16, id: &Id) -> Vec<u8> {
        let tag = &slot_tags()[usize::from(slot)];
        format!("{}:rsv:{{{tag}}}:{}", self.options.prefix, id.token_hex()).into_bytes()
    }

    /// The slot of `check`'s state (every check's is 0 off a cluster: one record).
    fn slot_of(&self, check: &Check<'_>) -> Result<u16, StoreError> {
        if !self.is_cluster() {
            return Ok(0);
        }
        Ok(keys::slot(&self.state_key(check.scope, check.key, check.limit)?))
    }

    /// Runs `cmd` on the server of `key`, within the store's timeout.
    async fn run_plain(&self, key: &[u8], cmd: &redis::Cmd) -> Result<redis::Value, StoreError> {
        tokio::time::timeout(self.options.timeout, self.connection.run(key, cmd, None))
            .await
            .map_err(|_| StoreError::Timeout(self.options.timeout))?
            .map_err(|failure| script_error(&failure, &[key.to_vec()]))
    }

    /// [`Store::reserve_until`] (see the module docs).
    pub(super) async fn reserve_recorded(
        &self,
        checks: &[Check<'_>],
        ttl_ns: u64,
    ) -> Result<(Reserved, Option<Reservation>), StoreError> {
        reservation::validate(checks, ttl_ns)?;
        let reserved = self.reserve(checks).await?;
        if !all_allowed(&reserved.decisions) {
            return Ok((reserved, None));
        }
        let deadline_ms = reservation::deadline_ms(reserved.at, ttl_ns)?;
        let mut groups: Vec<(u16, Vec<Held>)> = Vec::new();
        for (i, check) in checks.iter().enumerate() {
            let slot = self.slot_of(check)?;
            let held = Held::of(check, reserved.instant(i), reserved.decisions[i]);
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(held),
                None => groups.push((slot, vec![held])),
            }
        }
        let id = Id::new(deadline_ms, groups.iter().map(|(slot, _)| *slot).collect())?;
        // The record outlives the deadline by a second (and a caller-side clock's margin), so that
        // a late settle is told it expired rather than that the id is unknown.
        let margin_ms = match self.options.time {
            super::TimeSource::Server => 0,
            super::TimeSource::Clock(_) => u64::try_from(self.options.clock_skew_margin.as_millis()).unwrap_or(0),
        };
        let life_ms = deadline_ms.saturating_sub(reserved.at / 1_000_000) + 1_000 + margin_ms;
        for (slot, group) in &groups {
            let key = self.record_key(*slot, &id);
            let mut set = redis::cmd("SET");
            set.arg(key.as_slice()).arg(reservation::encode(deadline_ms, group)).arg("PX").arg(life_ms);
            if let Err(error) = self.run_plain(&key, &set).await {
                // No reservation is answered: its estimate is taken back where it was counted
                // (best effort: a refund that fails too leaves it charged, freeing up as the state
                // does). The records written in other slots name an id nobody holds; they expire.
                let refunds: Vec<Refund<'_>> = checks
                    .iter()
                    .enumerate()
                    .map(|(i, check)| Refund {
                        check: *check,
                        at: reserved.instant(i),
                        decision: reserved.decisions[i],
                    })
                    .collect();
                if let Err(refund_error) = self.refund(&refunds).await {
                    tracing::warn!(%error, %refund_error, "a reservation's record was not written, nor its estimate refunded");
                }
                return Err(error);
            }
        }
        let reservation = Reservation { id: id.to_string(), deadline_ns: id.deadline_ns() };
        Ok((reserved, Some(reservation)))
    }

    /// [`Store::settle`] (see the module docs).
    pub(super) async fn settle_recorded(&self, text: &str, actual: u64) -> Result<Settled, StoreError> {
        let id = Id::parse(text)?;
        if actual > reservation::MAX_ACTUAL {
            return Err(StoreError::Refused(Refusal::TooLarge(actual)));
        }
        let refused = |code: i64| {
            StoreError::Refused(match code {
                -2 => Refusal::AlreadySettled(text.to_string()),
                -3 => Refusal::Expired(text.to_string()),
                _ if self.now_ms_hint() >= id.deadline_ms => Refusal::Expired(text.to_string()),
                _ => Refusal::Unknown(text.to_string()),
            })
        };
        // Off a cluster every record is in slot 0: an id naming any other slot is not one this
        // store made.
        if id.slots.is_empty() || (!self.is_cluster() && id.slots != [0]) {
            return Err(refused(-1));
        }
        // Every slot's record is read and checked before any is applied, so that a settle refused
        // for one slot (no record there) changes nothing in the others.
        let mut records: Vec<(Vec<u8>, String, Vec<Held>)> = Vec::with_capacity(id.slots.len());
        // Slots found settled already: a settle sent again after one that failed part way (a
        // later slot's server) goes on with the slots it had not reached.
        let mut already = 0;
        for &slot in &id.slots {
            let key = self.record_key(slot, &id);
            let read = self.run_plain(&key, redis::cmd("GET").arg(key.as_slice())).await?;
            let content: Option<Vec<u8>> = redis::from_redis_value(read)
                .map_err(|e| StoreError::Backend(format!("GET of a reservation answered something else: {e}")))?;
            let content = match content {
                None => return Err(refused(-1)),
                Some(c) if c == b"settled" => {
                    already += 1;
                    continue;
                }
                Some(c) => c,
            };
            let (recorded_deadline_ms, held) = reservation::decode(&content)?;
            // An id whose deadline part was changed names no reservation (the script decides on
            // the record's deadline too).
            if recorded_deadline_ms != id.deadline_ms {
                return Err(refused(-1));
            }
            let content = String::from_utf8(content).map_err(|_| StoreError::BadState("a record not text".into()))?;
            records.push((key, content, held));
        }
        let mut estimate = None;
        for (key, content, held) in records {
            // The reservation's estimate: a check that only reports may have reserved 0.
            let most = held.iter().map(|h| h.estimate).max().unwrap_or(0);
            estimate = Some(estimate.map_or(most, |e: u64| e.max(most)));
            let refunds: Vec<Refund<'_>> =
                held.iter().filter(|h| h.estimate > actual).map(|h| h.refund(h.estimate - actual)).collect();
            let charges: Vec<Charge<'_>> = held
                .iter()
                .filter(|h| actual > h.estimate)
                .map(|h| Charge::new(h.check(actual - h.estimate), 0))
                .collect();
            let guard = Guard { record: &key, content, deadline_ms: id.deadline_ms };
            match self.invoke_guarded(&[], &charges, &refunds, None, Some(&guard)).await? {
                Guarded::Refused(-2) => already += 1,
                Guarded::Refused(code) => return Err(refused(code)),
                Guarded::Ran(..) => {}
            }
        }
        match estimate {
            Some(estimate) if already < id.slots.len() => Ok(Settled { estimate, actual }),
            _ => Err(StoreError::Refused(Refusal::AlreadySettled(text.to_string()))),
        }
    }

    /// Now in ms for telling an expired id from an unknown one when its record is gone: the
    /// caller-side clock's, or this host's (the server's own clock decides every settle that finds
    /// a record).
    fn now_ms_hint(&self) -> u64 {
        let ns = match &self.options.time {
            super::TimeSource::Clock(clock) => clock.now_ns(),
            super::TimeSource::Server => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        };
        ns / 1_000_000
    }
}
