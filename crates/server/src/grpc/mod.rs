//! Envoy's rate-limit service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`)
//! over the same engine and store as RESP and HTTP, configured with envoyproxy/ratelimit's YAML
//! (`tollgate-envoy`).
//!
//! A request is decided as envoyproxy/ratelimit decides it, with one difference on purpose: it
//! is all or nothing. Its enforced descriptors are admitted together in one store call, so a
//! request over any of its limits consumes nothing from the others (envoyproxy/ratelimit counts
//! every descriptor, and a request refused by one still uses up its siblings). Shadow-mode limits
//! never refuse: they are counted when the request is admitted and report what they would have
//! said. `requests_per_unit: 0` is always over the limit; `unlimited` and unmatched descriptors
//! are OK without a `current_limit`.

mod idle;
mod listener;
pub mod metrics;
pub mod reload;

use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;

use tollgate_core::Decision;
use tollgate_core::LimitSpec;
use tollgate_engine::{Ask, Engine, Frontend, render};
use tollgate_envoy::{Config, Matched, RateLimit, Unit};
use tollgate_rls::RateLimitServiceServer;
use tollgate_rls::envoy::config::core::v3::HeaderValue;
use tollgate_rls::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
use tollgate_rls::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_store::{Check, Store, StoreError};
use tonic::{Request, Response, Status};

use crate::app::App;
use metrics::{DescriptorMetrics, DescriptorOutcome};

/// The scope of every Envoy descriptor's state: apart from rules, named limits and ad-hoc keys.
const SCOPE: &str = tollgate_rules::ENVOY_SCOPE;

/// Most descriptors in one request, and entries in one descriptor: far above what Envoy's rate
/// limit actions produce, low enough that no request makes one store call unbounded (a message is
/// capped at `--grpc-max-message` as well).
pub const MAX_DESCRIPTORS: usize = 256;
/// See [`MAX_DESCRIPTORS`].
pub const MAX_ENTRIES: usize = 64;

/// The service: the app's engine and store, and the configuration in force (swapped on reload).
#[derive(Debug)]
pub struct RateLimitService {
    app: Arc<App>,
    config: Arc<RwLock<Arc<Config>>>,
    headers: bool,
}

impl RateLimitService {
    /// The service over `app`, deciding with `config` (shared with its reloader).
    pub fn new(app: Arc<App>, config: Arc<RwLock<Arc<Config>>>) -> Self {
        RateLimitService { app, config, headers: false }
    }

