//! Reservations: an estimate charged now, all or nothing across a request's checks, settled later
//! with the actual amount, exactly once ([`Store::reserve_until`](crate::Store::reserve_until),
//! [`Store::settle`](crate::Store::settle)).
//!
//! - **Reserve.** The checks are decided as by [`Store::reserve`](crate::Store::reserve), each at
//!   its cost (the estimate). If every one admitted, the store writes a *record* of the
//!   reservation (each check's scope, key, limit, estimate, instant and decision) that lives until
//!   the deadline, and answers an id.
//! - **Settle.** The record is taken (in the same atomic step as the correction: on Redis, in the
//!   settle script, in the slot of the checks' states), and each check's difference applied: an
//!   actual above the estimate is *charged* at the settle's instant whatever the limit says (the
//!   key may go past its limit: the next requests pay); one below is *refunded* where the
//!   estimate was counted, if the state still holds it (see `RateState::refund`: never an
//!   over-grant). A settled record stays as a tombstone until the deadline, so that a second settle
//!   is told [`Refusal::AlreadySettled`]; one after the deadline is told [`Refusal::Expired`].
//! - **Expire.** A reservation never settled stays counted at its estimate: nothing is done.
//!
//! The id is `TOKEN.DEADLINE[.SLOT…]`: 128 random bits from the operating system (32 hex digits: a
//! client cannot guess another's), the deadline in ms since the epoch (on the store's clock), and
//! on Redis the hash slot of each group of checks whose keys share one (the record of a group lives
//! in its slot, beside the states it settles). An id whose parts were changed names no record.

use tollgate_core::{Algorithm, CalendarUnit, Decision, Limit};

use crate::{Check, Refund, StoreError};

/// The longest a reservation may stay open: one hour. A settle is expected within a response's
/// time; an hour bounds what the stores keep for the ones never settled.
pub const MAX_RESERVATION_NS: u64 = 3_600 * 1_000_000_000;

/// The largest actual amount a settle takes: `2^53 − 1` (the Redis script counts in doubles).
pub const MAX_ACTUAL: u64 = (1 << 53) - 1;

/// The longest id a store reads: a token, a deadline and up to 64 slots.
pub const MAX_ID_LEN: usize = 32 + 1 + 20 + 64 * 6;

/// An open reservation: its id, to settle it with, and its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The id to settle it with (see the module docs).
    pub id: String,
    /// When it expires as charged, in ns since the epoch on the store's clock; a settle from then
    /// on is refused.
    pub deadline_ns: u64,
}

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// What the reservation charged each check.
    pub estimate: u64,
    /// What the request turned out to cost: each check now counts it.
    pub actual: u64,
}

/// Why a settle was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The reservation was settled already (a settle is applied once).
    #[error("reservation {0} was settled already")]
    AlreadySettled(String),
    /// Its deadline passed: it expired as charged at its estimate.
    #[error("reservation {0} expired at its deadline: it stays charged at its estimate")]
    Expired(String),
    /// No open reservation has this id (never made, or forgotten after its deadline).
    #[error("no open reservation {0}")]
    Unknown(String),
    /// The id is not one a store makes.
    #[error("malformed reservation id: {0}")]
    Malformed(String),
    /// The store keeps this many open reservations already (its bound): this one was not made,
    /// nothing was charged.
    #[error("too many open reservations ({0}): settle them, or wait for their deadlines")]
    Full(usize),
    /// The actual amount is above [`MAX_ACTUAL`].
    #[error("an actual amount of {0} is above {MAX_ACTUAL}")]
    TooLarge(u64),
}

/// A reservation's id, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Id {
    pub(crate) token: [u8; 16],
    pub(crate) deadline_ms: u64,
    pub(crate) slots: Vec<u16>,
}

impl Id {
    /// A new id: a random token, `deadline_ms`, `slots`.
    pub(crate) fn new(deadline_ms: u64, slots: Vec<u16>) -> Result<Self, StoreError> {
        let mut token = [0u8; 16];
        getrandom::fill(&mut token)
            .map_err(|e| StoreError::Backend(format!("no randomness for a reservation id: {e}")))?;
        Ok(Id { token, deadline_ms, slots })
    }

