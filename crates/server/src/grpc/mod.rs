//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`)
//! over the same engine and store as RESP and HTTP. This module only translates: a request is
//! parsed into the engine's descriptors (its sizes bounded, its `limit` overrides built), decided
//! by the engine under the Envoy configuration of its policy ([`Engine::admit_descriptors`]: how
//! each descriptor is decided, all or nothing, shadow and quota mode, timing, store errors and
//! envoyproxy/ratelimit's per-limit counters), and rendered as Envoy's statuses (and, if asked,
//! its `RateLimit-*` headers; for a request with quota-mode descriptors, dynamic metadata saying
//! which are over). A request marked to reserve, or to settle a reservation, is answered by
//! `reserve` (Envoy's request-time and response-time calls).

mod idle;
mod listener;
mod reserve;

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Decision, LimitSpec};
use tollgate_edge as edge;
use tollgate_engine::{Descriptor, Engine, StatedLimit, Verdict, Verdicts};
use tollgate_envoy::{RateLimit, Unit};
use tollgate_rls::RateLimitServiceServer;
use tollgate_rls::envoy::config::core::v3::HeaderValue;
use tollgate_rls::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
use tollgate_rls::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_store::StoreError;
use tonic::{Request, Response, Status};

use crate::backend::Backend;

/// Most descriptors in one request, and entries in one descriptor: far above what Envoy's rate
/// limit actions produce, low enough that no request makes one store call unbounded (a message is
/// capped at `--grpc-max-message` as well).
pub const MAX_DESCRIPTORS: usize = 256;
/// See [`MAX_DESCRIPTORS`].
pub const MAX_ENTRIES: usize = 64;

/// The service: the engine, whose policy holds Envoy's configuration in force.
#[derive(Debug)]
pub struct RateLimitService {
    engine: Arc<Engine<Arc<Backend>>>,
    headers: bool,
}

impl RateLimitService {
    /// The service over `engine`.
    pub fn new(engine: Arc<Engine<Arc<Backend>>>) -> Self {
        RateLimitService { engine, headers: false }
    }

