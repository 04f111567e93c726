//! `tollgate proxy` in-process in front of a real upstream, over loopback with curl: seed 003's
//! login defence through the proxy, forwarding, metrics.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::Config;
use tollgate_server::proxy::{ProxyConfig, run};

async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let (a, b) = (hits.clone(), hits.clone());
    let app = Router::new()
        .route(
            "/login",
            post(move |headers: HeaderMap| {
                a.fetch_add(1, Ordering::Relaxed);
                let status = if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                };
                async move { status }
            }),
        )
        .route(
            "/echo-forwarded",
            get(move |headers: HeaderMap| {
                b.fetch_add(1, Ordering::Relaxed);
                let chain = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                async move { chain }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, hits)
}

async fn curl(args: Vec<String>) -> (u16, String) {
    let output = tokio::task::spawn_blocking(move || {
        Command::new("curl").args(["-s", "-i", "--max-time", "10"]).args(args).output().expect("curl")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    (text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_applies_the_login_rules_and_forwards_the_rest() {
    let (up, hits) = upstream().await;
    let rules =
        Rules::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (proxy, admin_address) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = ProxyConfig { upstream: format!("http://{up}"), rules, options: Default::default() };
    let task = tokio::spawn(async move {
        run(&Config::default(), config, listener, admin, async move {
            let _ = stopped.await;
        })
        .await
    });
    let url = |path: &str| format!("http://{proxy}{path}");
    let from = |ip: &str| format!("X-Forwarded-For: {ip}");

    // Forwarding appends the peer to the chain.
    let (status, text) = curl(vec![url("/echo-forwarded"), "-H".into(), from("198.51.100.9")]).await;
    assert_eq!(status, 200);
    assert!(text.ends_with("198.51.100.9, 127.0.0.1"), "{text}");

    for _ in 0..6 {
        let (status, _) =
            curl(vec!["-X".into(), "POST".into(), url("/login"), "-H".into(), from("198.51.100.7")]).await;
        assert_eq!(status, 401);
    }
    let before = hits.load(Ordering::Relaxed);
    let (status, text) = curl(vec![url("/echo-forwarded"), "-H".into(), from("198.51.100.7")]).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(hits.load(Ordering::Relaxed), before, "blocked requests never reach the upstream");
    let (status, _) = curl(vec![url("/echo-forwarded"), "-H".into(), from("198.51.100.8")]).await;
    assert_eq!(status, 200, "other clients pass");

    let (_, metrics) = curl(vec![format!("http://{admin_address}/metrics")]).await;
    assert!(
        metrics.contains("tollgate_rule_requests_total{rule=\"login-failures\",outcome=\"counted_after\"} 6"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_rule_requests_total{rule=\"login-failures\",outcome=\"rejected\"} 1"),
        "{metrics}"
    );

    drop(stop);
    task.await.unwrap().unwrap();
}
