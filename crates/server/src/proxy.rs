//! `tollgate proxy`: a reverse proxy applying a rules file (`tollgate-rules`, through the
//! `tollgate-tower` middleware) in front of any HTTP/1.1 service, with `/metrics` and `/healthz`
//! on a separate admin listener so that the upstream's own paths stay untouched.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{HeaderValue, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_tower::{Options, RateLimitLayer};

use crate::backend::Backend;
use crate::config::Config;

/// Where to forward, and what to apply.
#[derive(Debug)]
pub struct ProxyConfig {
    /// The upstream base URL, e.g. `http://127.0.0.1:3000`.
    pub upstream: String,
    /// The rules.
    pub rules: Rules,
    /// Header options of the middleware.
    pub options: Options,
}

struct Upstream {
    client: Client<HttpConnector, Body>,
    base: String,
}

/// Headers that belong to one hop, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 7] =
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization"];

async fn forward(
    State(upstream): State<Arc<Upstream>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
) -> Response {
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{}{path}", upstream.base).parse() else {
        return (StatusCode::BAD_REQUEST, "request target cannot be forwarded").into_response();
    };
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    // Append the peer: the upstream (and a tollgate behind it) can walk the chain from the right.
    let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(chain) => format!("{chain}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded) {
        headers.insert("x-forwarded-for", value);
    }
    match upstream.client.request(request).await {
        Ok(response) => response.map(Body::new),
        Err(error) => {
            tracing::warn!(%error, "upstream failed");
            (StatusCode::BAD_GATEWAY, format!("upstream {} failed: {error}\n", upstream.base)).into_response()
        }
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
    let store = Backend::open(config).await?;
    let layer = RateLimitLayer::with_options(proxy.rules, store, proxy.options);
    let upstream = Arc::new(Upstream {
        client: Client::builder(TokioExecutor::new()).build_http(),
        base: proxy.upstream.trim_end_matches('/').to_string(),
    });
    let app = Router::new().fallback(forward).with_state(upstream).layer(layer.clone());
    let metrics = layer.clone();
    let admin_app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = metrics.render_metrics();
                async move { text }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (bounds, grace) = (config.http, config.shutdown_grace);
    let app = app.layer(axum::extract::DefaultBodyLimit::max(bounds.max_body_bytes));
    let proxy_task = tokio::spawn(crate::http::server::serve(listener, app, bounds, grace, stopped.clone()));
    let admin_task = tokio::spawn(crate::http::server::serve(admin, admin_app, bounds, grace, stopped));
    shutdown.await;
    let _ = stop.send(true);
    proxy_task.await.map_err(|e| e.to_string())?;
    admin_task.await.map_err(|e| e.to_string())?;
    Ok(())
}
