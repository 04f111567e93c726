//! Two `tollgate proxy` nodes on one real `redis-server` hold a client as one node does (issue 36
//! item 6): the login defence of `examples/rules/login.toml` ("every request from that IP gets
//! 429 for 60 s") puts the client over on node A; node B, which never saw it over, answers its
//! next request 429 with the rest of the hold as `Retry-After`, and so does a node started
//! afterwards (a restart).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use common::proxy::{Proxy, curl};
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

/// An upstream refusing every login (401) and answering everything else 200, counting its
/// requests.
async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let (a, b) = (hits.clone(), hits.clone());
    let app = Router::new()
        .route(
            "/login",
            post(move || {
                a.fetch_add(1, Ordering::Relaxed);
                async { StatusCode::UNAUTHORIZED }
            }),
        )
        .route(
            "/",
            get(move || {
                b.fetch_add(1, Ordering::Relaxed);
                async { "home" }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, hits)
}

/// A node: `tollgate proxy` with `examples/rules/login.toml` on the Redis at `redis`.
async fn node(redis: &str, upstream: SocketAddr) -> Proxy {
    let rules =
        Rules::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml")).unwrap();
    let proxy = ProxyConfig {
        upstream: format!("http://{upstream}"),
        rules,
        rules_file: None,
        options: Default::default(),
        upstream_timeout: Duration::from_secs(30),
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(Config { store: StoreConfig::redis(redis), ..Config::default() }, proxy).await
}

/// curl `path` on `node` as the client `ip` (`POST` for `/login`): its status and `Retry-After`.
async fn ask(node: &Proxy, path: &str, ip: &str) -> (u16, Option<u64>) {
    let mut args = vec![node.url(path), "-H".into(), format!("X-Forwarded-For: {ip}")];
    if path == "/login" {
        args.extend(["-X".into(), "POST".into()]);
    }
    let (status, text) = curl(args).await;
    let retry = text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after").then(|| value.trim().parse().ok())?
    });
    (status, retry)
}

/// Before: node B answered the held client 200 (the hold lived only in node A's process), and so
/// did a node started afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_hold_a_client_as_one() {
    let redis = RedisServer::start();
    let (up, hits) = upstream().await;
    let (a, b) = (node(&redis.url(), up).await, node(&redis.url(), up).await);
    let client = "198.51.100.7";
    for _ in 0..5 {
        assert_eq!(ask(&a, "/login", client).await.0, 401);
    }
    let (status, retry) = ask(&a, "/login", client).await;
    assert_eq!((status, retry), (429, Some(60)), "the sixth failure puts the client over on node A");
    let before = hits.load(Ordering::Relaxed);

    // Node B never counted this client: the hold reaches it through Redis, on its first request.
    let (status, retry) = ask(&b, "/", client).await;
    assert_eq!(status, 429, "node B holds the client");
    assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "the rest of the hold: {retry:?}");
    assert_eq!(ask(&b, "/login", client).await.0, 429, "its logins too");
    assert_eq!(ask(&b, "/", "198.51.100.8").await.0, 200, "other clients pass");

    // A node started now (a restart) holds it too.
    b.stop().await;
    let c = node(&redis.url(), up).await;
    let (status, retry) = ask(&c, "/", client).await;
    assert_eq!(status, 429, "a restarted node holds the client");
    assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "{retry:?}");
    assert_eq!(hits.load(Ordering::Relaxed), before + 1, "no held request reached the upstream");

    // B's and C's answers came from the hold, which they learnt and keep: counted as rejections.
    let metrics = c.metrics().await;
    assert!(
        metrics.contains("tollgate_rule_decisions_total{rule=\"login-failures\",outcome=\"rejected\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_blocked_keys 1"), "{metrics}");
    a.stop().await;
    c.stop().await;
}