    /// Also asks Envoy to add `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
    /// (whole seconds, rounded up) to its response, from the descriptor closest to its limit, as
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`.
    #[must_use]
    pub fn with_response_headers(mut self, on: bool) -> Self {
        self.headers = on;
        self
    }
}

#[tonic::async_trait]
impl tollgate_rls::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let descriptors = parse(&request)?;
        // A request marked to reserve or to settle (see `reserve`).
        if let Some(response) = reserve::answer(&self.engine, &request, &descriptors).await? {
            return Ok(Response::new(response));
        }
        let verdicts = self.engine.admit_descriptors(&request.domain, &descriptors, request.hits_addend).await;
        let verdicts = verdicts.map_err(|e| match e {
            StoreError::Limit(e) => Status::invalid_argument(e.to_string()),
            e if e.is_backend() => Status::unavailable(e.to_string()),
            e => Status::internal(e.to_string()),
        })?;
        let mut response = response(verdicts);
        if self.headers {
            response.response_headers_to_add = response_headers(&response.statuses);
        }
        Ok(Response::new(response))
    }
}

/// The request's descriptors, as the engine takes them: `INVALID_ARGUMENT` for an empty domain,
/// no descriptors, more than the bounds, or a `limit` override that is no limit.
fn parse(request: &RateLimitRequest) -> Result<Vec<Descriptor<'_>>, Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("rate limit domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument("rate limit descriptor list must not be empty"));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors in one request, above the maximum of {MAX_DESCRIPTORS}",
            request.descriptors.len()
        )));
    }
    if let Some(d) = request.descriptors.iter().find(|d| d.entries.len() > MAX_ENTRIES) {
        return Err(Status::invalid_argument(format!(
            "a descriptor of {} entries, above the maximum of {MAX_ENTRIES}",
            d.entries.len()
        )));
    }
    request
        .descriptors
        .iter()
        .map(|d| {
            // A descriptor's `limit` override replaces its configured limit, as in envoyproxy/ratelimit.
            let limit = match &d.limit {
                None => None,
                Some(o) => {
                    let unit = Unit::from_proto(o.unit)
                        .ok_or_else(|| Status::invalid_argument(format!("limit override: unknown unit {}", o.unit)))?;
                    let limit = RateLimit::from_override(o.requests_per_unit, unit, &LimitSpec::default())
                        .map_err(|e| Status::invalid_argument(format!("limit override: {e}")))?;
                    Some(limit)
                }
            };
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            Ok(Descriptor { entries, hits_addend: d.hits_addend, limit })
        })
        .collect()
}

/// Envoy's response to what the engine decided.
fn response(verdicts: Verdicts) -> RateLimitResponse {
    let dynamic_metadata = quota_metadata(&verdicts);
    let statuses = verdicts
        .verdicts
        .into_iter()
        .map(|verdict| match verdict {
            Verdict::Free => status(Code::Ok, None, None),
            Verdict::Unlimited => DescriptorStatus { limit_remaining: u32::MAX, ..status(Code::Ok, None, None) },
            Verdict::Limited { limit, over, decision } => {
                status(if over { Code::OverLimit } else { Code::Ok }, Some(limit), decision.as_ref())
            }
        })
        .collect();
    let overall = if verdicts.admitted { Code::Ok } else { Code::OverLimit };
    RateLimitResponse {
        overall_code: overall.into(),
        statuses,
        response_headers_to_add: Vec::new(),
        request_headers_to_add: Vec::new(),
        dynamic_metadata,
    }
}

/// For a request with descriptors in quota mode, the dynamic metadata of envoyproxy/ratelimit's
/// quota mode: `quotaModeEnabled: true`, and `quotaModeViolations`, the indices of the quota-mode
/// descriptors over their limit, when there are some. `None` for any other request (no
/// metadata: the response is as before quota mode).
fn quota_metadata(verdicts: &Verdicts) -> Option<prost_types::Struct> {
    use prost_types::value::Kind;
    if verdicts.quota.is_empty() {
        return None;
    }
    let value = |kind| prost_types::Value { kind: Some(kind) };
    let violations: Vec<prost_types::Value> = verdicts
        .quota
        .iter()
        .filter(|&&i| matches!(verdicts.verdicts.get(i), Some(Verdict::Limited { over: true, .. })))
        // Indices below `MAX_DESCRIPTORS`: exact as a protobuf number (a double).
        .map(|&i| value(Kind::NumberValue(f64::from(u32::try_from(i).unwrap_or(u32::MAX)))))
        .collect();
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("quotaModeEnabled".to_owned(), value(Kind::BoolValue(true)));
    if !violations.is_empty() {
        fields.insert(
            "quotaModeViolations".to_owned(),
            value(Kind::ListValue(prost_types::ListValue { values: violations })),
        );
    }
    Some(prost_types::Struct { fields })
}

fn status(code: Code, limit: Option<StatedLimit>, decision: Option<&Decision>) -> DescriptorStatus {
    DescriptorStatus {
        code: code.into(),
        current_limit: limit.map(|l| CurrentLimit {
            name: l.name,
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.proto(),
        }),
        limit_remaining: decision.map_or(0, |d| u32::try_from(d.remaining).unwrap_or(u32::MAX)),
        duration_until_reset: decision.map(|d| {
            let (seconds, nanos) = edge::rls_duration(d.reset_after_ns);
            prost_types::Duration { seconds, nanos }
        }),
    }
}

/// The `RateLimit-*` headers of the limited descriptor with the least remaining (the first of
/// equals); none when no descriptor has a limit.
fn response_headers(statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let Some((status, limit)) =
        statuses.iter().filter_map(|s| Some((s, s.current_limit.as_ref()?))).min_by_key(|(s, _)| s.limit_remaining)
    else {
        return Vec::new();
    };
    let reset_ns = status.duration_until_reset.as_ref().map_or(0, |d| {
        let (seconds, nanos) = (u64::try_from(d.seconds).unwrap_or(0), u64::try_from(d.nanos).unwrap_or(0));
        seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
    });
    edge::envoy_headers(limit.requests_per_unit, status.limit_remaining, reset_ns)
        .into_iter()
        .map(|(key, value)| HeaderValue { key: key.into(), value })
        .collect()
}

/// Serves the rate-limit service (and `grpc.health.v1.Health`, SERVING) on `listener` until
/// `stopped` turns true; requests in flight are answered first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<Engine<Arc<Backend>>>,
    response_headers: bool,
    bounds: crate::config::GrpcBounds,
    grace: Duration,
    stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<(), String> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<RateLimitServiceServer<RateLimitService>>().await;
    // Both services under the same message limit (tonic's default is 4 MiB), and their requests
    // counted as their connection's activity (see `idle`).
    let health = idle::Tracked(health.max_decoding_message_size(bounds.max_message_bytes));
    let service = idle::Tracked(
        RateLimitServiceServer::new(RateLimitService::new(engine).with_response_headers(response_headers))
            .max_decoding_message_size(bounds.max_message_bytes),
    );
    let incoming = listener::incoming(
        listener,
        bounds.max_connections,
        bounds.header_read_timeout,
        bounds.idle_timeout,
        bounds.keepalive_timeout,
    );
    let mut signal = stopped.clone();
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(bounds.max_concurrent_streams)
        .timeout(bounds.request_timeout)
        .http2_keepalive_interval(Some(bounds.keepalive))
        .http2_keepalive_timeout(Some(bounds.keepalive_timeout))
        .tcp_keepalive(Some(bounds.keepalive))
        .http2_max_header_list_size(16 << 10)
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = signal.wait_for(|stop| *stop).await;
        });
    // After the signal, connections get `grace` to finish (a client that never closes its
    // connection would otherwise hold the shutdown until keepalive gives up on it).
    let mut stopped = stopped;
    let deadline = async move {
        let _ = stopped.wait_for(|stop| *stop).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = server => served.map_err(|e| format!("gRPC server: {e}")),
        () = deadline => Ok(()),
    }
}
