//! `tollgate serve`: flags to a [`tollgate_server::Config`], listeners bound, signals wired.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use tokio::net::TcpListener;
use tollgate_server::{App, Config, GrpcBounds, HttpBounds, Listeners, RespBounds, StoreConfig};

use crate::units;

/// Arguments of `tollgate serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// RESP address, HOST:PORT (redis-cell's CL.THROTTLE and TG.* commands); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6380", value_parser = units::address)]
    resp: String,
    /// HTTP address, HOST:PORT (POST /v1/check, GET /metrics, GET /healthz); port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080", value_parser = units::address)]
    http: String,
    /// A host name the HTTP listener answers besides IP addresses, localhost and --http's own
    /// (repeatable; *.SUFFIX for every name under one, * for any): any other Host is refused 421,
    /// as a web page reaching the API through DNS rebinding sends its own name.
    #[arg(long, value_name = "NAME", value_parser = tollgate_server::http::host::allowed_name)]
    http_allowed_host: Vec<String>,
    /// gRPC address, HOST:PORT: Envoy's rate-limit service (envoy.service.ratelimit.v3) and
    /// grpc.health.v1; port 0 picks a free port.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081", value_parser = units::address)]
    grpc: String,
    /// envoyproxy/ratelimit's YAML configuration for the gRPC service: a file, or a directory of
    /// *.yaml / *.yml files (one domain each).
    #[arg(long, value_name = "PATH")]
    envoy_config: Option<PathBuf>,
    /// Ask Envoy to add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (of the
    /// descriptor closest to its limit) to its responses, as envoyproxy/ratelimit's
    /// LIMIT_RESPONSE_HEADERS_ENABLED.
    #[arg(long)]
    envoy_response_headers: bool,
    /// With Redis: how long a Redis call made for the gRPC service may take before the failure
    /// policy answers (Envoy gives up after 20 ms by default) [default: 10ms].
    #[arg(long, value_name = "DURATION", value_parser = units::duration)]
    grpc_store_timeout: Option<std::time::Duration>,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
    /// With memory: most keys kept per table (idle keys are evicted first) [default: 1000000].
    #[arg(long, value_name = "N", value_parser = units::positive)]
    max_keys: Option<usize>,
    /// With memory: most bytes the store holds, every algorithm's state included (e.g. 512MiB)
    /// [default: 512MiB].
    #[arg(long, value_name = "SIZE", value_parser = units::bytes)]
    max_memory: Option<usize>,
    /// Rules file: rules on request characteristics and named limits for TG.LIMIT and
    /// limit_name (see docs/rules.md); reloaded on SIGHUP and when it changes.
    #[arg(long, value_name = "FILE", alias = "config")]
    rules: Option<PathBuf>,
    /// Largest RESP command accepted (e.g. 1MiB).
    #[arg(long, value_name = "SIZE", default_value = "1MiB", value_parser = units::bytes)]
    max_frame_bytes: usize,
    /// Longest inline RESP command (a line typed by hand).
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = units::bytes)]
    max_inline_bytes: usize,
    /// Most arguments in one RESP command.
    #[arg(long, value_name = "N", default_value = "1024", value_parser = units::positive)]
    max_args: usize,
    /// Most simultaneous RESP connections.
    #[arg(long, value_name = "N", default_value = "10000", value_parser = units::positive)]
    max_connections: usize,
    /// Replies a RESP connection holds before they are written out (with --write-timeout, what a
    /// client that does not read can make the server hold).
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = units::bytes)]
    max_output_bytes: usize,
    /// Close a RESP connection whose replies cannot be written for this long (a client not reading).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::duration)]
    write_timeout: Duration,
    /// Close a RESP connection that sends nothing this long (0 or never: no bound). Clients'
    /// pools reconnect; Redis's own default is never, many deployments set 300.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = units::timeout)]
    idle_timeout: units::Timeout,
    #[command(flatten)]
    limits: HttpArgs,
    #[command(flatten)]
    grpc_limits: GrpcArgs,
    /// Log filter: error, warn, info, debug, trace or off, or directives such as
    /// `info,tollgate_engine=debug`.
    #[arg(long, value_name = "LEVEL", default_value = "info", value_parser = units::log_filter)]
    log_level: String,
    /// How connections are run: shared (one work-stealing runtime) or per-core (a
    /// single-threaded runtime per worker thread, each RESP and HTTP connection handed to one in
    /// turn, its socket polled there; gRPC runs on the first).
    #[arg(long, value_enum, value_name = "MODEL", default_value = "shared")]
    runtime: crate::runtime::Model,
    /// Worker threads, at most 1024 [default: the cores this process may run on].
    #[arg(long, value_name = "N", value_parser = units::workers)]
    workers: Option<usize>,
}

