//! Seeded randomness for tests and simulations: a small deterministic generator and random
//! limits across the whole range `Limit` accepts.

use std::time::Duration;

use tollgate_core::{Algorithm, CalendarUnit, Limit, MAX_LOG_COUNT, MAX_PERIOD_NS, MAX_SLICES};

const SEC: u64 = 1_000_000_000;

/// A small deterministic generator (xorshift): the same seed, the same sequence.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::try_from(self.below(items.len() as u64)).expect("small")]
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A random valid limit of `algorithm`, anywhere in the accepted range: periods from a
/// microsecond to the 50-day maximum, counts and bursts from 1 to the largest the period allows,
/// slices up to 3,600.
pub fn random_limit(rng: &mut Rng, algorithm: Algorithm) -> Limit {
    loop {
        let unit =
            rng.pick(&[1_000, 7_777, 1_000_000, 333_333_333, 60 * SEC, 3_600 * SEC, 86_400 * SEC, 30 * 86_400 * SEC]);
        let period = (unit * (1 + rng.below(3))).min(MAX_PERIOD_NS);
        let period = if rng.below(10) == 0 { MAX_PERIOD_NS } else { period };
        let count = match rng.below(4) {
            0 => 1 + rng.below(12),
            1 => 1 + rng.below(1_000),
            2 => 1 + rng.below(if algorithm == Algorithm::SlidingLog { MAX_LOG_COUNT } else { 1_000_000_000 }),
            _ => 1 + rng.below(period),
        };
        let mut builder = Limit::builder(count, Duration::from_nanos(period)).algorithm(algorithm);
        if algorithm.is_bucket() {
            let t = period.div_ceil(count);
            let most = MAX_PERIOD_NS / t;
            builder = builder.burst(match rng.below(3) {
                0 => 1 + rng.below(15),
                1 => count,
                _ => 1 + rng.below(most.max(1)),
            });
        }
        if algorithm == Algorithm::SubWindow {
            let divisors: Vec<u64> =
                [1, 2, 3, 5, 7, 10, 60, 100, 1_000, MAX_SLICES].into_iter().filter(|s| period % s == 0).collect();
            builder = builder.slices(rng.pick(&divisors));
        }
        if let Ok(limit) = builder.build() {
            return limit;
        }
    }
}

/// Zones whose calendars differ: UTC, two with DST at 02:00 local, one with a half-hour DST shift,
/// one that skipped a day (Samoa, 30 December 2011).
pub const CALENDAR_ZONES: [&str; 5] =
    ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia"];

/// A random calendar limit of `algorithm` (the fixed window or the sliding window counter): a
/// day, week, month or year of one of [`CALENDAR_ZONES`], counts from 1 to a billion.
pub fn random_calendar_limit(rng: &mut Rng, algorithm: Algorithm) -> Limit {
    let unit = rng.pick(&CalendarUnit::ALL);
    let count = match rng.below(3) {
        0 => 1 + rng.below(12),
        1 => 1 + rng.below(1_000),
        _ => 1 + rng.below(1_000_000_000),
    };
    Limit::per_calendar(count, unit)
        .algorithm(algorithm)
        .tz(rng.pick(&CALENDAR_ZONES))
        .build()
        .expect("a calendar limit of the window family in a known zone")
}
