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

pub use config::{Config, OnStoreError, StoreConfig};
pub use engine::Engine;

/// The sockets the server answers on (bound by the caller, so that port 0 works).
#[derive(Debug)]
pub struct Listeners {
    /// RESP clients.
    pub resp: TcpListener,
    /// HTTP clients.
    pub http: TcpListener,
}

/// Serves until `shutdown` completes, then stops accepting, answers what was already received,
/// and returns.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let engine = Arc::new(Engine::new(&config).await?);
    let (stop, stopped) = watch::channel(false);
    let bounds = resp::frame::Bounds { max_frame_bytes: config.max_frame_bytes, max_args: config.max_args };
    let resp =
        tokio::spawn(resp::serve(listeners.resp, engine.clone(), bounds, config.max_connections, stopped.clone()));
    let mut http_stopped = stopped.clone();
    let http = tokio::spawn(
        axum::serve(listeners.http, http::router(engine.clone()))
            .with_graceful_shutdown(async move {
                let _ = http_stopped.wait_for(|&stop| stop).await;
            })
            .into_future(),
    );
    shutdown.await;
    tracing::info!("shutting down: answering in-flight requests");
    let _ = stop.send(true);
    resp.await.map_err(|e| format!("RESP listener: {e}"))?;
    http.await.map_err(|e| format!("HTTP listener: {e}"))?.map_err(|e| format!("HTTP listener: {e}"))?;
    Ok(())
}
