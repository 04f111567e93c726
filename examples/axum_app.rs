//! An axum app behind tollgate's middleware with two rules: 100 requests a minute per client IP
//! on the API (429 beyond, RateLimit fields on every response), and a login defence against
//! password guessing (failed logins counted per IP; 5 a minute, then 60 s of 429 for that IP).
//!
//! `cargo run -p tollgate-tower --example axum_app [-- ADDR]` (default `127.0.0.1:3000`; port 0
//! picks a free one), then `curl -i localhost:3000/api/hello`. It is also an upstream for
//! `tollgate proxy --upstream http://127.0.0.1:3000`.

use std::net::SocketAddr;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tollgate_rules::Rules;
use tollgate_store::MemoryStore;
use tollgate_tower::{Options, RateLimitLayer};

const RULES: &str = r#"
[[rules]]
name = "api"
limit = "100/1m"
key = ["client_ip"]
match = { path_prefix = "/api/" }

[[rules]]
name = "login-failures"
limit = "5/1m"
algorithm = "sliding-log"
key = ["client_ip"]
count_status = [401]
match = { method = "POST", path = "/login" }
[rules.mitigation]
match = {}
timeout = "60s"
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = Rules::parse(RULES, "examples/axum_app.rs")?;
    let layer = RateLimitLayer::with_options(
        rules,
        MemoryStore::new(),
        Options { headers_on_allowed: true, ..Options::default() },
    );
    let app = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer);
    let address = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener =
        tokio::net::TcpListener::bind(&address).await.map_err(|e| format!("cannot listen on {address}: {e}"))?;
    println!("listening on {}", listener.local_addr()?);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
    Ok(())
}