    /// The token in hex.
    pub(crate) fn token_hex(&self) -> String {
        hex(&self.token)
    }

    /// Reads an id; a precise refusal if it is not one a store makes.
    pub(crate) fn parse(text: &str) -> Result<Self, StoreError> {
        let malformed = |why: &str| StoreError::Refused(Refusal::Malformed(why.to_string()));
        if text.len() > MAX_ID_LEN {
            return Err(malformed(&format!("longer than {MAX_ID_LEN} bytes")));
        }
        let mut parts = text.split('.');
        let token = parts.next().unwrap_or_default();
        let bytes =
            unhex(token.as_bytes()).filter(|b| b.len() == 16).ok_or_else(|| malformed("no 32-hex-digit token"))?;
        let mut token_bytes = [0u8; 16];
        token_bytes.copy_from_slice(&bytes);
        let deadline_ms =
            parts.next().and_then(|d| d.parse::<u64>().ok()).ok_or_else(|| malformed("no deadline after the token"))?;
        let slots = parts
            .map(|s| s.parse::<u16>().ok().filter(|&s| s < 16_384))
            .collect::<Option<Vec<u16>>>()
            .ok_or_else(|| malformed("a slot that is not a number below 16384"))?;
        if slots.iter().enumerate().any(|(i, slot)| slots[..i].contains(slot)) {
            return Err(malformed("a slot named twice"));
        }
        let id = Id { token: token_bytes, deadline_ms, slots };
        // One spelling per id (the one a store makes: lowercase hex, numbers without sign or
        // leading zeros), so that no other names the same reservation.
        if id.to_string() != text {
            return Err(malformed("not written as a store writes it (lowercase hex, plain numbers)"));
        }
        Ok(id)
    }

    /// The deadline in ns.
    pub(crate) fn deadline_ns(&self) -> u64 {
        self.deadline_ms.saturating_mul(1_000_000)
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.token_hex(), self.deadline_ms)?;
        for slot in &self.slots {
            write!(f, ".{slot}")?;
        }
        Ok(())
    }
}

/// The deadline in ms of a reservation made at `at` (ns) lasting `ttl_ns` (refused beyond
/// [`MAX_RESERVATION_NS`], or 0).
pub(crate) fn deadline_ms(at: u64, ttl_ns: u64) -> Result<u64, StoreError> {
    if ttl_ns == 0 || ttl_ns > MAX_RESERVATION_NS {
        return Err(StoreError::Unsupported(format!(
            "a reservation lasts from 1 ns to {} s, not {ttl_ns} ns",
            MAX_RESERVATION_NS / 1_000_000_000
        )));
    }
    Ok(at.saturating_add(ttl_ns).div_ceil(1_000_000))
}

/// Refuses an estimate below 1: an estimate of 0 is a peek, admitted whatever the state, so a
/// reservation of it would let its settle charge any actual past a limit that admitted nothing.
pub fn check_estimate(estimate: u64) -> Result<(), StoreError> {
    if estimate == 0 {
        return Err(StoreError::Unsupported(
            "a reservation's estimate is at least 1, not 0 (an estimate of 0 is admitted whatever the state, and its \
             settle would charge past a limit that admitted nothing)"
                .into(),
        ));
    }
    Ok(())
}

/// Refuses a reserve before its decision: a `ttl_ns` outside 1 ns to [`MAX_RESERVATION_NS`], an
/// estimate below 1 ([`check_estimate`]) but for a check that only reports
/// ([`Check::reporting`]).
pub(crate) fn validate(checks: &[Check<'_>], ttl_ns: u64) -> Result<(), StoreError> {
    deadline_ms(0, ttl_ns)?;
    checks.iter().filter(|c| !c.reporting).try_for_each(|c| check_estimate(c.cost))
}

/// One check of a reservation, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) scope: String,
    pub(crate) key: Vec<u8>,
    pub(crate) limit: Limit,
    pub(crate) estimate: u64,
    pub(crate) at: u64,
    pub(crate) decision: Decision,
}

impl Held {
    /// `check` reserved at `at` with `decision`.
    pub(crate) fn of(check: &Check<'_>, at: u64, decision: Decision) -> Self {
        Held {
            scope: check.scope.to_string(),
            key: check.key.to_vec(),
            limit: check.limit.clone(),
            estimate: check.cost,
            at,
            decision,
        }
    }

