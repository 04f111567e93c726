//! The HTTP API: `POST /v1/check`, `POST /v1/reserve` and `POST /v1/settle` ([`reserve`]),
//! `GET /metrics`, `GET /healthz` ([`router`]), served with the bounds of [`server`].
//!
//! `POST /v1/check` takes `{"key", "algorithm", "limit": "10/s", "burst", "slices", "cost"}` or
//! `{"limit_name", "key", "cost"}` and answers the decision as JSON: 200 when allowed, 429 when
//! not, with `Retry-After` (whole seconds, rounded up, never 0 on a denial) and the IETF
//! httpapi draft's `RateLimit-Policy` / `RateLimit` fields. Bad input is a 400 saying what is
//! wrong; a store failure is a 503.
//!
//! A web page cannot drive it: the body must come as `Content-Type: application/json` (415
//! otherwise), which a page can send to another site only after a CORS preflight this server
//! never grants (a `text/plain` POST is sent without one), and every route answers only a `Host`
//! that names this server ([`host`], against DNS rebinding).

pub mod held;
pub mod host;
pub mod reserve;
pub mod server;
pub mod tls;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use tollgate_core::{Algorithm, Decision, Limit, LimitSpec};
use tollgate_store::StoreError;

use tollgate_edge as edge;
use tollgate_engine::{EngineError, Frontend, Source};

use crate::app::App;

/// The router; bodies larger than `max_body_bytes` are answered 413.
pub fn router(app: Arc<App>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/reserve", post(reserve))
        .route("/v1/settle", post(settle))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(app)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    key: String,
    limit_name: Option<String>,
    // A LimitSpec's fields (serde cannot flatten it into a body that refuses unknown fields).
    algorithm: Option<Algorithm>,
    limit: Option<String>,
    burst: Option<u64>,
    slices: Option<u64>,
    tz: Option<String>,
    cost: Option<u64>,
}

#[derive(Debug, Serialize)]
struct CheckResponse {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

fn limit_of(request: &CheckRequest) -> Result<Limit, String> {
    let text = request.limit.clone().ok_or("give either \"limit_name\" or \"limit\" (e.g. \"10/s\")")?;
    let spec = LimitSpec {
        algorithm: request.algorithm,
        limit: Some(text),
        burst: request.burst,
        slices: request.slices,
        tz: request.tz.clone(),
    };
    spec.build().map_err(|e| e.to_string())
}

/// A store failure: 503 when the backend is down (and no failure policy answered), else 400.
fn store_error(e: &StoreError) -> Response {
    let status = if e.is_backend() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::BAD_REQUEST };
    (status, axum::Json(serde_json::json!({ "error": e.to_string() }))).into_response()
}

async fn check(State(app): State<Arc<App>>, request_headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = not_json(&request_headers, "/v1/check") {
        return refusal;
    }
    check_json(&app, &body).await
}

async fn reserve(State(app): State<Arc<App>>, request_headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = not_json(&request_headers, "/v1/reserve") {
        return refusal;
    }
    reserve::reserve_json(&app, &body).await
}

async fn settle(State(app): State<Arc<App>>, request_headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refusal) = not_json(&request_headers, "/v1/settle") {
        return refusal;
    }
    reserve::settle_json(&app, &body).await
}

/// The 415 to answer a request that does not say its body is `application/json` (parameters such
/// as `charset` allowed); none if it does.
fn not_json(request_headers: &HeaderMap, path: &str) -> Option<Response> {
    let mut lines = request_headers.get_all(header::CONTENT_TYPE).iter();
    let given = match (lines.next(), lines.next()) {
        (Some(line), None) => {
            let media = line.as_bytes().split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
            if media.eq_ignore_ascii_case(b"application/json") {
                return None;
            }
            format!("{:?}", String::from_utf8_lossy(line.as_bytes()))
        }
        (None, _) => "none".into(),
        (Some(_), Some(_)) => "more than one".into(),
    };
    let message = format!(
        "POST {path} takes Content-Type: application/json (given: {given}); with curl, add -H 'content-type: \
         application/json'"
    );
    Some((StatusCode::UNSUPPORTED_MEDIA_TYPE, axum::Json(serde_json::json!({ "error": message }))).into_response())
}

/// `POST /v1/check` on a request body: the decision, or the error, as the response.
pub async fn check_json(app: &App, body: &[u8]) -> Response {
    let request: CheckRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("invalid JSON body: {e}")),
    };
    let cost = request.cost.unwrap_or(1);
    let (decision, limit, policy) = if let Some(name) = &request.limit_name {
        if request.limit.is_some()
            || request.algorithm.is_some()
            || request.burst.is_some()
            || request.slices.is_some()
            || request.tz.is_some()
        {
            return bad_request("give either \"limit_name\" or an inline limit, not both".into());
        }
        match app.engine.check_named(Frontend::Http, name, request.key.as_bytes(), cost).await {
            Ok((decision, limit)) => (decision, limit, name.clone()),
            Err(EngineError::Store(e)) => return store_error(&e),
            Err(EngineError::Unavailable(message)) => {
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({ "error": message })))
                    .into_response();
            }
            Err(EngineError::UnknownRule(_)) => return bad_request(app.unknown_limit(name)),
            Err(e) => return bad_request(e.to_string()),
        }
    } else {
        let limit = match limit_of(&request) {
            Ok(limit) => limit,
            Err(message) => return bad_request(message),
        };
        match app.engine.check_adhoc(Source::Http, request.key.as_bytes(), &limit, cost).await {
            Ok(decision) => (decision, limit, "default".to_string()),
            Err(e) => return store_error(&e),
        }
    };
    let status = if decision.allowed { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    let body = CheckResponse {
        allowed: decision.allowed,
        limit: decision.limit,
        remaining: decision.remaining,
        retry_after_ns: decision.retry_after_ns,
        reset_after_ns: decision.reset_after_ns,
    };
    (status, headers(&decision, &limit, &policy), axum::Json(body)).into_response()
}

/// The IETF `RateLimit-Policy` / `RateLimit` fields, written as the middleware writes them, and
/// `Retry-After` on denials (whole seconds, rounded up, at least 1).
pub fn headers(decision: &Decision, limit: &Limit, policy: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    edge::http::decision_fields(&mut headers, policy, limit, decision);
    headers
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], app.render_metrics()).into_response()
}

/// `GET /healthz`: 200 while the server serves, the store's state in the body (see `health`).
async fn healthz(State(app): State<Arc<App>>) -> Response {
    axum::Json(app.health.report()).into_response()
}
