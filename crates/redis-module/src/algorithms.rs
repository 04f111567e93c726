//! The algorithms the module decides, each as its Lua file in `tollgate-store` decides it (the
//! same steps, on `i128`, which hold every value the script's doubles hold exactly), on the same
//! stored state and with the same reply, so that the module and the script may serve the same
//! keys in turn. Pure: the caller reads and writes the key. The sliding log, a Redis list, has
//! its own file ([`crate::sliding_log`]).

use std::fmt::Write as _;

use crate::time::{BadState, FAR, Now, ceil_div, number};

/// An algorithm the module decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `gcra.lua`.
    Gcra,
    /// `token_bucket.lua`.
    TokenBucket,
    /// `leaky_bucket.lua`.
    LeakyBucket,
    /// `fixed_window.lua`.
    FixedWindow,
    /// `sliding_window.lua`.
    SlidingWindow,
    /// `sub_window.lua`.
    SubWindow,
}

/// Whether the module decides the algorithm of this name: every one the script has, the sliding
/// log in [`crate::sliding_log`].
#[must_use]
pub fn decided_natively(name: &[u8]) -> bool {
    Algorithm::from_name(name).is_some() || name == b"sliding-log"
}

impl Algorithm {
    /// By the name the call carries; `None` for the sliding log (see [`crate::sliding_log`]).
    #[must_use]
    pub fn from_name(name: &[u8]) -> Option<Self> {
        Some(match name {
            b"gcra" => Algorithm::Gcra,
            b"token-bucket" => Algorithm::TokenBucket,
            b"leaky-bucket" => Algorithm::LeakyBucket,
            b"fixed-window" => Algorithm::FixedWindow,
            b"sliding-window" => Algorithm::SlidingWindow,
            b"sub-window" => Algorithm::SubWindow,
            _ => return None,
        })
    }
}

/// A limit as the call carries it (the layout's `LIMIT_*`), and the TTL margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The count per period.
    pub count: i128,
    /// The period, ns.
    pub period: i128,
    /// The burst.
    pub burst: i128,
    /// The slices of a sub-window counter.
    pub slices: i128,
    /// The emission interval, ns.
    pub emission: i128,
    /// The tolerance, ns.
    pub tolerance: i128,
    /// The cost.
    pub cost: i128,
    /// The TTL margin, ms.
    pub margin_ms: i128,
}

/// What a call answers and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The reply: allowed (1/0), limit, remaining, retry_after_ns, reset_after_ns, used,
    /// previous, now's seconds and nanoseconds.
    pub reply: [i64; 9],
    /// The value to write and its TTL in ms, when the call consumed.
    pub write: Option<(String, i64)>,
}

/// A decision (`prelude.lua`'s `decision`: negative remaining and reset read 0).
pub(crate) struct Decision {
    pub(crate) allowed: bool,
    pub(crate) limit: i128,
    pub(crate) remaining: i128,
    pub(crate) retry: i128,
    pub(crate) reset: i128,
}

fn clamp(value: i128) -> i64 {
    i64::try_from(value.max(0)).unwrap_or(i64::MAX)
}

/// The stored value's fields (separated by what Lua's `%s` matches), exactly `n` of them.
pub(crate) fn fields(value: &[u8], n: usize) -> Result<Vec<&[u8]>, BadState> {
    let space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0B;
    let fields: Vec<&[u8]> = value.split(space).filter(|f| !f.is_empty()).collect();
    if fields.len() == n { Ok(fields) } else { Err(BadState("a value of another number of fields")) }
}

/// A stored counter: at most 2^63 (tollgate never counts more), so that sums and products fit.
pub(crate) fn counter(text: &[u8]) -> Result<i128, BadState> {
    number(text).filter(|n| *n <= 1 << 63).ok_or(BadState("a malformed counter"))
}

/// Decides one check of `params` at `now` on the key's stored value (`None`: no history).
pub fn decide(algorithm: Algorithm, stored: Option<&[u8]>, p: Params, now: Now) -> Result<Outcome, BadState> {
    let (d, write, (used, previous)) = match algorithm {
        Algorithm::Gcra => gcra(stored, &p, now)?,
        Algorithm::TokenBucket => token_bucket(stored, &p, now)?,
        Algorithm::LeakyBucket => leaky_bucket(stored, &p, now)?,
        Algorithm::FixedWindow => fixed_window(stored, &p, now)?,
        Algorithm::SlidingWindow => sliding_window(stored, &p, now)?,
        Algorithm::SubWindow => sub_window(stored, &p, now)?,
    };
    let reply = reply(&d, used, previous, now);
    let write = write.map(|(value, idle)| (value, ttl_ms(idle, p.margin_ms)));
    Ok(Outcome { reply, write })
}