    /// Also asks Envoy to add `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset`
    /// (whole seconds, rounded up) to its response, from the descriptor closest to its limit, as
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`.
    #[must_use]
    pub fn with_response_headers(mut self, on: bool) -> Self {
        self.headers = on;
        self
    }

    fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// How one descriptor is decided.
enum DescriptorPlan<'a> {
    /// No limit applies (unmatched, or replaced by another descriptor's limit): OK.
    Free,
    /// `unlimited: true`: OK, never counted.
    Unlimited,
    /// `requests_per_unit: 0`, or more hits than the limit can ever admit: over the limit
    /// (reported OK in shadow mode).
    Blocked { shown: Shown, shadow: bool, metric: &'a str, hits: u64 },
    /// Decided by the store: enforced, or in shadow mode.
    Checked { check: Check<'a>, shown: Shown, shadow: bool, metric: &'a str },
}

/// The limit as the response states it.
#[derive(Clone)]
struct Shown {
    name: String,
    requests_per_unit: u32,
    unit: Unit,
}

impl Shown {
    fn current(&self) -> CurrentLimit {
        CurrentLimit { name: self.name.clone(), requests_per_unit: self.requests_per_unit, unit: self.unit.proto() }
    }
}

fn status(code: Code, shown: Option<&Shown>, decision: Option<&Decision>) -> DescriptorStatus {
    DescriptorStatus {
        code: code.into(),
        current_limit: shown.map(Shown::current),
        limit_remaining: decision.map_or(0, |d| u32::try_from(d.remaining).unwrap_or(u32::MAX)),
        duration_until_reset: decision.map(|d| {
            let (seconds, nanos) = render::rls_duration(d.reset_after_ns);
            prost_types::Duration { seconds, nanos }
        }),
    }
}

#[tonic::async_trait]
impl tollgate_rls::RateLimitService for RateLimitService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
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
        let config = self.config();
        let entries: Vec<Vec<(&str, &str)>> = request
            .descriptors
            .iter()
            .map(|d| d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect())
            .collect();
        let slices: Vec<&[(&str, &str)]> = entries.iter().map(Vec::as_slice).collect();
        // A descriptor's `limit` override replaces its configured limit, as in envoyproxy/ratelimit.
        let overrides = request
            .descriptors
            .iter()
            .map(|d| {
                let Some(o) = &d.limit else { return Ok(None) };
                let unit = Unit::from_proto(o.unit)
                    .ok_or_else(|| Status::invalid_argument(format!("limit override: unknown unit {}", o.unit)))?;
                RateLimit::from_override(o.requests_per_unit, unit, &LimitSpec::default())
                    .map(Some)
                    .map_err(|e| Status::invalid_argument(format!("limit override: {e}")))
            })
            .collect::<Result<Vec<Option<RateLimit>>, Status>>()?;
        let override_refs: Vec<Option<&RateLimit>> = overrides.iter().map(Option::as_ref).collect();
        let matched = config.limits_for_request(&request.domain, &slices, &override_refs);
        // The request's cost: 0 (unset) means 1; a descriptor's own `hits_addend` overrides it.
        let request_cost = if request.hits_addend == 0 { 1 } else { u64::from(request.hits_addend) };
        let plans: Vec<DescriptorPlan<'_>> = request
            .descriptors
            .iter()
            .zip(&matched)
            .map(|(descriptor, matched)| plan(matched.as_ref(), descriptor.hits_addend.unwrap_or(request_cost)))
            .collect();
        // Decided by the engine (all or nothing, shadow mode, timing) on the gRPC service's own
        // store handle (its shorter timeout).
        let decided = decide(&self.app.engine, self.app.grpc_store.as_ref(), &plans, &self.app.envoy_metrics).await;
        let mut response = decided.map_err(|e| match e {
            StoreError::Limit(e) => Status::invalid_argument(e.to_string()),
            e if e.is_backend() => Status::unavailable(e.to_string()),
            e => Status::internal(e.to_string()),
        })?;
        if self.headers {
            response.response_headers_to_add = response_headers(&response.statuses);
        }
        Ok(Response::new(response))
    }
}

/// One descriptor's plan from the limit it matched (configured or its override).
fn plan<'a>(matched: Option<&'a Matched<'a>>, cost: u64) -> DescriptorPlan<'a> {
    let Some(m) = matched else { return DescriptorPlan::Free };
    if m.limit.unlimited {
        return DescriptorPlan::Unlimited;
    }
    let shown = Shown {
        name: m.limit.name.clone().unwrap_or_default(),
        requests_per_unit: m.limit.requests_per_unit,
        unit: m.limit.unit,
    };
    let (shadow, metric) = (m.limit.shadow_mode, m.metric_key.as_str());
    match &m.limit.limit {
        // A cost above what the limit can ever admit is over it, as in envoyproxy/ratelimit (for
        // the store it would be an error, failing the whole call open in Envoy).
        Some(limit) if cost > limit.capacity() => DescriptorPlan::Blocked { shown, shadow, metric, hits: cost },
        Some(limit) => {
            DescriptorPlan::Checked { check: Check::new(&m.key, limit, cost).scoped(SCOPE), shown, shadow, metric }
        }
        None => DescriptorPlan::Blocked { shown, shadow, metric, hits: cost },
    }
}

/// The response to the plans, decided by the engine ([`tollgate_engine::Ask`]: the enforced checks
/// all or nothing, shadow-mode ones counted only when the request is admitted, peeks for the
/// statuses of what a refused request did not consume), with Envoy's per-descriptor metrics.
async fn decide<S: Store>(
    engine: &Engine<Arc<crate::backend::Backend>>,
    store: &S,
    plans: &[DescriptorPlan<'_>],
    metrics: &DescriptorMetrics,
) -> Result<RateLimitResponse, StoreError> {
    let refused = plans.iter().any(|p| matches!(p, DescriptorPlan::Blocked { shadow: false, .. }));
    let asks: Vec<Ask<'_>> = plans
        .iter()
        .filter_map(|p| match p {
            DescriptorPlan::Checked { check, shadow, .. } => Some(Ask { check: *check, shadow: *shadow }),
            _ => None,
        })
        .collect();
    let asked = engine.admit_asks(Frontend::Grpc, store, &asks, refused).await?;
    let admitted = asked.admitted;
    let mut decisions = asked.decisions.into_iter();
    let mut statuses = Vec::with_capacity(plans.len());
    for plan in plans {
        statuses.push(match plan {
            DescriptorPlan::Free => status(Code::Ok, None, None),
            DescriptorPlan::Unlimited => DescriptorStatus { limit_remaining: u32::MAX, ..status(Code::Ok, None, None) },
            DescriptorPlan::Blocked { shown, shadow, metric, hits } => {
                metrics.record(
                    metric,
                    *hits,
                    if *shadow { DescriptorOutcome::Shadow } else { DescriptorOutcome::Over },
                );
                status(if *shadow { Code::Ok } else { Code::OverLimit }, Some(shown), None)
            }
            DescriptorPlan::Checked { check, shown, shadow, metric } => {
                let decision = decisions.next().ok_or(StoreError::NoChecks)?;
                let outcome = match (decision.allowed, admitted) {
                    (false, _) if *shadow => DescriptorOutcome::Shadow,
                    (false, _) => DescriptorOutcome::Over,
                    (true, true) => {
                        DescriptorOutcome::Within { remaining: decision.remaining, capacity: decision.limit }
                    }
                    (true, false) => DescriptorOutcome::NotCounted,
                };
                metrics.record(metric, check.cost, outcome);
                // Shadow mode never refuses: over or not, the descriptor is OK.
                let code = if decision.allowed || *shadow { Code::Ok } else { Code::OverLimit };
                status(code, Some(shown), Some(&decision))
            }
        });
    }
    let overall = if admitted { Code::Ok } else { Code::OverLimit };
    Ok(RateLimitResponse {
        overall_code: overall.into(),
        statuses,
        response_headers_to_add: Vec::new(),
        request_headers_to_add: Vec::new(),
    })
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
    render::envoy_headers(limit.requests_per_unit, status.limit_remaining, reset_ns)
        .into_iter()
        .map(|(key, value)| HeaderValue { key: key.into(), value })
        .collect()
}

/// Serves the rate-limit service (and `grpc.health.v1.Health`, SERVING) on `listener` until
/// `stopped` turns true; requests in flight are answered first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    config: Arc<RwLock<Arc<Config>>>,
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
        RateLimitServiceServer::new(RateLimitService::new(app, config).with_response_headers(response_headers))
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
