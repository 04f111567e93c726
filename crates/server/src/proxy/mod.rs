//! `tollgate proxy`: a reverse proxy applying a rules file (through `tollgate-engine`, by the
//! `tollgate-tower` middleware) in front of any HTTP/1.1 service, with `/metrics`, `/healthz` and
//! `/v1/rules/{name}/top` (a rule's keys by measured rate) on a separate admin listener so that
//! the upstream's own paths stay untouched.
//!
//! Its listener may terminate TLS (the ClientHello fingerprinted for `ja3`/`ja4`, see
//! `http::tls`); requests a `route` rule mitigates go to that rule's quarantine upstream.
//!
//! What reaches the upstream is exactly what was rated: `inbound` shapes each request before
//! the rules see it (refusing what an upstream could read otherwise, owning the forwarding
//! headers), and `upstream` forwards it unchanged, framed by the proxy, over upstream
//! connections that belong to one client connection each. Bounded like `serve`'s HTTP listener
//! (header-read timeout, connection cap, body limit), and beyond it: a write timeout, a cap on
//! one client address's connections, a longest request target, and each phase on its own clock
//! (the client's body: the request timeout, 408; the upstream: `--upstream-timeout`, 504). The
//! rules are reloaded on SIGHUP and when their file changes.

mod body;
mod inbound;
mod upstream;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{Method, StatusCode};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tollgate_edge as edge;
use tollgate_engine::{Engine, EngineError};
use tollgate_rules::Rules;
use tollgate_tower::{Options, RateLimitLayer};

use crate::backend::Backend;
use crate::config::Config;
use crate::health::Health;
use crate::http::held::PerClient;
use crate::http::server::ListenerOptions;
use crate::http::tls::Tls;

/// Where to forward, and what to apply.
#[derive(Debug)]
pub struct ProxyConfig {
    /// The upstream base URL, e.g. `http://127.0.0.1:3000` (a path is put before every
    /// forwarded path).
    pub upstream: String,
    /// The rules.
    pub rules: Rules,
    /// The rules' file, reloaded on SIGHUP and when it changes.
    pub rules_file: Option<PathBuf>,
    /// Header options of the middleware.
    pub options: Options,
    /// Longest the upstream may take to accept a connection, to take each piece of a request
    /// body, to answer once the request is sent, and to pause its body (default 30 s): 504.
    pub upstream_timeout: Duration,
    /// Terminate TLS on the listener (the admin listener stays plain HTTP).
    pub tls: Option<Tls>,
    /// What one client can hold or send, beyond the listener's `HttpBounds`.
    pub limits: ProxyLimits,
}

/// What one client of the proxy can hold or send, beyond the listener's `HttpBounds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Most connections one client address holds at once (an IPv6 client: its /64; default
    /// 256); a trusted proxy's are not counted. Those beyond: 429 and closed.
    pub max_connections_per_client: usize,
    /// GET, HEAD, DELETE or TRACE requests whose body is forwarded rather than refused (400),
    /// each on an upstream connection of its own (default: none).
    pub bodies_allowed_on: Vec<Method>,
    /// Longest request target, path and query (default 8 KiB, as nginx's request line): 414.
    pub max_target_bytes: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits { max_connections_per_client: 256, bodies_allowed_on: Vec::new(), max_target_bytes: 8 << 10 }
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
            edge::http::problem(StatusCode::CONFLICT, &error.to_string()).map(Body::from)
        }
        Err(error) => edge::http::problem(StatusCode::NOT_FOUND, &error.to_string()).map(Body::from),
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
    let base = upstream::Target::parse(&proxy.upstream).map_err(|error| format!("--upstream: {error}"))?;
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
        crate::reload_engine_on_change(&engine, vec![tollgate_engine::reload::PolicyFile::Rules(path.clone())]);
    }
    // A delay never outlasts the listener's request timeout: past it, a 429 at once rather than
    // a wait the client may not sit out.
    let options = Options { request_timeout: Some(config.http.request_timeout), ..proxy.options };
    let layer = RateLimitLayer::from_engine(engine.clone(), options);
    // Its shadow-ban fakes' metrics (`tollgate_shadow_ban_*`) beside the engine's.
    layer.register_metrics(&mut registry);
    let upstream = Arc::new(upstream::Upstream { base, timeout: proxy.upstream_timeout });
    let (bounds, grace) = (config.http, config.shutdown_grace);
    let limits = proxy.limits;
    let shaping = Arc::new(inbound::Inbound {
        engine: engine.clone(),
        https: proxy.tls.is_some(),
        bodies_allowed_on: limits.bodies_allowed_on.clone(),
        max_target_bytes: limits.max_target_bytes,
        max_body: bounds.max_body_bytes,
        request_timeout: bounds.request_timeout,
    });
    // The rules run on the request as `inbound` shaped it: what the upstream will receive.
    let app = Router::new()
        .fallback(upstream::forward)
        .with_state(upstream)
        .layer(layer)
        .layer(axum::middleware::from_fn_with_state(shaping, inbound::inbound));
    let trusted = engine.clone();
    let listening = ListenerOptions {
        per_client: Some(PerClient {
            max: limits.max_connections_per_client,
            exempt: Arc::new(move |peer| trusted.current().rules.trusted_proxies.trusts(peer)),
        }),
        app_times_requests: true,
        per_connection: Some(Arc::new(|| {
            let mut extensions = http::Extensions::new();
            extensions.insert(upstream::Dedicated::default());
            extensions
        })),
        workers: crate::workers::Workers::default(),
    };
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
    let proxy_task = tokio::spawn(crate::http::server::serve_with(
        listener,
        app,
        bounds,
        grace,
        stopped.clone(),
        proxy.tls,
        listening,
    ));
    let admin_task = tokio::spawn(crate::http::server::serve(admin, admin_app, bounds, grace, stopped, None));
    shutdown.await;
    let _ = stop.send(true);
    proxy_task.await.map_err(|e| e.to_string())?;
    admin_task.await.map_err(|e| e.to_string())?;
    Ok(())
}