/// The reply to a decision, with the key's snapshot and the call's now.
pub(crate) fn reply(d: &Decision, used: i128, previous: i128, now: Now) -> [i64; 9] {
    [
        i64::from(d.allowed),
        clamp(d.limit),
        clamp(d.remaining),
        clamp(d.retry),
        clamp(d.reset),
        clamp(used),
        clamp(previous),
        clamp(now.sec),
        clamp(now.nsec),
    ]
}

/// How long a key lives: until its state is idle again, at least 1 ms, plus the margin
/// (`prelude.lua`'s `px`).
pub(crate) fn ttl_ms(idle: i128, margin_ms: i128) -> i64 {
    clamp(ceil_div(idle, 1_000_000).max(1) + margin_ms)
}

/// A decision, the value to write and when it is idle (when it consumed), and the snapshot.
pub(crate) type Decided = (Decision, Option<(String, i128)>, (i128, i128));

fn gcra(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    let stored = stored.map(|v| now.relative(v)).transpose()?;
    let tat = stored.unwrap_or(0).max(0);
    let new = tat + p.cost * p.emission;
    let allowed = new <= p.tolerance;
    let ahead = if allowed { new } else { tat };
    let d = Decision {
        allowed,
        limit: p.burst,
        remaining: (p.tolerance - ahead).max(0).div_euclid(p.emission.max(1)),
        retry: if allowed { 0 } else { new - p.tolerance },
        reset: ahead,
    };
    let consumed = allowed && p.cost > 0;
    let after = if consumed { Some(new) } else { stored };
    let write = consumed.then(|| (now.absolute(new), new));
    Ok((d, write, (after.unwrap_or(0).max(0), 0)))
}

/// A bucket's stored "amount instant" (`None`: no history).
fn amount_at(stored: Option<&[u8]>, now: Now) -> Result<Option<(i128, i128)>, BadState> {
    let Some(value) = stored else { return Ok(None) };
    let f = fields(value, 2)?;
    Ok(Some((counter(f[0])?, now.relative(f[1])?)))
}

fn token_bucket(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    // (tokens, last): tokens at `last`, in ns of refill.
    let st = amount_at(stored, now)?;
    let (cap, need) = (p.tolerance, p.cost * p.emission);
    let available = st.map_or(cap, |(tokens, last)| (tokens - last).min(cap));
    let allowed = available >= need;
    let left = if allowed { available - need } else { available };
    let d = Decision {
        allowed,
        limit: p.burst,
        remaining: left.max(0).div_euclid(p.emission.max(1)),
        retry: if allowed { 0 } else { need - available },
        reset: cap - left,
    };
    let consumed = allowed && p.cost > 0;
    let after = if consumed { Some((left, 0)) } else { st };
    // The bucket is full again at GCRA's theoretical arrival time.
    let tat = after.map_or(-FAR, |(tokens, last)| last + (cap - tokens).max(0));
    let write = consumed.then(|| (format!("{left} {}", now.absolute(0)), cap - left));
    Ok((d, write, (tat.max(0), 0)))
}

fn leaky_bucket(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    // (level, last): water at `last`, in ns of drain.
    let st = amount_at(stored, now)?;
    let level_now = |st: Option<(i128, i128)>| st.map_or(0, |(level, last)| (last + level).max(0));
    let cap = p.tolerance;
    let level = level_now(st);
    let filled = level + p.cost * p.emission;
    let allowed = filled <= cap;
    let after = if allowed { filled } else { level };
    let d = Decision {
        allowed,
        limit: p.burst,
        remaining: (cap - after).max(0).div_euclid(p.emission.max(1)),
        retry: if allowed { 0 } else { filled - cap },
        reset: after,
    };
    let consumed = allowed && p.cost > 0;
    let state = if consumed { Some((filled, 0)) } else { st };
    let write = consumed.then(|| (format!("{filled} {}", now.absolute(0)), filled));
    Ok((d, write, (level_now(state), 0)))
}

fn fixed_window(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    // (start, used).
    let st = match stored {
        Some(v) => {
            let f = fields(v, 2)?;
            Some((now.relative(f[0])?, counter(f[1])?))
        }
        None => None,
    };
    // The window counting now: now's, or the stored one if later, which still counts.
    let rolled = |st: Option<(i128, i128)>| {
        let current = now.window(0, p.period);
        match st {
            Some((start, used)) if start >= current && used > 0 => (start, used),
            _ => (current, 0),
        }
    };
    let (start, used) = rolled(st);
    let finish = start + p.period;
    let wanted = used + p.cost;
    let allowed = wanted <= p.count;
    let after = if allowed { wanted } else { used };
    let d = Decision {
        allowed,
        limit: p.count,
        remaining: p.count - after,
        retry: if allowed { 0 } else { finish },
        reset: if after > 0 { finish } else { 0 },
    };
    let consumed = allowed && p.cost > 0;
    let state = if consumed { Some((start, wanted)) } else { st };
    let write = consumed.then(|| (format!("{} {wanted}", now.absolute(start)), finish));
    Ok((d, write, (rolled(state).1, 0)))
}

