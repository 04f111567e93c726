//! # tollgate-server
//!
//! The server behind `tollgate serve`, as a library: [`run`] serves RESP (a drop-in for
//! redis-cell's `CL.THROTTLE`, plus tollgate's own `TG.*` commands) and HTTP (JSON decisions,
//! Prometheus metrics) over any tollgate store, until a shutdown future completes. Tests start it
//! on port 0; the binary only parses flags.

pub mod app;
pub mod backend;
pub mod config;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod grpc;
pub mod health;
pub mod http;
mod listener;
pub mod metrics;
pub mod proxy;
pub mod resp;
pub mod workers;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_engine::reload::PolicyFile;

pub use app::App;
pub use config::{Config, GrpcBounds, HttpBounds, RedisTarget, RespBounds, StoreConfig, TlsConfig, Topology};
pub use tollgate_store::{FailurePolicy, LeaseMode, LeaseOptions};
pub use workers::Workers;

/// The sockets the server answers on (bound by the caller, so that port 0 works).
#[derive(Debug)]
pub struct Listeners {
    /// RESP clients.
    pub resp: TcpListener,
    /// HTTP clients.
    pub http: TcpListener,
    /// Envoy's rate-limit service (gRPC), when served.
    pub grpc: Option<TcpListener>,
}

/// Serves until `shutdown` completes, then stops accepting, answers what was already received
/// (for at most `config.shutdown_grace`; connections still open then are closed), and returns.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let app = Arc::new(App::new(&config).await?);
    serve(app, config, listeners, shutdown).await
}

/// [`run`] with the app already made: the binary opens the store before it binds a listener, so
/// that a store that cannot be opened is reported before anything says "listening".
pub async fn serve(
    app: Arc<App>,
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    reload_on_change(&app, &config);
    let (stop, stopped) = watch::channel(false);
    let grace = config.shutdown_grace;
    let workers = config.workers.clone();
    let resp =
        tokio::spawn(resp::serve(listeners.resp, app.clone(), config.resp, grace, stopped.clone(), workers.clone()));
    let hosts = http::host::AllowedHosts::new(&config.allowed_hosts, "--http-allowed-host")?;
    let router = hosts.guard(http::router(app.clone(), config.http.max_body_bytes));
    let options = http::server::ListenerOptions { workers, ..http::server::ListenerOptions::default() };
    let http = tokio::spawn(http::server::serve_with(
        listeners.http,
        router,
        config.http,
        grace,
        stopped.clone(),
        None,
        options,
    ));
    let grpc = listeners.grpc.map(|listener| {
        tokio::spawn(grpc::serve(
            listener,
            app.engine.clone(),
            config.envoy_response_headers,
            config.grpc,
            config.shutdown_grace,
            stopped,
        ))
    });
    shutdown.await;
    tracing::info!("shutting down: answering in-flight requests");
    let _ = stop.send(true);
    resp.await.map_err(|e| format!("RESP listener: {e}"))?;
    http.await.map_err(|e| format!("HTTP listener: {e}"))?;
    if let Some(grpc) = grpc {
        grpc.await.map_err(|e| format!("gRPC listener: {e}"))??;
    }
    Ok(())
}

/// Reloads the policy's files (the rules file, Envoy's configuration) when they change (polled
/// every second) and on SIGHUP; a file that does not load keeps the policy in force.
pub fn reload_on_change(app: &Arc<App>, config: &Config) {
    let rules = config.rules_file.iter().map(|path| PolicyFile::Rules(path.clone()));
    let envoy = config.envoy_file.iter().map(|path| PolicyFile::Envoy(path.clone()));
    reload_engine_on_change(&app.engine, rules.chain(envoy).collect());
}

/// [`reload_on_change`] for any engine and files (the proxy's rules too).
pub fn reload_engine_on_change<S: tollgate_store::Store + 'static>(
    engine: &Arc<tollgate_engine::Engine<S>>,
    files: Vec<PolicyFile>,
) {
    if files.is_empty() {
        return;
    }
    let watcher = tollgate_engine::reload::watch(engine, files, tollgate_engine::reload::DEFAULT_POLL);
    #[cfg(unix)]
    {
        let engine = Arc::downgrade(engine);
        tokio::spawn(async move {
            let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
                return;
            };
            // The watching task reloads on the signal: one task reloads, and it takes the
            // files' versions as seen, so the next poll does not reload the same edit again.
            while hangups.recv().await.is_some() {
                if engine.strong_count() == 0 {
                    return;
                }
                watcher.reload_all();
            }
        });
    }
    #[cfg(not(unix))]
    drop(watcher);
}
