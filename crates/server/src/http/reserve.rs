//! `POST /v1/reserve` and `POST /v1/settle`: reservations for work whose cost is known only
//! after it is done (see `tollgate_engine`'s `reserve`).
//!
//! - `POST /v1/reserve` takes `{"key", "estimate", "ttl_ms"}` and the limits to charge: any of
//!   `"limit_name"`, `"limit_names": [...]` and an inline limit (`"limit": "1000/m"`,
//!   `"algorithm"`, `"burst"`, `"slices"`), at most 16 of them, all or nothing. It answers 200
//!   with the reservation's `id` and `deadline_ms` (ms since the epoch) and the tightest decision,
//!   or 429 with the decision and no id (nothing charged). `ttl_ms` defaults to 60,000 and is at most 3,600,000.
//! - `POST /v1/settle` takes `{"id", "actual"}`: 200 `{"settled": true, "estimate", "actual"}`
//!   once; then 409 (settled already), 410 (past the deadline: it stays charged at the
//!   estimate), 404 (no such reservation), 400 (not an id, an actual above 2^53 − 1). A 503 (the
//!   store failed) may be sent again: a settle applies once.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tollgate_core::{Algorithm, LimitSpec};
use tollgate_engine::{EngineError, Frontend, MAX_RESERVED_LIMITS, Reserving};
use tollgate_store::{Refusal, StoreError};

use super::{bad_request, headers, store_error};
use crate::app::App;

/// A reservation's default life: a minute.
pub const DEFAULT_TTL_MS: u64 = 60_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveRequest {
    key: String,
    estimate: u64,
    ttl_ms: Option<u64>,
    limit_name: Option<String>,
    #[serde(default)]
    limit_names: Vec<String>,
    algorithm: Option<Algorithm>,
    limit: Option<String>,
    burst: Option<u64>,
    slices: Option<u64>,
    /// The zone of an inline calendar limit (`"1000000/month"`).
    tz: Option<String>,
}

#[derive(Debug, Serialize)]
struct ReserveResponse {
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_ms: Option<u64>,
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    id: String,
    actual: u64,
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

/// An engine error as a response: a refusal by its own status, the rest as `/v1/check` answers.
fn engine_error(app: &App, e: EngineError) -> Response {
    match e {
        EngineError::Store(StoreError::Refused(refusal)) => {
            let status = match refusal {
                Refusal::AlreadySettled(_) => StatusCode::CONFLICT,
                Refusal::Expired(_) => StatusCode::GONE,
                Refusal::Unknown(_) => StatusCode::NOT_FOUND,
                Refusal::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
                Refusal::Malformed(_) | Refusal::TooLarge(_) => StatusCode::BAD_REQUEST,
            };
            error(status, refusal.to_string())
        }
        EngineError::Store(e) => store_error(&e),
        EngineError::Unavailable(message) => error(StatusCode::SERVICE_UNAVAILABLE, message),
        EngineError::UnknownRule(name) => bad_request(app.unknown_limit(&name)),
        e => bad_request(e.to_string()),
    }
}

/// `POST /v1/reserve` on a request body.
pub async fn reserve_json(app: &App, body: &[u8]) -> Response {
    let request: ReserveRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("invalid JSON body: {e}")),
    };
    let mut limits: Vec<Reserving> =
        request.limit_name.iter().chain(&request.limit_names).map(|n| Reserving::Named(n.clone())).collect();
    if let Some(text) = &request.limit {
        let spec = LimitSpec {
            algorithm: request.algorithm,
            limit: Some(text.clone()),
            burst: request.burst,
            slices: request.slices,
            tz: request.tz.clone(),
        };
        match spec.build() {
            Ok(limit) => limits.push(Reserving::Limit(limit)),
            Err(e) => return bad_request(e.to_string()),
        }
    } else if request.algorithm.is_some() || request.burst.is_some() || request.slices.is_some() || request.tz.is_some()
    {
        return bad_request("\"algorithm\", \"burst\", \"slices\" and \"tz\" go with an inline \"limit\"".into());
    }
    if limits.is_empty() {
        return bad_request("give \"limit_name\", \"limit_names\" or an inline \"limit\" (e.g. \"1000/m\")".into());
    }
    if limits.len() > MAX_RESERVED_LIMITS {
        return bad_request(format!("a reserve names at most {MAX_RESERVED_LIMITS} limits, got {}", limits.len()));
    }
    let ttl = Duration::from_millis(request.ttl_ms.unwrap_or(DEFAULT_TTL_MS));
    let reserved =
        match app.engine.reserve(Frontend::Http, &limits, request.key.as_bytes(), request.estimate, ttl).await {
            Ok(reserved) => reserved,
            Err(e) => return engine_error(app, e),
        };
    let decision = reserved.decision;
    let status = if reserved.reservation.is_some() { StatusCode::OK } else { StatusCode::TOO_MANY_REQUESTS };
    let body = ReserveResponse {
        allowed: reserved.reservation.is_some(),
        deadline_ms: reserved.reservation.as_ref().map(|r| r.deadline_ns / 1_000_000),
        id: reserved.reservation.map(|r| r.id),
        limit: decision.limit,
        remaining: decision.remaining,
        retry_after_ns: decision.retry_after_ns,
        reset_after_ns: decision.reset_after_ns,
    };
    let policy = reserved.name.unwrap_or_else(|| "default".into());
    (status, headers(&decision, &reserved.limit, &policy), axum::Json(body)).into_response()
}

/// `POST /v1/settle` on a request body.
pub async fn settle_json(app: &App, body: &[u8]) -> Response {
    let request: SettleRequest = match serde_json::from_slice(body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("invalid JSON body: {e}")),
    };
    match app.engine.settle_reservation(Frontend::Http, &request.id, request.actual).await {
        Ok(settled) => axum::Json(serde_json::json!({
            "settled": true, "estimate": settled.estimate, "actual": settled.actual,
        }))
        .into_response(),
        Err(e) => engine_error(app, e),
    }
}