/// ⌊a·b / m⌋ (`prelude.lua`'s `muldiv`), for 0 ≤ a, b and m > 0.
fn muldiv(a: i128, b: i128, m: i128) -> i128 {
    (a * b).div_euclid(m.max(1))
}

fn sliding_window(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    // (start, prev, curr).
    let st = match stored {
        Some(v) => {
            let f = fields(v, 3)?;
            Some((now.relative(f[0])?, counter(f[1])?, counter(f[2])?))
        }
        None => None,
    };
    let period = p.period;
    // The counters as seen from the window holding now.
    let rolled = |st: Option<(i128, i128, i128)>| {
        let current = now.window(0, period);
        match st {
            None => (current, 0, 0),
            Some((start, prev, curr)) if start >= current => (start, prev, curr),
            Some((start, _, curr)) if start + period == current => (current, curr, 0),
            Some(_) => (current, 0, 0),
        }
    };
    let (start, prev, curr) = rolled(st);
    let finish = start + period;
    let elapsed = (-start).max(0);
    // prev*(P - e) + wanted*P <= count*P  <=>  prev + wanted - count <= floor(prev*e / P)
    let q = muldiv(prev, elapsed, period);
    let wanted = curr + p.cost;
    let allowed = prev + wanted - p.count <= q;
    let after = if allowed { wanted } else { curr };
    let retry = match allowed {
        true => 0,
        false if wanted <= p.count => finish - muldiv(p.count - wanted, period, prev).min(period),
        false => finish + period - muldiv(p.count - p.cost, period, curr).min(period),
    };
    let reset = if after > 0 {
        finish + period
    } else if prev > 0 {
        finish
    } else {
        0
    };
    let d = Decision { allowed, limit: p.count, remaining: p.count - prev + q - after, retry, reset };
    let consumed = allowed && p.cost > 0;
    let state = if consumed { Some((start, prev, wanted)) } else { st };
    let write = consumed.then(|| (format!("{} {prev} {wanted}", now.absolute(start)), start + 2 * period));
    let (_, previous, used) = rolled(state);
    Ok((d, write, (used, previous)))
}

/// A slot's index as a number of slices.
fn slot(index: usize) -> i128 {
    i128::try_from(index).unwrap_or(i128::MAX)
}

/// A sub-window counter's state: the newest slice's start, the slice length the counts were
/// taken in, and the counts, oldest first (`sub_window.lua`).
#[derive(Debug, Clone)]
struct Slices {
    newest: i128,
    slice: i128,
    counts: Vec<i128>,
}

fn sub_window(stored: Option<&[u8]>, p: &Params, now: Now) -> Result<Decided, BadState> {
    let st = match stored {
        Some(v) => {
            let space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0B;
            let f: Vec<&[u8]> = v.split(space).filter(|f| !f.is_empty()).collect();
            if f.len() < 3 {
                return Err(BadState("a value of too few fields"));
            }
            let counts = f[2..].iter().map(|c| counter(c)).collect::<Result<Vec<_>, _>>()?;
            Some(Slices { newest: now.relative(f[0])?, slice: counter(f[1])?, counts })
        }
        None => None,
    };
    let n = usize::try_from(p.slices.max(1)).map_err(|_| BadState("a limit of too many slices"))?;
    let length = p.period.div_euclid(p.slices.max(1));
    // A state taken under another slice count or length is folded into the slice holding its
    // newest one.
    let conform = |st: Slices| {
        if st.counts.len() == n && st.slice == length {
            return st;
        }
        let mut counts = vec![0; n];
        counts[n - 1] = st.counts.iter().sum();
        Slices { newest: now.window(st.newest, length), slice: length, counts }
    };
    // The state conformed, the slice counting now, and how many slices it is past the newest.
    let at_now = |st: Option<Slices>| {
        let current = now.window(0, length);
        match st.map(conform) {
            None => (None, current, p.slices),
            Some(st) => {
                let current = current.max(st.newest);
                let passed = (current - st.newest).div_euclid(length.max(1));
                (Some(st), current, passed)
            }
        }
    };
    // The slots still in the window: index i (0-based) is live iff i >= d.
    let live_from = |d: i128| usize::try_from(d.clamp(0, p.slices)).unwrap_or(n).min(n);
    let used_of = |st: &Option<Slices>, d: i128| st.as_ref().map_or(0, |s| s.counts[live_from(d)..].iter().sum());
    let (cur, current, d) = at_now(st);
    let used = used_of(&cur, d);
    let allowed = used + p.cost <= p.count;
    let mut retry = 0;
    if !allowed && let Some(cur) = &cur {
        // Slot i (1-based, live iff i > d) leaves the window at newest + i·slice.
        let (excess, mut freed) = (used + p.cost - p.count, 0);
        for i in live_from(d)..n {
            freed += cur.counts[i];
            if freed >= excess {
                retry = cur.newest + (slot(i) + 1) * cur.slice;
                break;
            }
        }
    }
    let after = if allowed { used + p.cost } else { used };
    let consumed = allowed && p.cost > 0;
    let (last, last_d) = if consumed {
        // The counts moved d slices on, to end at `current`, plus the cost in the newest.
        let mut counts = vec![0; n];
        for (i, count) in counts.iter_mut().enumerate() {
            let from = slot(i) + d;
            if let (Some(cur), Ok(from)) = (&cur, usize::try_from(from))
                && from < n
            {
                *count = cur.counts[from];
            }
        }
        counts[n - 1] += p.cost;
        (Some(Slices { newest: current, slice: length, counts }), 0)
    } else {
        (cur, d)
    };
    let mut reset = 0;
    if let Some(last) = &last {
        for i in (live_from(last_d)..n).rev() {
            if last.counts[i] > 0 {
                reset = last.newest + (slot(i) + 1) * last.slice;
                break;
            }
        }
    }
    let decision = Decision { allowed, limit: p.count, remaining: p.count - after, retry, reset };
    let write = match (&last, consumed) {
        (Some(last), true) => {
            let mut value = format!("{} {}", now.absolute(last.newest), last.slice);
            for count in &last.counts {
                let _ = write!(value, " {count}");
            }
            Some((value, reset))
        }
        _ => None,
    };
    // The snapshot: what is used now, of the state after the call.
    let used_after = match (&last, consumed) {
        (Some(last), true) => last.counts.iter().sum(),
        _ => used,
    };
    Ok((decision, write, (used_after, 0)))
}

