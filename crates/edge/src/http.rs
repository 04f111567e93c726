//! The HTTP edge: the header fields that tell a decision, and the responses a front end answers on
//! its own, written once for the middleware, `tollgate proxy` and the server's HTTP API:
//!
//! - [`rate_limit_fields`]: the IETF httpapi draft's `RateLimit-Policy` / `RateLimit` structured
//!   fields, and the legacy `X-RateLimit-*` when asked;
//! - [`decision_fields`]: those and `Retry-After` on a denial (the HTTP API's answer);
//! - [`too_many_requests`]: 429 with `Retry-After`, the fields, `Cache-Control: no-store` and an
//!   RFC 9457 `application/problem+json` body;
//! - [`problem`]: an RFC 9457 problem for the front ends' own errors (400, 404, 409, 500, 502,
//!   503, ...); [`shadow`]: a shadow-ban's bare fake success.
//!
//! Bodies are text: each front end puts them into its own body type (`response.map(Body::from)`).

use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use tollgate_core::{Decision, Limit};

use super::values::{legacy_fields, policy_field, ratelimit_field, retry_after_seconds};

/// Adds `RateLimit-Policy: "name";q=Q;w=W` and `RateLimit: "name";r=R;t=T` (and the legacy
/// `X-RateLimit-Limit/Remaining/Reset` when `legacy`).
pub fn rate_limit_fields(headers: &mut HeaderMap, policy: &str, limit: &Limit, decision: &Decision, legacy: bool) {
    let fields = [("ratelimit-policy", policy_field(policy, limit)), ("ratelimit", ratelimit_field(policy, decision))];
    for (field, value) in fields {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(field, value);
        }
    }
    if legacy {
        for (field, value) in legacy_fields(decision) {
            headers.insert(field, HeaderValue::from(value));
        }
    }
}

/// The [`rate_limit_fields`] (no legacy ones), then `Retry-After` (whole seconds, rounded up, at
/// least 1) when `decision` is a denial.
pub fn decision_fields(headers: &mut HeaderMap, policy: &str, limit: &Limit, decision: &Decision) {
    rate_limit_fields(headers, policy, limit, decision, false);
    if !decision.allowed {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds(decision)));
    }
}

/// The 429 for a request denied by rule `policy`; `rate_per_s`, the key's measured rate, is
/// reported in the body (an RFC 9457 extension member).
#[must_use]
pub fn too_many_requests(
    policy: &str,
    limit: &Limit,
    decision: &Decision,
    rate_per_s: Option<f64>,
    legacy: bool,
) -> Response<String> {
    let retry = retry_after_seconds(decision);
    let mut problem = serde_json::json!({
        "type": "about:blank",
        "title": "Too Many Requests",
        "status": 429,
        "detail": format!("rate limit \"{policy}\" exceeded; retry after {retry} s"),
    });
    if let Some(rate) = rate_per_s {
        problem["rate_per_s"] = serde_json::json!((rate * 100.0).round() / 100.0);
    }
    let mut response = Response::new(problem.to_string());
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry));
    rate_limit_fields(headers, policy, limit, decision, legacy);
    response
}

/// A shadow-ban's bare fake success: the status, body and content type it is configured with,
/// nothing else (the middleware answers with more: what it learned of the route's real
/// responses).
#[must_use]
pub fn shadow(status: u16, body: &str, content_type: &str) -> Response<String> {
    let mut response = Response::new(body.to_string());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}

/// An RFC 9457 problem for a front end's own errors.
#[must_use]
pub fn problem(status: StatusCode, detail: &str) -> Response<String> {
    let title = status.canonical_reason().unwrap_or("Error");
    let body =
        serde_json::json!({ "type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail });
    let mut response = Response::new(body.to_string());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> Decision {
        Decision {
            allowed: false,
            limit: 2,
            remaining: 0,
            retry_after_ns: 1_500_000_000,
            reset_after_ns: 2_000_000_000,
        }
    }

    #[test]
    fn a_429_tells_the_decision_in_its_fields_and_its_problem() {
        let limit = Limit::per_minute(2).build().unwrap();
        let response = too_many_requests("api", &limit, &denied(), Some(4.567), true);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        let field = |name: &str| response.headers()[name].to_str().unwrap().to_string();
        assert_eq!(field("retry-after"), "2");
        assert_eq!(field("ratelimit-policy"), "\"api\";q=2;w=60;burst=2");
        assert_eq!(field("ratelimit"), "\"api\";r=0;t=2");
        assert_eq!(field("x-ratelimit-reset"), "2");
        assert_eq!(
            (field("content-type"), field("cache-control")),
            ("application/problem+json".into(), "no-store".into())
        );
        assert_eq!(
            response.body(),
            r#"{"detail":"rate limit \"api\" exceeded; retry after 2 s","rate_per_s":4.57,"status":429,"title":"Too Many Requests","type":"about:blank"}"#
        );
    }

    #[test]
    fn the_api_fields_say_retry_after_only_on_a_denial() {
        let limit = Limit::per_minute(2).build().unwrap();
        let mut headers = HeaderMap::new();
        decision_fields(&mut headers, "default", &limit, &Decision { allowed: true, retry_after_ns: 0, ..denied() });
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["ratelimit-policy", "ratelimit"]);
        decision_fields(&mut headers, "default", &limit, &denied());
        assert_eq!(headers["retry-after"], "2");
        assert!(!headers.contains_key("x-ratelimit-limit"));
        let problem = problem(StatusCode::BAD_GATEWAY, "down");
        assert_eq!(problem.body(), r#"{"detail":"down","status":502,"title":"Bad Gateway","type":"about:blank"}"#);
    }
}
