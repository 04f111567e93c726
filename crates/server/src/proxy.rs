//! `tollgate proxy`: a reverse proxy applying a rules file (through `tollgate-engine`, by the
//! `tollgate-tower` middleware) in front of any HTTP/1.1 service, with `/metrics`, `/healthz` and
//! `/v1/rules/{name}/top` (a rule's keys by measured rate) on a separate admin listener so that
//! the upstream's own paths stay untouched.
//!
//! Its listener may terminate TLS (the ClientHello fingerprinted for `ja3`/`ja4`, see
//! `http::tls`); requests a `route` rule mitigates go to that rule's quarantine upstream.
//!
//! Bounded like `serve`'s HTTP listener (header-read timeout, request timeout, connection cap,
//! body limit: a body over `--http-max-body` is answered 413 before anything is forwarded, by its
//! `Content-Length`, or a chunked one read up to the limit first); the upstream gets a connect and
//! response timeout (504 after it). Hop-by-hop headers, and every header the `Connection` header
//! names, are not forwarded; a request whose target is in absolute form (`POST http://host/path`)
//! is forwarded with that authority as its `Host`, which is what the rules matched (RFC 9112
//! section 3.2.2: the target's authority wins over `Host`); a 502 or 504 says nothing of the
//! upstream's address or error (those go to the log). The rules are reloaded on SIGHUP and when
//! their file changes.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tollgate_engine::{Engine, EngineError};
use tollgate_rules::Rules;
use tollgate_tower::{Options, Quarantine, RateLimitLayer};

use crate::backend::Backend;
use crate::config::Config;
use crate::health::Health;
use crate::http::tls::Tls;

/// Where to forward, and what to apply.
#[derive(Debug)]
pub struct ProxyConfig {
    /// The upstream base URL, e.g. `http://127.0.0.1:3000`.
    pub upstream: String,
    /// The rules.
    pub rules: Rules,
    /// The rules' file, reloaded on SIGHUP and when it changes.
    pub rules_file: Option<PathBuf>,
    /// Header options of the middleware.
    pub options: Options,
    /// Longest the upstream may take to accept a connection and to answer (default 30 s): 504.
    pub upstream_timeout: Duration,
    /// Terminate TLS on the listener (the admin listener stays plain HTTP).
    pub tls: Option<Tls>,
}

struct Upstream {
    client: Client<HttpConnector, Body>,
    base: String,
    timeout: Duration,
    /// Whether clients reach the proxy over TLS (`X-Forwarded-Proto`).
    https: bool,
    /// The largest request body forwarded (`--http-max-body`): 413 above.
    max_body: usize,
}

/// Headers that belong to one hop, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"];

/// Removes the hop-by-hop headers, and the ones the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

fn too_large(max: usize) -> Response {
    tollgate_tower::response::problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than {max} bytes (--http-max-body)"),
    )
}

/// Whether `error` is the body outgrowing its limit.
fn body_too_large(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

fn gateway_error(status: StatusCode) -> Response {
    let detail = if status == StatusCode::GATEWAY_TIMEOUT {
        "the upstream service did not answer in time"
    } else {
        "the upstream service could not be reached"
    };
    tollgate_tower::response::problem(status, detail)
}

async fn forward(
    State(upstream): State<Arc<Upstream>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
) -> Response {
    let declared =
        request.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > upstream.max_body as u64) {
        return too_large(upstream.max_body);
    }
    // The target's authority, when in absolute form: the host the rules matched, forwarded.
    let authority = request.uri().authority().map(|a| a.as_str().rsplit('@').next().unwrap_or_default().to_owned());
    // A request a `route` rule mitigates goes to the rule's quarantine instead.
    let quarantine = request.extensions_mut().remove::<Quarantine>();
    let base = quarantine.as_ref().map_or(upstream.base.as_str(), |q| q.upstream.as_str());
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{base}{path}").parse() else {
        return tollgate_tower::response::problem(StatusCode::BAD_REQUEST, "the request target cannot be forwarded");
    };
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    strip_hop_by_hop(headers);
    if let Some(authority) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
        headers.insert(http::header::HOST, authority);
    }
    // Append the peer: the upstream (and a tollgate behind it) can walk the chain from the right
    // (the chain as received, bytes that are not text included: never dropped).
    let mut forwarded = headers.get("x-forwarded-for").map(|v| v.as_bytes().to_vec()).unwrap_or_default();
    if !forwarded.is_empty() {
        forwarded.extend_from_slice(b", ");
    }
    forwarded.extend_from_slice(peer.ip().to_string().as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&forwarded) {
        headers.insert("x-forwarded-for", value);
    }
    let proto = if upstream.https { "https" } else { "http" };
    headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
    // A body of known length (checked above) streams through; one of unknown length (chunked)
    // is read first, up to the limit, so that none of it reaches the upstream when it is too
    // large (memory: at most --http-max-body per such request in flight).
    let (parts, body) = request.into_parts();
    let body = if axum::body::HttpBody::size_hint(&body).exact().is_some() {
        body
    } else {
        match http_body_util::BodyExt::collect(http_body_util::Limited::new(body, upstream.max_body)).await {
            Ok(collected) => Body::from(collected.to_bytes()),
            Err(error) if body_too_large(&*error) => return too_large(upstream.max_body),
            Err(_) => {
                return tollgate_tower::response::problem(StatusCode::BAD_REQUEST, "the request body was cut short");
            }
        }
    };
    let request = Request::from_parts(parts, body);
    match tokio::time::timeout(upstream.timeout, upstream.client.request(request)).await {
        Ok(Ok(response)) => {
            let mut response = response.map(Body::new);
            strip_hop_by_hop(response.headers_mut());
            response
        }
        Ok(Err(error)) => {
            tracing::warn!(upstream = %base, %error, "upstream failed");
            gateway_error(StatusCode::BAD_GATEWAY)
        }
        Err(_) => {
            tracing::warn!(upstream = %base, timeout = ?upstream.timeout, "upstream timed out");
            gateway_error(StatusCode::GATEWAY_TIMEOUT)
        }
    }
}

