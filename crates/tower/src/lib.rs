//! # tollgate-tower
//!
//! tower middleware (works with axum and hyper): the HTTP front end of `tollgate-engine`,
//! applying a `tollgate-rules` file with any tollgate store:
//!
//! - requests over a limit get `429` with `Retry-After` (whole seconds, rounded up, at least 1),
//!   `RateLimit-Policy` / `RateLimit` (IETF httpapi draft), optional legacy `X-RateLimit-*`,
//!   `Cache-Control: no-store` and an RFC 9457 `application/problem+json` body;
//! - `shadow-ban` answers a configured fake success without calling the service, with the
//!   headers and latency of the route's real responses (learned: see [`shadow`]), `dry-run` only
//!   logs and counts, `delay` waits for the request's slot (up to `max_delay`, never past
//!   [`Options::request_timeout`]: a later slot is a 429 at once);
//! - rules with `count_status` count after the response (e.g. only failed logins): a request
//!   whose client left while the service answered counts the status the service goes on to
//!   answer, one that comes to no status (the service failed or panicked) is refunded, and one
//!   refused only by the requests in flight holds nothing; a mitigation
//!   `timeout` keeps a key mitigated after it went over;
//! - rules whose cost is read from the response (LLM tokens: `cost =
//!   "response.usage.total_tokens"`) reserve an estimate and settle it as the response's body
//!   passes through, JSON or a server-sent events stream (OpenAI, Anthropic; see [`usage`]);
//! - the client address is the peer's (`ConnectInfo<SocketAddr>` with axum, or a [`PeerAddr`]
//!   extension), read through trusted proxies only; the TLS fingerprints `ja3`/`ja4` are the
//!   connection's ([`TlsFingerprint`] extension) or a trusted proxy's headers;
//! - `route` rules pass their over-limit requests on with a [`Quarantine`] extension (with
//!   [`Options::routes`]; `tollgate proxy` forwards them to the quarantine upstream), or 429.
//!
//! Split as tower's own middleware: [`layer`], [`service`], [`future`]. The decisions, metrics and
//! reloads are the engine's ([`Engine`]), and so are the header fields and bodies it answers with
//! (`tollgate_edge::http`, shared with `tollgate serve`'s HTTP API and `tollgate proxy`).
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate_rules::Rules;
//! use tollgate_store::MemoryStore;
//! use tollgate_tower::RateLimitLayer;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let rules = Rules::parse("[[rules]]\nname = \"api\"\nlimit = \"100/1m\"\nkey = [\"client_ip\"]\n", "inline")?;
//! let app = Router::new().route("/", get(|| async { "hello" })).layer(RateLimitLayer::new(rules, MemoryStore::new()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(()) }
//! ```

pub mod future;
pub mod layer;
mod options;
pub mod service;
pub mod shadow;
pub mod usage;

pub use layer::RateLimitLayer;
pub use options::Options;
pub use service::{PeerAddr, Quarantine, RateLimit, TlsFingerprint};
pub use tollgate_engine::Engine;
