//! # tollgate-server
//!
//! The server behind `tollgate serve`, as a library: [`run`] serves RESP (a drop-in for
//! redis-cell's `CL.THROTTLE`, plus tollgate's own `TG.*` commands) and HTTP (JSON decisions,
//! Prometheus metrics) over any tollgate store, until a shutdown future completes. Tests start it
//! on port 0; the binary only parses flags.

pub mod backend;
pub mod config;
pub mod engine;
pub mod http;
pub mod metrics;
pub mod proxy;
pub mod resp;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Config, HttpBounds, OnStoreError, RespBounds, StoreConfig};
pub use engine::Engine;

/// The sockets the server answers on (bound by the caller, so that port 0 works).
#[derive(Debug)]
pub struct Listeners {
    /// RESP clients.
    pub resp: TcpListener,
    /// HTTP clients.
    pub http: TcpListener,
}

/// Serves until `shutdown` completes, then stops accepting, answers what was already received
/// (for at most `config.shutdown_grace`; connections still open then are closed), and returns.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let engine = Arc::new(Engine::new(&config).await?);
    let (stop, stopped) = watch::channel(false);
    let grace = config.shutdown_grace;
    let resp = tokio::spawn(resp::serve(listeners.resp, engine.clone(), config.resp, grace, stopped.clone()));
    let router = http::router(engine.clone(), config.http.max_body_bytes);
    let http = tokio::spawn(http::server::serve(listeners.http, router, config.http, grace, stopped));
    shutdown.await;
    tracing::info!("shutting down: answering in-flight requests");
    let _ = stop.send(true);
    resp.await.map_err(|e| format!("RESP listener: {e}"))?;
    http.await.map_err(|e| format!("HTTP listener: {e}"))?;
    Ok(())
}
