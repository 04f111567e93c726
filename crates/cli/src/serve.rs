//! `tollgate serve`: flags to a [`tollgate_server::Config`], listeners bound, signals wired.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tollgate_server::{Config, Listeners, StoreConfig};

/// Arguments of `tollgate serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// RESP address (redis-cell's CL.THROTTLE and TG.* commands); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6380")]
    resp: SocketAddr,
    /// HTTP address (POST /v1/check, GET /metrics, GET /healthz); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
    /// With memory: most keys kept per table (idle keys are evicted first).
    #[arg(long, value_name = "N", default_value_t = tollgate_server::config::DEFAULT_MAX_KEYS)]
    max_keys: usize,
    /// TOML file of named limits (see the README).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Largest RESP command accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    max_frame_bytes: usize,
    /// Most arguments in one RESP command.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_args: usize,
    /// Most simultaneous RESP connections.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    max_connections: usize,
    /// Log filter: error, warn, info, debug, trace (or a tracing directive).
    #[arg(long, value_name = "LEVEL", default_value = "info")]
    log_level: String,
}

/// Runs the server until Ctrl-C or SIGTERM.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(&args.log_level)?;
    let mut config = args.store.config();
    if let StoreConfig::Memory { .. } = config.store {
        config.store = StoreConfig::Memory { max_keys: args.max_keys.max(1) };
    }
    let limits = match &args.config {
        Some(path) => tollgate_server::config::load_limits(path).map_err(anyhow::Error::msg)?,
        None => Default::default(),
    };
    let config = Config {
        limits,
        max_frame_bytes: args.max_frame_bytes.max(64),
        max_args: args.max_args.max(1),
        max_connections: args.max_connections.max(1),
        ..config
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let resp = TcpListener::bind(args.resp).await.with_context(|| format!("cannot listen on {}", args.resp))?;
        let http = TcpListener::bind(args.http).await.with_context(|| format!("cannot listen on {}", args.http))?;
        tracing::info!(store = ?config.store, "RESP listening on {}", resp.local_addr()?);
        tracing::info!("HTTP listening on {}", http.local_addr()?);
        tollgate_server::run(config, Listeners { resp, http }, shutdown_signal()).await.map_err(anyhow::Error::msg)
    })
}

/// Logs to stderr through `level` (colours only on a terminal).
pub(crate) fn init_logging(level: &str) -> anyhow::Result<()> {
    let filter =
        tracing_subscriber::EnvFilter::try_new(level).with_context(|| format!("invalid --log-level {level:?}"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