/// 2 a second, a burst of 2: the unit tests' limit.
#[cfg(test)]
pub(crate) const TEST_LIMIT: Params = Params {
    count: 2,
    period: 1_000_000_000,
    burst: 2,
    slices: 1,
    emission: 500_000_000,
    tolerance: 1_000_000_000,
    cost: 1,
    margin_ms: 0,
};

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Now = Now { sec: 1_700_000_000, nsec: 250_000_000 };
    use super::TEST_LIMIT as LIMIT;

    #[test]
    fn gcra_admits_its_burst_then_denies_with_the_retry() {
        let first = decide(Algorithm::Gcra, None, LIMIT, NOW).unwrap();
        assert_eq!(first.reply, [1, 2, 1, 0, 500_000_000, 500_000_000, 0, 1_700_000_000, 250_000_000]);
        let (tat, ttl) = first.write.unwrap();
        assert_eq!((tat.as_str(), ttl), ("1700000000750000000", 500));
        let second = decide(Algorithm::Gcra, Some(tat.as_bytes()), LIMIT, NOW).unwrap();
        let (tat, _) = second.write.unwrap();
        let third = decide(Algorithm::Gcra, Some(tat.as_bytes()), LIMIT, NOW).unwrap();
        assert_eq!(third.reply[..6], [0, 2, 0, 500_000_000, 1_000_000_000, 1_000_000_000]);
        assert_eq!(third.write, None);
    }

    #[test]
    fn a_fixed_window_counts_in_the_window_holding_now() {
        let first = decide(Algorithm::FixedWindow, None, LIMIT, NOW).unwrap();
        // The window started 250 ms ago and ends in 750 ms.
        assert_eq!(first.reply[..6], [1, 2, 1, 0, 750_000_000, 1]);
        assert_eq!(first.write, Some(("1700000000000000000 1".into(), 750)));
    }

    #[test]
    fn huge_stored_counters_are_refused_not_summed() {
        let huge = format!("1700000000000000000 {} 99999999999999999999999999999999999999", i128::MAX);
        let limit = Params { slices: 2, ..LIMIT };
        assert!(decide(Algorithm::SubWindow, Some(huge.as_bytes()), limit, NOW).is_err());
        let huge = "1700000000000000000 99999999999999999999999999999999999999 1";
        assert!(decide(Algorithm::SlidingWindow, Some(huge.as_bytes()), LIMIT, NOW).is_err());
    }

    #[test]
    fn a_peek_writes_nothing_and_bad_values_are_refused() {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket, Algorithm::FixedWindow] {
            let peek = decide(algorithm, None, Params { cost: 0, ..LIMIT }, NOW).unwrap();
            assert_eq!((peek.reply[0], peek.reply[2], peek.write), (1, 2, None), "{algorithm:?}");
            assert!(decide(algorithm, Some(b"x y z"), LIMIT, NOW).is_err(), "{algorithm:?}");
        }
    }
}