/// `GET /v1/rules/{name}/top`: the rule's keys by measured rate, highest first (at most 100):
/// `[{"key", "rate_per_s", "limited"}]`; 404 for a rule the rules in force do not have, 409 for
/// one that does not measure its keys.
async fn top(State(engine): State<Arc<Engine<Arc<Backend>>>>, Path(name): Path<String>) -> Response {
    match engine.top(&name, tollgate_engine::MAX_TOP) {
        Ok(talkers) => {
            let talkers: Vec<_> = talkers
                .into_iter()
                .map(|t| {
                    let rate = (t.rate_per_s * 1000.0).round() / 1000.0;
                    serde_json::json!({ "key": t.key, "rate_per_s": rate, "limited": t.limited })
                })
                .collect();
            axum::Json(talkers).into_response()
        }
        Err(error @ EngineError::NotMeasured(_)) => {
            tollgate_tower::response::problem(StatusCode::CONFLICT, &error.to_string())
        }
        Err(error) => tollgate_tower::response::problem(StatusCode::NOT_FOUND, &error.to_string()),
    }
}

/// Serves the proxy on `listener` and its admin endpoints on `admin` until `shutdown` completes.
pub async fn run(
    config: &Config,
    proxy: ProxyConfig,
    listener: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let latency = crate::backend::latency_histogram();
    let store = Arc::new(crate::backend::open(config, &latency).await?);
    let health = Arc::new(Health::new(config));
    health.probe(&store).await;
    health.watch(Arc::downgrade(&store));
    let mut registry = Registry::with_prefix("tollgate");
    crate::metrics::register_stores(&mut registry, vec![store.clone()], &latency);
    health.register(&mut registry);
    // The proxy forwards what a `route` rule quarantines (see `forward`).
    let engine =
        Arc::new(Engine::builder(store, proxy.rules).clock(config.clock.clone()).routes(true).build(&mut registry));
    if let Some(path) = &proxy.rules_file {
        crate::reload_engine_on_change(&engine, path);
    }
    // A delay never outlasts the listener's request timeout (a 408 would spend the slot for nothing).
    let options = Options { request_timeout: Some(config.http.request_timeout), ..proxy.options };
    let layer = RateLimitLayer::from_engine(engine.clone(), options);
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(proxy.upstream_timeout));
    let upstream = Arc::new(Upstream {
        client: Client::builder(TokioExecutor::new()).build(connector),
        base: proxy.upstream.trim_end_matches('/').to_string(),
        timeout: proxy.upstream_timeout,
        https: proxy.tls.is_some(),
        max_body: config.http.max_body_bytes,
    });
    let (bounds, grace) = (config.http, config.shutdown_grace);
    let app = Router::new()
        .fallback(forward)
        .with_state(upstream)
        .layer(layer)
        .layer(axum::extract::DefaultBodyLimit::max(bounds.max_body_bytes));
    let registry = Arc::new(registry);
    let admin_app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = crate::metrics::render(&registry);
                async move { ([(http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response() }
            }),
        )
        .route("/healthz", get(move || async move { axum::Json(health.report()).into_response() }))
        .route("/v1/rules/{name}/top", get(top))
        .with_state(engine);
    let admin_app =
        crate::http::host::AllowedHosts::new(&config.allowed_hosts, "--admin-allowed-host")?.guard(admin_app);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let proxy_task = tokio::spawn(crate::http::server::serve(listener, app, bounds, grace, stopped.clone(), proxy.tls));
    let admin_task = tokio::spawn(crate::http::server::serve(admin, admin_app, bounds, grace, stopped, None));
    shutdown.await;
    let _ = stop.send(true);
    proxy_task.await.map_err(|e| e.to_string())?;
    admin_task.await.map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_named_by_connection_are_not_forwarded() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("close, x-secret, Keep-Alive"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
    }
}
