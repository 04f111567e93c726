//! Server configuration: listen addresses, the store, the failure policy, every bound on what a
//! client can make the server hold or wait for, and the rules (a `tollgate-rules` file: rules on
//! request characteristics, and named limits, which are rules keyed on the caller's key):
//!
//! ```toml
//! # tollgate.toml
//! [limits.api]              # used as `TG.LIMIT api KEY` or `{"limit_name": "api", ...}`
//! algorithm = "gcra"        # any of the seven; default gcra
//! limit = "100/1m"          # COUNT/PERIOD
//! burst = 20                # bucket family only; default: the count
//!
//! [[rules]]                 # usable by name too when keyed on the caller's key
//! name = "login"
//! algorithm = "sliding-log"
//! limit = "5/15m"
//! key = ["key"]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, SystemClock};
use tollgate_rules::Rules;
use tollgate_store::FailurePolicy;
pub use tollgate_store::configured::StoreConfig;
pub use tollgate_store::memory::{DEFAULT_MAX_KEYS, DEFAULT_MAX_MEMORY};
pub use tollgate_store::redis::target::{RedisTarget, TlsConfig, Topology, redacted};

/// Everything the server needs besides its listeners.
#[derive(Debug, Clone)]
pub struct Config {
    /// The store.
    pub store: StoreConfig,
    /// The failure policy for Redis stores.
    pub on_store_error: FailurePolicy,
    /// Timeout of each Redis call (default 50 ms).
    pub store_timeout: Duration,
    /// Redis: lone checks of the algorithms it decides go to tollgate's native module where it is
    /// loaded.
    pub store_module: bool,
    /// Consecutive Redis failures that open the circuit breaker (default 3).
    pub breaker_threshold: u32,
    /// How often an open breaker probes Redis (default 100 ms).
    pub breaker_probe: Duration,
    /// Leases for hot keys on Redis (default: auto, 100 ms lifetimes, hot above 500/s).
    pub lease: tollgate_store::LeaseOptions,
    /// The rules and named limits (`TG.LIMIT`, HTTP `limit_name`).
    pub rules: Rules,
    /// The file the rules came from: reloaded on SIGHUP and when it changes.
    pub rules_file: Option<PathBuf>,
    /// envoyproxy/ratelimit's YAML configuration, for the gRPC rate-limit service.
    pub envoy: Arc<tollgate_envoy::Config>,
    /// The file or directory it came from: reloaded on SIGHUP and when it changes.
    pub envoy_file: Option<PathBuf>,
    /// Whether Envoy is asked to add `RateLimit-Limit/-Remaining/-Reset` to its responses.
    pub envoy_response_headers: bool,
    /// Timeout of each Redis call made for Envoy's gRPC service (default 10 ms: Envoy gives up
    /// after 20 ms by default), within which the failure policy answers.
    pub grpc_store_timeout: Duration,
    /// RESP bounds.
    pub resp: RespBounds,
    /// HTTP bounds.
    pub http: HttpBounds,
    /// Host names the HTTP API (and `tollgate proxy`'s admin listener) answers besides IP
    /// literals and `localhost` (see `http::host`): `name`, `*.suffix`, or `*` for any.
    pub allowed_hosts: Vec<String>,
    /// gRPC bounds.
    pub grpc: GrpcBounds,
    /// After a shutdown signal, how long connections may take to finish before they are closed
    /// (default 5 s).
    pub shutdown_grace: Duration,
    /// The time of the memory store, the engine (mitigation timeouts) and the failure policy's
    /// local decisions (default: the system clock; tests pass a manual one). Redis decides on
    /// its own time.
    pub clock: Arc<dyn Clock>,
    /// The runtimes RESP and HTTP connections are handed to in turn (`serve --runtime
    /// per-core`); none (the default): served on the runtime that runs the server.
    pub workers: crate::workers::Workers,
}

/// How long a RESP or gRPC connection may stay idle by default: long enough that a client's pool
/// rarely reconnects, short enough that a connection its client forgot gives its slot back.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// What one RESP client can make the server hold or wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RespBounds {
    /// Largest command, in bytes (default 1 MiB).
    pub max_frame_bytes: usize,
    /// Longest inline command (a line typed by hand), in bytes (default 64 KiB, as Redis).
    pub max_inline_bytes: usize,
    /// Most arguments in one command (default 1,024).
    pub max_args: usize,
    /// Most simultaneous connections (default 10,000).
    pub max_connections: usize,
    /// Replies held per connection before they are written out (default 64 KiB): with
    /// `write_timeout`, what a client that does not read can make the server hold.
    pub max_output_bytes: usize,
    /// Longest a reply may take to be written before the connection is closed (a client that
    /// does not read; default 10 s).
    pub write_timeout: Duration,
    /// Close a connection that sends nothing this long (default 5 minutes, as many Redis
    /// deployments' `timeout 300`: the clients' pools reconnect; `None`: never, Redis's own
    /// default).
    pub idle_timeout: Option<Duration>,
}