/// The HTTP listener's bounds, shared by `serve` and `proxy`.
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// Longest an HTTP request head may take to arrive (slowloris); also how long a kept-alive
    /// connection may wait for its next request.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::duration)]
    http_header_timeout: Duration,
    /// Longest one HTTP request may take, body included (then 408).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::duration)]
    http_request_timeout: Duration,
    /// Most simultaneous HTTP connections (more are answered 503 and closed).
    #[arg(long, value_name = "N", default_value = "10000", value_parser = units::positive)]
    http_max_connections: usize,
    /// Close an HTTP connection whose client accepts no byte of a response this long (a client
    /// that pipelines and reads nothing).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = units::duration)]
    http_write_timeout: Duration,
    /// Largest HTTP request body (then 413).
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = units::bytes)]
    http_max_body: usize,
    /// After SIGTERM or Ctrl-C, how long connections may take to finish before they are closed.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = units::duration)]
    pub(crate) shutdown_grace: Duration,
}

/// The gRPC listener's bounds.
#[derive(Debug, Args)]
pub(crate) struct GrpcArgs {
    /// Most simultaneous gRPC connections (more are closed at once).
    #[arg(long, value_name = "N", default_value = "10000", value_parser = units::positive)]
    grpc_max_connections: usize,
    /// Most concurrent requests (HTTP/2 streams) per gRPC connection, advertised in SETTINGS.
    #[arg(long, value_name = "N", default_value = "1024", value_parser = units::positive)]
    grpc_max_streams: usize,
    /// Longest a gRPC connection may take to send its HTTP/2 preface (slowloris).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::duration)]
    grpc_header_timeout: Duration,
    /// Longest one gRPC request may take (then DEADLINE_EXCEEDED).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = units::duration)]
    grpc_request_timeout: Duration,
    /// How often an idle gRPC connection is pinged (HTTP/2 PING); one not answered within 10 s,
    /// or a peer gone (TCP keepalive, the same interval), is closed, as is one that reads
    /// nothing (a write left waiting 10 s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = units::duration)]
    grpc_keepalive: Duration,
    /// Largest gRPC request message, to the rate-limit and the health services (then
    /// OUT_OF_RANGE).
    #[arg(long, value_name = "SIZE", default_value = "64KiB", value_parser = units::bytes)]
    grpc_max_message: usize,
    /// Close a gRPC connection that has had no request under way this long, keepalive PINGs
    /// answered or not (0 or never: no bound); its client connects again when it needs to.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = units::timeout)]
    grpc_idle_timeout: units::Timeout,
}

impl GrpcArgs {
    pub(crate) fn bounds(&self) -> GrpcBounds {
        GrpcBounds {
            max_connections: self.grpc_max_connections,
            max_concurrent_streams: u32::try_from(self.grpc_max_streams).unwrap_or(u32::MAX),
            header_read_timeout: self.grpc_header_timeout,
            request_timeout: self.grpc_request_timeout,
            keepalive: self.grpc_keepalive,
            max_message_bytes: self.grpc_max_message,
            idle_timeout: self.grpc_idle_timeout.0,
            ..GrpcBounds::default()
        }
    }
}

impl HttpArgs {
    pub(crate) fn bounds(&self) -> HttpBounds {
        HttpBounds {
            header_read_timeout: self.http_header_timeout,
            request_timeout: self.http_request_timeout,
            max_connections: self.http_max_connections,
            max_body_bytes: self.http_max_body,
            write_timeout: self.http_write_timeout,
            ..HttpBounds::default()
        }
    }
}

