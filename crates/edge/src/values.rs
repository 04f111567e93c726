//! The values a decision is told in, for every front end: the HTTP header fields (`Retry-After`,
//! the IETF httpapi draft's `RateLimit-Policy` / `RateLimit`, the legacy `X-RateLimit-*`),
//! Envoy's RLS fields (`duration_until_reset`, the `RateLimit-*` headers it asks Envoy to add),
//! redis-cell's `CL.THROTTLE` reply and tollgate's `TG.*` replies. Every front end rounds alike:
//! durations in whole seconds are rounded up (a client that waits what it is told is never early),
//! and a denial never says "retry in 0 s".

use tollgate_core::{CalendarUnit, Decision, Limit};

const NS_PER_SEC: u64 = 1_000_000_000;
const NS_PER_MS: u64 = 1_000_000;

/// `ns` in whole seconds, rounded up.
#[must_use]
pub fn seconds_up(ns: u64) -> u64 {
    ns.div_ceil(NS_PER_SEC)
}

/// `Retry-After` of a denial: whole seconds, rounded up, at least 1.
#[must_use]
pub fn retry_after_seconds(decision: &Decision) -> u64 {
    seconds_up(decision.retry_after_ns).max(1)
}

/// `RateLimit-Policy: "name";q=Q;w=W[;burst=B]` (see [`policy_parameters`]).
#[must_use]
pub fn policy_field(policy: &str, limit: &Limit) -> String {
    format!("\"{}\";{}", field_name(policy), policy_parameters(limit))
}

/// `RateLimit: "name";r=REMAINING;t=RESET_SECONDS`.
#[must_use]
pub fn ratelimit_field(policy: &str, decision: &Decision) -> String {
    format!("\"{}\";r={};t={}", field_name(policy), decision.remaining, seconds_up(decision.reset_after_ns))
}