    /// The check at `cost`.
    pub(crate) fn check(&self, cost: u64) -> Check<'_> {
        Check::new(&self.key, &self.limit, cost).scoped(&self.scope)
    }

    /// The refund of `cost` of its estimate.
    pub(crate) fn refund(&self, cost: u64) -> Refund<'_> {
        Refund { check: self.check(cost), at: self.at, decision: self.decision }
    }
}

/// The record of one group of a reservation's checks (all of them but on a Redis Cluster):
/// `tollgate-reservation 2 DEADLINE_MS` (the deadline is the record's, so that a settle is
/// decided on it, never on the one an id says), then a line per check of space-separated fields (scope and key in
/// hex, the limit's algorithm, count, period, burst and slices, the estimate, the instant, and the
/// decision's limit, remaining, retry and reset). The period is its length in ns, or a calendar
/// period's unit and zone, `month:Europe/Berlin` (a zone name holds no space nor colon): the
/// settle corrects the key on the calendar's windows, not on the unit's longest length.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn encode(deadline_ms: u64, checks: &[Held]) -> String {
    let mut out = format!("tollgate-reservation 2 {deadline_ms}\n");
    for h in checks {
        let l = &h.limit;
        let d = &h.decision;
        out.push_str(&format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {}\n",
            hex(h.scope.as_bytes()),
            hex(&h.key),
            l.algorithm().as_str(),
            l.count(),
            l.calendar().map_or_else(|| l.period_ns().to_string(), |c| format!("{}:{}", c.unit(), c.zone())),
            l.burst(),
            l.slices(),
            h.estimate,
            h.at,
            d.limit,
            d.remaining,
            d.retry_after_ns,
            d.reset_after_ns,
        ));
    }
    out
}

/// Reads a record [`encode`] wrote: its deadline in ms and its checks; an error naming what is
/// wrong otherwise (a record is a server's reply: never trusted).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn decode(text: &[u8]) -> Result<(u64, Vec<Held>), StoreError> {
    let bad = |why: String| StoreError::BadState(format!("a reservation's record {why}"));
    let text = std::str::from_utf8(text).map_err(|_| bad("is not text".into()))?;
    let mut lines = text.lines();
    let deadline_ms = lines
        .next()
        .and_then(|header| header.strip_prefix("tollgate-reservation 2 "))
        .and_then(|deadline| deadline.parse::<u64>().ok())
        .ok_or_else(|| bad("has another header".into()))?;
    let mut out = Vec::new();
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        let [scope, key, alg, count, period, burst, slices, estimate, at, capacity, remaining, retry, reset] = f[..]
        else {
            return Err(bad(format!("has a line of {} fields", f.len())));
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad(format!("has {s:?} for a number")));
        let scope = unhex(scope.as_bytes()).and_then(|s| String::from_utf8(s).ok());
        let scope = scope.ok_or_else(|| bad("has a scope that is not hex of text".into()))?;
        let key = unhex(key.as_bytes()).ok_or_else(|| bad("has a key that is not hex".into()))?;
        let algorithm: Algorithm = alg.parse().map_err(|e| bad(format!("has {e}")))?;
        let mut builder = match period.split_once(':') {
            Some((unit, zone)) => {
                let unit: CalendarUnit = unit.parse().map_err(|e| bad(format!("has {e}")))?;
                Limit::per_calendar(num(count)?, unit).tz(zone)
            }
            None => Limit::builder(num(count)?, std::time::Duration::from_nanos(num(period)?)),
        }
        .algorithm(algorithm);
        if algorithm.is_bucket() {
            builder = builder.burst(num(burst)?);
        }
        if algorithm == Algorithm::SubWindow {
            builder = builder.slices(num(slices)?);
        }
        let limit = builder.build().map_err(|e| bad(format!("has a limit that does not build: {e}")))?;
        let decision = Decision {
            allowed: true,
            limit: num(capacity)?,
            remaining: num(remaining)?,
            retry_after_ns: num(retry)?,
            reset_after_ns: num(reset)?,
        };
        out.push(Held { scope, key, limit, estimate: num(estimate)?, at: num(at)?, decision });
    }
    if out.is_empty() {
        return Err(bad("holds no check".into()));
    }
    Ok((deadline_ms, out))
}