/// Runs the server until Ctrl-C or SIGTERM.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(&args.log_level)?;
    let mut config = args.store.config()?;
    match config.store {
        StoreConfig::Memory { ref mut max_keys, ref mut max_memory } => {
            *max_keys = args.max_keys.unwrap_or(*max_keys);
            *max_memory = args.max_memory.unwrap_or(*max_memory);
        }
        _ if args.max_keys.is_some() || args.max_memory.is_some() => anyhow::bail!(
            "--max-keys and --max-memory bound the memory store; with Redis, bound Redis itself (its maxmemory)"
        ),
        _ => {}
    }
    if let Some(timeout) = args.grpc_store_timeout {
        if matches!(config.store, StoreConfig::Memory { .. }) {
            anyhow::bail!(
                "--grpc-store-timeout applies to a Redis store only (the memory store never waits): remove it, or \
                 choose Redis with --store redis://host:port"
            );
        }
        config.grpc_store_timeout = timeout;
    }
    let rules = match &args.rules {
        Some(path) => tollgate_rules::Rules::load(path).map_err(anyhow::Error::msg)?,
        None => tollgate_rules::Rules::default(),
    };
    let envoy = match &args.envoy_config {
        Some(path) => tollgate_envoy::Config::load(path).map_err(|e| anyhow::anyhow!("--envoy-config: {e}"))?,
        None => tollgate_envoy::Config::default(),
    };
    let config = Config {
        rules,
        rules_file: args.rules.clone(),
        envoy: Arc::new(envoy),
        envoy_file: args.envoy_config.clone(),
        envoy_response_headers: args.envoy_response_headers,
        resp: RespBounds {
            max_frame_bytes: args.max_frame_bytes,
            max_inline_bytes: args.max_inline_bytes,
            max_args: args.max_args,
            max_connections: args.max_connections,
            max_output_bytes: args.max_output_bytes,
            write_timeout: args.write_timeout,
            idle_timeout: args.idle_timeout.0,
        },
        http: args.limits.bounds(),
        allowed_hosts: allowed_hosts(&args.http, &args.http_allowed_host),
        grpc: args.grpc_limits.bounds(),
        shutdown_grace: args.limits.shutdown_grace,
        ..config
    };
    let workers = args.workers.unwrap_or_else(crate::runtime::default_workers);
    crate::runtime::run(args.runtime, workers, |workers| async move {
        let config = Config { workers, ..config };
        // The store first: one that cannot be opened is reported before anything listens.
        let app = Arc::new(App::new(&config).await.map_err(anyhow::Error::msg)?);
        let resp = bind(&args.resp, "--resp").await?;
        let http = bind(&args.http, "--http").await?;
        let grpc = bind(&args.grpc, "--grpc").await?;
        tracing::info!(store = %config.store.describe(), "RESP listening on {}", resp.local_addr()?);
        tracing::info!("HTTP listening on {}", http.local_addr()?);
        tracing::info!("gRPC (Envoy rate-limit service) listening on {}", grpc.local_addr()?);
        tollgate_server::serve(app, config, Listeners { resp, http, grpc: Some(grpc) }, shutdown_signal())
            .await
            .map_err(anyhow::Error::msg)
    })
}

/// The names a control-plane listener on `address` answers (see `tollgate_server::http::host`):
/// `names`, and the listener's own host when `address` names it (`tollgate.internal:8080`).
pub(crate) fn allowed_hosts(address: &str, names: &[String]) -> Vec<String> {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let own = (!host.starts_with('[') && host.parse::<std::net::IpAddr>().is_err())
        .then(|| tollgate_server::http::host::allowed_name(host).ok())
        .flatten();
    names.iter().cloned().chain(own).collect()
}

/// Binds `address` (a host name resolves to its addresses, tried in turn), naming `flag` when
/// it cannot.
pub(crate) async fn bind(address: &str, flag: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(address).await.with_context(|| format!("{flag} {address}: cannot listen there"))
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
