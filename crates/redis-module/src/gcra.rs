//! GCRA, decided as the script's `gcra.lua` decides it, on the same stored state (the theoretical
//! arrival time as decimal ns since the epoch) and with the same reply, so that the module and
//! the script may serve the same keys in turn. Pure: the caller reads and writes the key.
//!
//! The script computes around "now" with doubles kept exact; here the same steps run on `i128`,
//! which hold every value exactly.

const BILLION: i128 = 1_000_000_000;
/// Seconds from now beyond which an instant counts as "long ago" or "far ahead" (the script's
/// `FAR_SEC`: 104 days).
const FAR_SEC: i128 = 9_000_000;
const FAR: i128 = FAR_SEC * BILLION;

/// The call's now: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Seconds.
    pub sec: i128,
    /// Nanoseconds within the second.
    pub nsec: i128,
}

/// A GCRA limit as the call carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// The burst (the limit reported).
    pub burst: i128,
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
    /// The state to write and its TTL in ms, when the call consumed.
    pub write: Option<(String, i64)>,
}

/// Why a stored value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadState;

/// A stored instant (decimal ns since the epoch) as ns relative to `now`, clamped to ±`FAR`.
fn relative(text: &[u8], now: Now) -> Result<i128, BadState> {
    if text.is_empty() || !text.iter().all(u8::is_ascii_digit) {
        return Err(BadState);
    }
    let split = text.len().saturating_sub(9);
    let digits =
        |part: &[u8]| part.iter().fold(0_i128, |n, d| n.saturating_mul(10).saturating_add(i128::from(d - b'0')));
    let (sec, nsec) = (digits(&text[..split]), digits(&text[split..]));
    let ds = sec - now.sec;
    if ds < -FAR_SEC {
        return Ok(-FAR);
    }
    if ds > FAR_SEC {
        return Ok(FAR);
    }
    Ok(ds * BILLION + (nsec - now.nsec))
}

/// ns relative to `now` as a stored instant.
fn absolute(relative: i128, now: Now) -> String {
    let total = now.nsec + relative;
    let (ds, nsec) = (total.div_euclid(BILLION), total.rem_euclid(BILLION));
    format!("{}{:09}", now.sec + ds, nsec)
}

fn clamp(value: i128) -> i64 {
    i64::try_from(value.max(0)).unwrap_or(i64::MAX)
}

/// Decides one check of `params` at `now` on the key's stored value (`None`: no history).
pub fn decide(stored: Option<&[u8]>, params: Params, now: Now) -> Result<Outcome, BadState> {
    let Params { burst, emission, tolerance, cost, margin_ms } = params;
    let stored = stored.map(|text| relative(text, now)).transpose()?;
    let tat = stored.unwrap_or(0).max(0);
    let new = tat + cost * emission;
    let allowed = new <= tolerance;
    let ahead = if allowed { new } else { tat };
    let remaining = (tolerance - ahead).max(0).div_euclid(emission.max(1));
    let retry = if allowed { 0 } else { new - tolerance };
    let consumed = allowed && cost > 0;
    let after = if consumed { Some(new) } else { stored };
    let used = after.unwrap_or(0).max(0);
    let write = consumed.then(|| {
        // Until the state is idle again, at least 1 ms, plus the margin (the script's `px`).
        let ms = ((new + 999_999).div_euclid(1_000_000)).max(1) + margin_ms;
        (absolute(new, now), clamp(ms))
    });
    let reply = [
        i64::from(allowed),
        clamp(burst),
        clamp(remaining),
        clamp(retry),
        clamp(ahead),
        clamp(used),
        0,
        clamp(now.sec),
        clamp(now.nsec),
    ];
    Ok(Outcome { reply, write })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Now = Now { sec: 1_700_000_000, nsec: 250_000_000 };
    const LIMIT: Params = Params { burst: 2, emission: 500_000_000, tolerance: 1_000_000_000, cost: 1, margin_ms: 0 };

    #[test]
    fn a_fresh_key_admits_its_burst_then_denies_with_the_retry() {
        let first = decide(None, LIMIT, NOW).unwrap();
        assert_eq!(first.reply, [1, 2, 1, 0, 500_000_000, 500_000_000, 0, 1_700_000_000, 250_000_000]);
        let (tat, ttl) = first.write.unwrap();
        assert_eq!((tat.as_str(), ttl), ("1700000000750000000", 500));
        let second = decide(Some(tat.as_bytes()), LIMIT, NOW).unwrap();
        let (tat, _) = second.write.unwrap();
        assert_eq!(second.reply[..5], [1, 2, 0, 0, 1_000_000_000]);
        let third = decide(Some(tat.as_bytes()), LIMIT, NOW).unwrap();
        assert_eq!(third.reply[..6], [0, 2, 0, 500_000_000, 1_000_000_000, 1_000_000_000]);
        assert_eq!(third.write, None);
    }

    #[test]
    fn instants_round_trip_and_far_ones_clamp() {
        for r in [0, 1, -1, 749_999_999, -250_000_001, 5 * BILLION + 7] {
            assert_eq!(relative(absolute(r, NOW).as_bytes(), NOW), Ok(r));
        }
        assert_eq!(relative(b"1", NOW), Ok(-FAR));
        assert_eq!(relative(b"99999999999999999999999", NOW), Ok(FAR));
        assert_eq!(relative(b"12x", NOW), Err(BadState));
        assert_eq!(relative(b"", NOW), Err(BadState));
    }

    #[test]
    fn a_peek_writes_nothing() {
        let peek = decide(None, Params { cost: 0, ..LIMIT }, NOW).unwrap();
        assert_eq!(peek.reply[..6], [1, 2, 2, 0, 0, 0]);
        assert_eq!(peek.write, None);
    }
}