/// `bytes` in lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex digits back to bytes; `None` if they are not an even number of hex digits.
fn unhex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).and_then(|d| u8::try_from(d).ok());
    text.chunks(2).map(|p| Some(digit(p[0])? * 16 + digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A calendar limit reads back as itself, its unit and zone (before: as its longest length,
    /// `month` in a zone becoming `32d` from the epoch, so a settle on Redis corrected other windows).
    #[test]
    fn a_calendar_limit_reads_back_with_its_unit_and_zone() {
        for (text, zone, algorithm) in [
            ("12/month", "Australia/Lord_Howe", Algorithm::SlidingWindow),
            ("5/day", "Etc/GMT+5", Algorithm::FixedWindow),
            ("1000/year", "UTC", Algorithm::SlidingWindow),
        ] {
            let limit =
                text.parse::<tollgate_core::LimitBuilder>().unwrap().tz(zone).algorithm(algorithm).build().unwrap();
            let decision =
                Decision { allowed: true, limit: limit.count(), remaining: 1, retry_after_ns: 0, reset_after_ns: 9 };
            let held = vec![Held::of(&Check::new(b"k", &limit, 2), 1_700_000_000, decision)];
            let (deadline_ms, read) = decode(encode(1_700, &held).as_bytes()).unwrap();
            assert_eq!((deadline_ms, &read), (1_700, &held), "{limit}");
            assert_eq!(
                read[0].limit.calendar().map(|c| (c.unit(), c.zone())),
                limit.calendar().map(|c| (c.unit(), c.zone()))
            );
        }
    }

    #[test]
    fn ids_and_records_read_back_and_refuse_what_they_are_not() {
        let id = Id::new(1_700_000_000_123, vec![0, 16_383]).unwrap();
        let text = id.to_string();
        assert_eq!(Id::parse(&text).unwrap(), id);
        assert_ne!(Id::new(1, vec![]).unwrap().token, Id::new(1, vec![]).unwrap().token);
        for bad in ["", "zz", "0123.5", &format!("{}.x", id.token_hex()), &format!("{}.5.16384", id.token_hex())] {
            assert!(matches!(Id::parse(bad), Err(StoreError::Refused(Refusal::Malformed(_)))), "{bad:?}");
        }
        assert!(Id::parse(&"0".repeat(MAX_ID_LEN + 1)).is_err());
        let token = id.token_hex();
        for other in [
            format!("{}.1700000000123.0.16383", token.to_uppercase()),
            format!("{token}.+1700000000123.0.16383"),
            format!("{token}.01700000000123.0.16383"),
            format!("{token}.1700000000123.00.16383"),
            format!("{token}.1700000000123.0.16383.0"),
        ] {
            assert!(matches!(Id::parse(&other), Err(StoreError::Refused(Refusal::Malformed(_)))), "{other:?}");
        }

        let limit = Limit::per_second(10).burst(20).build().unwrap();
        let check = Check::new(b"k e\ny", &limit, 7).scoped("rule");
        let decision = Decision { allowed: true, limit: 20, remaining: 13, retry_after_ns: 0, reset_after_ns: 700 };
        let held = vec![Held::of(&check, 42, decision)];
        assert_eq!(decode(encode(1_700, &held).as_bytes()).unwrap(), (1_700, held));
        for bad in [
            "",
            "tollgate-reservation 2 5\n",
            "tollgate-reservation 2 5\nab cd gcra 1\n",
            "x\n",
            "tollgate-reservation 2 5\n  fixed-window 3 fortnight:UTC 3 1 1 1 3 2 0 5\n",
            "tollgate-reservation 2 5\n  fixed-window 3 month:Mars/Olympus 3 1 1 1 3 2 0 5\n",
            "tollgate-reservation 2 5\n  gcra 3 month:UTC 3 1 1 1 3 2 0 5\n",
        ] {
            assert!(matches!(decode(bad.as_bytes()), Err(StoreError::BadState(_))), "{bad:?}");
        }
    }
}
