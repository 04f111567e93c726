//! The responses and header fields the middleware writes: 429 with `Retry-After`, the IETF
//! httpapi draft's `RateLimit-Policy` / `RateLimit` structured fields, optional legacy
//! `X-RateLimit-*`, `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body;
//! and a shadow-ban's fake success.

use axum_core::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use tollgate_core::{Decision, Limit};

fn seconds_up(ns: u64) -> u64 {
    ns.div_ceil(1_000_000_000)
}

/// Adds `RateLimit-Policy: "name";q=Q;w=W` and `RateLimit: "name";r=R;t=T` (and the legacy
/// `X-RateLimit-Limit/Remaining/Reset` when `legacy`).
pub fn rate_limit_fields(headers: &mut HeaderMap, policy: &str, limit: &Limit, decision: &Decision, legacy: bool) {
    let name: String = policy.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect();
    let reset = seconds_up(decision.reset_after_ns);
    let fields = [
        ("ratelimit-policy", format!("\"{name}\";{}", policy_parameters(limit))),
        ("ratelimit", format!("\"{name}\";r={};t={reset}", decision.remaining)),
    ];
    for (field, value) in fields {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(field, value);
        }
    }
    if legacy {
        headers.insert("x-ratelimit-limit", HeaderValue::from(decision.limit));
        headers.insert("x-ratelimit-remaining", HeaderValue::from(decision.remaining));
        headers.insert("x-ratelimit-reset", HeaderValue::from(reset));
    }
}

/// The policy's parameters: `q` requests per window of `w` whole seconds, the configured rate for
/// every algorithm, and for the bucket family `burst` (requests admitted at once from idle; the
/// draft lets a policy carry parameters of its own). A period that is not a whole number of
/// seconds is stated over the shortest whole-second window holding a whole number of periods
/// (`10/500ms` is `q=20;w=1`, `7/300ms` is `q=70;w=3`); when that window would exceed an hour,
/// over the period rounded up to a second, with `q` rounded down: never a promise of more than
/// the limit admits.
pub fn policy_parameters(limit: &Limit) -> String {
    const SECOND: u128 = 1_000_000_000;
    let (count, period) = (u128::from(limit.count()), u128::from(limit.period_ns()));
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

/// The 429 for a request denied by rule `policy`; `rate_per_s`, the key's measured rate, is
/// reported in the body (an RFC 9457 extension member).
pub fn too_many_requests(
    policy: &str,
    limit: &Limit,
    decision: &Decision,
    rate_per_s: Option<f64>,
    legacy: bool,
) -> Response<Body> {
    let retry = seconds_up(decision.retry_after_ns).max(1);
    let mut problem = serde_json::json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!("rate limit \"{policy}\" exceeded; retry after {retry} s"),
    });
    if let Some(rate) = rate_per_s {
        problem["rate_per_s"] = serde_json::json!((rate * 100.0).round() / 100.0);
    }
    let mut response = Response::new(Body::from(problem.to_string()));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry));
    rate_limit_fields(headers, policy, limit, decision, legacy);
    response
}

/// A shadow-ban's fake success: the client cannot tell it was not served.
pub fn shadow(status: u16, body: &str, content_type: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// An RFC 9457 problem for the middleware's own errors (400, 500, 503).
pub fn problem(status: StatusCode, detail: &str) -> Response<Body> {
    let title = status.canonical_reason().unwrap_or("Error");
    let body =
        serde_json::json!({ "type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
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
    fn sub_second_and_odd_periods_never_promise_more_than_the_limit() {
        assert_eq!(policy("10/500ms", Algorithm::FixedWindow, None), "q=20;w=1");
        assert_eq!(policy("7/300ms", Algorithm::FixedWindow, None), "q=70;w=3");
        assert_eq!(policy("1/1ns", Algorithm::FixedWindow, None), "q=1000000000;w=1");
        // lcm(1 s + 1 ns, 1 s) is ~31 years: stated over 2 s, rounded down (1.99... per 2 s).
        assert_eq!(policy("2/1000000001ns", Algorithm::FixedWindow, None), "q=3;w=2");
    }
}
