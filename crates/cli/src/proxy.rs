//! `tollgate proxy`: flags to a [`tollgate_server::proxy::ProxyConfig`], listeners bound, signals wired.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Arguments of `tollgate proxy`.
#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// Where clients connect, HOST:PORT.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8088", value_parser = crate::units::address)]
    listen: String,
    /// The service to protect, e.g. http://127.0.0.1:3000.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// The rules file (TOML; see examples/rules/login.toml).
    #[arg(long, value_name = "FILE")]
    rules: PathBuf,
    /// Admin listener for GET /metrics, GET /healthz and GET /v1/rules/NAME/top, HOST:PORT.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9091", value_parser = crate::units::address)]
    admin: String,
    /// A host name the admin listener answers besides IP addresses, localhost and --admin's own
    /// (repeatable; *.SUFFIX for every name under one, * for any): any other Host is refused 421.
    #[arg(long, value_name = "NAME", value_parser = tollgate_server::http::host::allowed_name)]
    admin_allowed_host: Vec<String>,
    #[command(flatten)]
    store: crate::store_args::StoreArgs,
    #[command(flatten)]
    http: crate::serve::HttpArgs,
    /// Also send the RateLimit fields on allowed responses.
    #[arg(long)]
    headers_on_allowed: bool,
    /// Also send the legacy X-RateLimit-Limit/Remaining/Reset headers.
    #[arg(long)]
    legacy_headers: bool,
    /// Most shadow-ban fakes waiting at once for their route's latency; the others are answered
    /// at once (0: every fake at once).
    #[arg(long, value_name = "N", default_value_t = tollgate_tower::shadow::DEFAULT_MAX_WAITING)]
    shadow_ban_max_waiting: usize,
    /// Terminate TLS on --listen with this PEM certificate chain (leaf first); needs --tls-key.
    /// The rules can then key on the client's TLS fingerprints, ja3 and ja4.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Longest the upstream may take to accept a connection, to take each piece of a request
    /// body, to answer once the request is sent, and to pause its body (then 504).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::units::duration)]
    upstream_timeout: std::time::Duration,
    /// Most connections one client address holds at once (an IPv6 client: its /64; a trusted
    /// proxy's are not counted); more are answered 429 and closed.
    #[arg(long, value_name = "N", default_value = "256", value_parser = crate::units::positive)]
    http_max_connections_per_client: usize,
    /// Longest request target, path and query (then 414).
    #[arg(long, value_name = "SIZE", default_value = "8KiB", value_parser = crate::units::bytes)]
    http_max_target: usize,
    /// Forward a body on these methods (of GET, HEAD, DELETE, TRACE; comma-separated) rather
    /// than refuse it (400), each such request on an upstream connection of its own: only for
    /// an upstream that reads those bodies (Elasticsearch's GET _search).
    #[arg(long, value_name = "METHODS", value_delimiter = ',', value_parser = body_method)]
    allow_body_on: Vec<http::Method>,
    /// Log filter: error, warn, info, debug, trace or off, or directives such as
    /// `info,tollgate_engine=debug`.
    #[arg(long, value_name = "LEVEL", default_value = "info", value_parser = crate::units::log_filter)]
    log_level: String,
}

/// A method `--allow-body-on` may name: one that carries no body by convention.
fn body_method(text: &str) -> Result<http::Method, String> {
    match text.trim().to_ascii_uppercase().as_str() {
        "GET" => Ok(http::Method::GET),
        "HEAD" => Ok(http::Method::HEAD),
        "DELETE" => Ok(http::Method::DELETE),
        "TRACE" => Ok(http::Method::TRACE),
        _ => Err(format!(
            "{text:?}: give GET, HEAD, DELETE or TRACE (other methods' bodies are always forwarded; CONNECT is refused)"
        )),
    }
}

/// Runs the proxy until Ctrl-C or SIGTERM.
pub(crate) fn run(args: ProxyArgs) -> anyhow::Result<()> {
    crate::serve::init_logging(&args.log_level)?;
    let rules = tollgate_rules::Rules::load(&args.rules).map_err(anyhow::Error::msg)?;
    if let Some(db) = &rules.asn_db {
        tracing::info!(asn_db = %db.describe(), "ASN database loaded");
    }
    if args.upstream.contains('@') {
        anyhow::bail!("--upstream carries no user or password: give http://host[:port][/prefix]");
    }
    if !args.upstream.starts_with("http://") {
        anyhow::bail!("--upstream must be an http:// URL, got {:?}", args.upstream);
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tollgate_server::http::tls::Tls::load(cert, key).map_err(anyhow::Error::msg)?),
        _ => None,
    };
    let fingerprinted = rules.rules.iter().filter(|r| {
        r.key.iter().any(|k| matches!(k, tollgate_rules::Characteristic::Ja3 | tollgate_rules::Characteristic::Ja4))
    });
    if tls.is_none() && rules.fingerprint_headers == tollgate_rules::FingerprintHeaders::default() {
        for rule in fingerprinted {
            tracing::warn!(
                rule = %rule.name,
                "the rule keys on ja3/ja4, but there is neither --tls-cert nor ja3_header/ja4_header: \
                 no request has a fingerprint, so it applies to none (on_missing) or shares one key"
            );
        }
    }
    let config = tollgate_server::Config {
        http: args.http.bounds(),
        allowed_hosts: crate::serve::allowed_hosts(&args.admin, &args.admin_allowed_host),
        shutdown_grace: args.http.shutdown_grace,
        ..args.store.config()?
    };
    let proxy = tollgate_server::proxy::ProxyConfig {
        upstream: args.upstream,
        rules,
        rules_file: Some(args.rules.clone()),
        upstream_timeout: args.upstream_timeout,
        tls,
        limits: tollgate_server::proxy::ProxyLimits {
            max_connections_per_client: args.http_max_connections_per_client,
            bodies_allowed_on: args.allow_body_on,
            max_target_bytes: args.http_max_target,
        },
        options: tollgate_tower::Options {
            headers_on_allowed: args.headers_on_allowed,
            legacy_headers: args.legacy_headers,
            shadow_ban_max_waiting: args.shadow_ban_max_waiting,
            // The proxy routes whatever the rules quarantine.
            routes: true,
            // Its own: `proxy::run` gives the listener's request timeout.
            ..Default::default()
        },
    };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async move {
        let listener = crate::serve::bind(&args.listen, "--listen").await?;
        let admin = crate::serve::bind(&args.admin, "--admin").await?;
        let tls = proxy.tls.is_some();
        tracing::info!(upstream = %proxy.upstream, tls, "proxy listening on {}", listener.local_addr()?);
        tracing::info!("admin (metrics, healthz) listening on {}", admin.local_addr()?);
        tollgate_server::proxy::run(&config, proxy, listener, admin, crate::serve::shutdown_signal())
            .await
            .map_err(anyhow::Error::msg)
    })
}