impl Default for RespBounds {
    fn default() -> Self {
        RespBounds {
            max_frame_bytes: 1 << 20,
            max_inline_bytes: 64 << 10,
            max_args: 1024,
            max_connections: 10_000,
            max_output_bytes: 64 << 10,
            write_timeout: Duration::from_secs(10),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

/// What one HTTP client can make the server hold or wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpBounds {
    /// Longest the request head may take to arrive (slowloris; default 10 s). Also the idle
    /// bound of a kept-alive connection: hyper starts it again as it waits for the next request.
    pub header_read_timeout: Duration,
    /// Longest one request may take, body included (default 10 s): 408 after it.
    pub request_timeout: Duration,
    /// Most simultaneous connections (default 10,000): more are answered 503 and closed.
    pub max_connections: usize,
    /// Largest request body (default 64 KiB): 413 beyond it.
    pub max_body_bytes: usize,
    /// Largest request head (default 64 KiB).
    pub max_header_bytes: usize,
    /// Close a connection whose client accepts no byte of a response for this long (default
    /// 30 s, as nginx's `send_timeout`): a client that pipelines requests and reads nothing
    /// would otherwise hold its connection for ever, since hyper waits on the write, reads no
    /// more, and no timer runs meanwhile.
    pub write_timeout: Duration,
}

impl Default for HttpBounds {
    fn default() -> Self {
        HttpBounds {
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            max_connections: 10_000,
            max_body_bytes: 64 << 10,
            max_header_bytes: 64 << 10,
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// What one gRPC client (Envoy) can make the server hold or wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcBounds {
    /// Most simultaneous connections (default 10,000): more are closed at once.
    pub max_connections: usize,
    /// Most concurrent streams per connection, advertised in the HTTP/2 SETTINGS (default 1,024).
    pub max_concurrent_streams: u32,
    /// Longest a connection may take to send the HTTP/2 preface (default 10 s).
    pub header_read_timeout: Duration,
    /// Longest one request may take (default 10 s): DEADLINE_EXCEEDED after it.
    pub request_timeout: Duration,
    /// Interval of the HTTP/2 keepalive PINGs and of TCP keepalive (default 30 s).
    pub keepalive: Duration,
    /// A keepalive PING unanswered this long closes the connection (default 10 s).
    pub keepalive_timeout: Duration,
    /// Largest request message (default 64 KiB): OUT_OF_RANGE beyond it.
    pub max_message_bytes: usize,
    /// Close a connection that has had no request under way this long, keepalive PINGs or not
    /// (default 5 minutes; `None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for GrpcBounds {
    fn default() -> Self {
        GrpcBounds {
            max_connections: 10_000,
            max_concurrent_streams: 1024,
            header_read_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
            keepalive: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_message_bytes: 64 << 10,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            store: StoreConfig::Memory { max_keys: DEFAULT_MAX_KEYS, max_memory: DEFAULT_MAX_MEMORY },
            on_store_error: FailurePolicy::default(),
            store_timeout: Duration::from_millis(50),
            store_module: false,
            breaker_threshold: tollgate_store::fallback::DEFAULT_THRESHOLD,
            breaker_probe: tollgate_store::fallback::DEFAULT_PROBE_EVERY,
            lease: tollgate_store::LeaseOptions::default(),
            rules: Rules::default(),
            rules_file: None,
            envoy: Arc::default(),
            envoy_file: None,
            envoy_response_headers: false,
            grpc_store_timeout: Duration::from_millis(10),
            resp: RespBounds::default(),
            http: HttpBounds::default(),
            allowed_hosts: Vec::new(),
            grpc: GrpcBounds::default(),
            shutdown_grace: Duration::from_secs(5),
            clock: Arc::new(SystemClock::new()),
            workers: crate::workers::Workers::default(),
        }
    }
}

/// Where the server listens.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// RESP (default 127.0.0.1:6380).
    pub resp: SocketAddr,
    /// HTTP (default 127.0.0.1:8080).
    pub http: SocketAddr,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stores() {
        let StoreConfig::Redis(target) = StoreConfig::parse("redis://h:1").unwrap() else { panic!() };
        assert_eq!(target.redacted(), "redis://h:1");
        let StoreConfig::Redis(target) = StoreConfig::parse("rediss+cluster://u:p@a:1,b:2").unwrap() else { panic!() };
        assert_eq!(target.redacted(), "rediss+cluster://u@a:1,b:2");
        let StoreConfig::Redis(target) = StoreConfig::parse("redis+sentinel://a,b/m").unwrap() else { panic!() };
        assert_eq!(target.redacted(), "redis+sentinel://a:26379,b:26379/m");
        let error = StoreConfig::parse("mongodb://u:secret@x").unwrap_err();
        assert!(error.contains("unknown store") && !error.contains("secret"), "{error}");
    }

    /// Before: RESP and gRPC connections could stay idle for ever by default.
    #[test]
    fn every_listener_has_an_idle_bound_by_default() {
        let five_minutes = Some(Duration::from_secs(300));
        assert_eq!(RespBounds::default().idle_timeout, five_minutes, "RESP");
        assert_eq!(GrpcBounds::default().idle_timeout, five_minutes, "gRPC");
        // HTTP's is the header-read timeout (hyper restarts it for each request's head).
        assert_eq!(HttpBounds::default().header_read_timeout, Duration::from_secs(10), "HTTP");
    }
}