/// The legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` (seconds) fields, lower case.
#[must_use]
pub fn legacy_fields(decision: &Decision) -> [(&'static str, u64); 3] {
    [
        ("x-ratelimit-limit", decision.limit),
        ("x-ratelimit-remaining", decision.remaining),
        ("x-ratelimit-reset", seconds_up(decision.reset_after_ns)),
    ]
}

/// A policy name as a structured-field string: without the quotes, backslashes and control
/// characters it could not hold.
fn field_name(policy: &str) -> String {
    policy.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect()
}

/// The policy's parameters: `q` requests per window of `w` whole seconds, the configured rate for
/// every algorithm, and for the bucket family `burst` (requests admitted at once from idle; the
/// draft lets a policy carry parameters of its own). A period that is not a whole number of
/// seconds is stated over the shortest whole-second window holding a whole number of periods
/// (`10/500ms` is `q=20;w=1`, `7/300ms` is `q=70;w=3`); when that window would exceed an hour,
/// over the period rounded up to a second, with `q` rounded down: never a promise of more than
/// the limit admits. A calendar period (whose windows differ in length: a month of 28 to 31 days)
/// is stated over its nominal length, a day of 86,400 s, a week of 7 days, a month of 30, a year
/// of 365 (the reset fields give the actual boundary).
#[must_use]
pub fn policy_parameters(limit: &Limit) -> String {
    const SECOND: u128 = NS_PER_SEC as u128;
    let period_ns = match limit.calendar().map(tollgate_core::Calendar::unit) {
        Some(CalendarUnit::Day) => 86_400 * NS_PER_SEC,
        Some(CalendarUnit::Week) => 7 * 86_400 * NS_PER_SEC,
        Some(CalendarUnit::Month) => 30 * 86_400 * NS_PER_SEC,
        Some(CalendarUnit::Year) => 365 * 86_400 * NS_PER_SEC,
        None => limit.period_ns(),
    };
    let (count, period) = (u128::from(limit.count()), u128::from(period_ns));
    let whole = period / gcd(period, SECOND) * SECOND; // lcm(period, 1 s)
    let (quota, window) = if whole / SECOND <= 3_600 {
        (count * (whole / period), whole / SECOND)
    } else {
        let window = period.div_ceil(SECOND);
        (count * window * SECOND / period, window)
    };
    let mut text = format!("q={quota};w={window}");
    if limit.algorithm().is_bucket() {
        text.push_str(&format!(";burst={}", limit.burst()));
    }
    text
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Envoy's `duration_until_reset`: whole seconds and the nanoseconds left over.
#[must_use]
pub fn rls_duration(ns: u64) -> (i64, i32) {
    (i64::try_from(ns / NS_PER_SEC).unwrap_or(i64::MAX), i32::try_from(ns % NS_PER_SEC).unwrap_or(0))
}

/// The `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (seconds, rounded up)
/// headers tollgate asks Envoy to add (the httpapi draft's first names, as envoyproxy/ratelimit
/// writes them).
#[must_use]
pub fn envoy_headers(requests_per_unit: u32, remaining: u32, reset_ns: u64) -> [(&'static str, String); 3] {
    [
        ("RateLimit-Limit", requests_per_unit.to_string()),
        ("RateLimit-Remaining", remaining.to_string()),
        ("RateLimit-Reset", seconds_up(reset_ns).to_string()),
    ]
}

/// redis-cell's `CL.THROTTLE` reply to a request of `quantity` decided as `decision` under a limit
/// of `capacity`: `[limited, limit, remaining, retry_after, reset_after]`, in seconds rounded up.
/// `retry_after` is -1 when allowed, and for a quantity above the capacity, which can never pass:
/// that one is limited whatever `decision` says (what is asked of the store for it is a peek, see
/// [`throttle_cost`]), with the key's state as the peek read it.
#[must_use]
pub fn throttle_reply(decision: &Decision, capacity: u64, quantity: u64) -> [i64; 5] {
    let whole = |ns: u64| i64::try_from(seconds_up(ns)).unwrap_or(i64::MAX);
    let saturating = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let never = quantity > capacity;
    let retry = if decision.allowed || never { -1 } else { whole(decision.retry_after_ns) };
    [
        i64::from(!decision.allowed || never),
        saturating(capacity),
        saturating(decision.remaining),
        retry,
        whole(decision.reset_after_ns),
    ]
}

/// What a `CL.THROTTLE` of `quantity` asks of the store under a limit of `capacity`: the
/// quantity, or 0 (a peek: nothing consumed, the key's state read) for a quantity above the
/// capacity, which redis-cell answers limited without consuming anything. One decision either way.
#[must_use]
pub fn throttle_cost(quantity: u64, capacity: u64) -> u64 {
    if quantity > capacity { 0 } else { quantity }
}

/// tollgate's `TG.CHECK` / `TG.PEEK` / `TG.LIMIT` reply, `[allowed, limit, remaining,
/// retry_after_ms, reset_after_ms]`, in milliseconds rounded up.
#[must_use]
pub fn check_reply(decision: &Decision) -> [i64; 5] {
    let saturating = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    [
        i64::from(decision.allowed),
        saturating(decision.limit),
        saturating(decision.remaining),
        saturating(decision.retry_after_ns.div_ceil(NS_PER_MS)),
        saturating(decision.reset_after_ns.div_ceil(NS_PER_MS)),
    ]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::Algorithm;

    use super::*;

    fn policy(text: &str, algorithm: Algorithm, burst: Option<u64>) -> String {
        let (count, period) = text.split_once('/').unwrap();
        let mut builder = Limit::builder(
            count.parse().unwrap(),
            Duration::from_nanos(tollgate_core::parse_period_ns(period).unwrap()),
        )
        .algorithm(algorithm);
        if let Some(burst) = burst {
            builder = builder.burst(burst);
        }
        policy_parameters(&builder.build().unwrap())
    }

    #[test]
    fn the_policy_states_the_configured_rate_for_every_algorithm() {
        // The quota is the count, never the burst: 100/1m with a burst of 20 is 100 per minute.
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::LeakyBucket] {
            assert_eq!(policy("100/1m", algorithm, Some(20)), "q=100;w=60;burst=20", "{algorithm}");
            assert_eq!(policy("100/1m", algorithm, None), "q=100;w=60;burst=100", "{algorithm}");
        }
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingLog, Algorithm::SlidingWindow] {
            assert_eq!(policy("100/1m", algorithm, None), "q=100;w=60", "{algorithm}");
        }
        assert_eq!(
            policy_parameters(&Limit::per_minute(100).algorithm(Algorithm::SubWindow).slices(6).build().unwrap()),
            "q=100;w=60"
        );
        assert_eq!(policy("5/1h", Algorithm::SlidingLog, None), "q=5;w=3600");
    }

    #[test]
    fn calendar_periods_are_stated_over_their_nominal_length() {
        let month = "1000/month".parse::<tollgate_core::LimitBuilder>().unwrap().tz("Europe/Berlin").build().unwrap();
        assert_eq!(policy_parameters(&month), "q=1000;w=2592000");
        let year = "12/year".parse::<tollgate_core::LimitBuilder>().unwrap().build().unwrap();
        assert_eq!(policy_parameters(&year), "q=12;w=31536000");
    }

    #[test]
    fn sub_second_and_odd_periods_never_promise_more_than_the_limit() {
        assert_eq!(policy("10/500ms", Algorithm::FixedWindow, None), "q=20;w=1");
        assert_eq!(policy("7/300ms", Algorithm::FixedWindow, None), "q=70;w=3");
        assert_eq!(policy("1/1ns", Algorithm::FixedWindow, None), "q=1000000000;w=1");
        // lcm(1 s + 1 ns, 1 s) is ~31 years: stated over 2 s, rounded down (1.99... per 2 s).
        assert_eq!(policy("2/1000000001ns", Algorithm::FixedWindow, None), "q=3;w=2");
    }

    #[test]
    fn every_front_end_rounds_up_and_a_denial_never_says_zero() {
        let denied =
            Decision { allowed: false, limit: 5, remaining: 0, retry_after_ns: 1, reset_after_ns: 1_000_000_001 };
        let allowed = Decision { allowed: true, retry_after_ns: 0, ..denied };
        assert_eq!(
            (retry_after_seconds(&denied), retry_after_seconds(&Decision { retry_after_ns: 0, ..denied })),
            (1, 1)
        );
        assert_eq!(ratelimit_field("a\"b\\c\n", &denied), "\"abc\";r=0;t=2");
        assert_eq!(
            legacy_fields(&denied),
            [("x-ratelimit-limit", 5), ("x-ratelimit-remaining", 0), ("x-ratelimit-reset", 2)]
        );
        assert_eq!(rls_duration(2_500_000_000), (2, 500_000_000));
        assert_eq!(envoy_headers(10, 3, 1_000_000_001)[2], ("RateLimit-Reset", "2".to_string()));
        assert_eq!(throttle_reply(&denied, 5, 1), [1, 5, 0, 1, 2]);
        assert_eq!(throttle_reply(&allowed, 5, 5), [0, 5, 0, -1, 2]);
        assert_eq!(check_reply(&denied), [0, 5, 0, 1, 1001]);
    }

    /// redis-cell's answer to a quantity above the capacity: limited, the state as a peek read it
    /// (nothing consumed), and a retry of -1, since waiting never lets it pass.
    #[test]
    fn a_throttle_above_the_capacity_is_limited_with_no_retry() {
        assert_eq!((throttle_cost(17, 16), throttle_cost(16, 16), throttle_cost(0, 16)), (0, 16, 0));
        let peek =
            Decision { allowed: true, limit: 16, remaining: 15, retry_after_ns: 0, reset_after_ns: 1_500_000_000 };
        assert_eq!(throttle_reply(&peek, 16, 17), [1, 16, 15, -1, 2]);
        let empty = Decision { allowed: false, remaining: 0, retry_after_ns: 3_000_000_000, ..peek };
        assert_eq!(throttle_reply(&empty, 16, 17), [1, 16, 0, -1, 2]);
    }
}
