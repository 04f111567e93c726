//! Instants as the script keeps them: decimal ns since the epoch in Redis, ns relative to the
//! call's now in arithmetic (clamped to ±104 days, as `prelude.lua`'s `rel` and `abs`).

const BILLION: i128 = 1_000_000_000;
/// Seconds from now beyond which an instant counts as "long ago" or "far ahead" (`FAR_SEC`).
const FAR_SEC: i128 = 9_000_000;
pub(crate) const FAR: i128 = FAR_SEC * BILLION;

/// The call's now: seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Seconds.
    pub sec: i128,
    /// Nanoseconds within the second.
    pub nsec: i128,
}

/// Why a stored value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadState(pub &'static str);

impl Now {
    /// A stored instant as ns relative to now, clamped to ±`FAR`.
    pub(crate) fn relative(self, text: &[u8]) -> Result<i128, BadState> {
        number(text).ok_or(BadState("a malformed instant"))?;
        let split = text.len().saturating_sub(9);
        let (sec, nsec) = (number(&text[..split]).unwrap_or(0), number(&text[split..]).unwrap_or(0));
        let ds = sec - self.sec;
        if ds < -FAR_SEC {
            return Ok(-FAR);
        }
        if ds > FAR_SEC {
            return Ok(FAR);
        }
        Ok(ds * BILLION + (nsec - self.nsec))
    }

    /// ns relative to now as a stored instant.
    pub(crate) fn absolute(self, relative: i128) -> String {
        let total = self.nsec + relative;
        format!("{}{:09}", self.sec + total.div_euclid(BILLION), total.rem_euclid(BILLION))
    }

    /// The start of the epoch-aligned window of length `period` holding the instant `at`
    /// (relative), relative (`prelude.lua`'s `win`).
    pub(crate) fn window(self, at: i128, period: i128) -> i128 {
        at - (self.sec * BILLION + self.nsec + at).rem_euclid(period.max(1))
    }
}

/// A counter, instant or argument: decimal digits only, at most 38 of them (beyond, `None`: no
/// value tollgate writes or sends is that long, and i128 holds every 38-digit number).
pub(crate) fn number(text: &[u8]) -> Option<i128> {
    if text.is_empty() || text.len() > 38 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(text.iter().fold(0_i128, |n, d| n.saturating_mul(10).saturating_add(i128::from(d - b'0'))))
}

/// ⌈a / b⌉ for b > 0.
pub(crate) fn ceil_div(a: i128, b: i128) -> i128 {
    -(-a).div_euclid(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Now = Now { sec: 1_700_000_000, nsec: 250_000_000 };

    #[test]
    fn instants_round_trip_and_far_ones_clamp() {
        for r in [0, 1, -1, 749_999_999, -250_000_001, 5 * BILLION + 7] {
            assert_eq!(NOW.relative(NOW.absolute(r).as_bytes()), Ok(r));
        }
        assert_eq!(NOW.relative(b"1"), Ok(-FAR));
        assert_eq!(NOW.relative(b"99999999999999999999999"), Ok(FAR));
        assert!(NOW.relative(b"12x").is_err() && NOW.relative(b"").is_err());
    }

    #[test]
    fn windows_are_aligned_to_the_epoch() {
        // Now is 250 ms into its second: its 1 s window started 250 ms ago.
        assert_eq!(NOW.window(0, BILLION), -250_000_000);
        assert_eq!(NOW.window(800_000_000, BILLION), 750_000_000);
        assert_eq!((ceil_div(1, 1_000_000), ceil_div(-1, 1_000_000), ceil_div(2_000_000, 1_000_000)), (1, 0, 2));
    }
}
