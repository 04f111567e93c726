//! The responses and header fields the middleware writes: 429 with `Retry-After`, the IETF
//! httpapi draft's `RateLimit-Policy` / `RateLimit` structured fields, optional legacy
//! `X-RateLimit-*`, `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body;
//! and a shadow-ban's bare fake success. The values come from `tollgate_engine::render`, which every
//! front end shares.

use axum_core::body::Body;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use tollgate_core::{Decision, Limit};
use tollgate_engine::render;

/// Adds `RateLimit-Policy: "name";q=Q;w=W` and `RateLimit: "name";r=R;t=T` (and the legacy
/// `X-RateLimit-Limit/Remaining/Reset` when `legacy`), valued by [`render`].
pub fn rate_limit_fields(headers: &mut HeaderMap, policy: &str, limit: &Limit, decision: &Decision, legacy: bool) {
    let fields = [
        ("ratelimit-policy", render::policy_field(policy, limit)),
        ("ratelimit", render::ratelimit_field(policy, decision)),
    ];
    for (field, value) in fields {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(field, value);
        }
    }
    if legacy {
        for (field, value) in render::legacy_fields(decision) {
            headers.insert(field, HeaderValue::from(value));
        }
    }
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
    let retry = render::retry_after_seconds(decision);
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

/// A shadow-ban's bare fake success: the status, body and content type it is configured with,
/// nothing else. The middleware answers with more: what it learned of the route's real
/// responses (see [`shadow`](crate::shadow)).
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
