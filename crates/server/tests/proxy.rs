//! `tollgate proxy` in-process in front of a real upstream, over loopback with curl: the login
//! defence of `examples/rules/login.toml`, two rules on a real Redis Cluster, reloading the rules file, upstream timeouts
//! and what a 502/504 says. Memory stores run on a manual clock.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use common::proxy::{Proxy, curl};
use tokio::net::TcpListener;
use tollgate_rules::Rules;
use tollgate_server::proxy::ProxyConfig;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_topology::RedisCluster;
use tollgate_store::{Check, Limit, RedisOptions, RedisStore, Store};

async fn upstream() -> (SocketAddr, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let (a, b, c) = (hits.clone(), hits.clone(), hits.clone());
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
            "/echo",
            get(move |headers: HeaderMap| {
                b.fetch_add(1, Ordering::Relaxed);
                let mut names: Vec<String> = headers.keys().map(|k| k.to_string()).collect();
                names.sort();
                let chain = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                async move { format!("{chain}|{}", names.join(",")) }
            }),
        )
        .route(
            "/slow",
            get(move || {
                c.fetch_add(1, Ordering::Relaxed);
                async move {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "late"
                }
            }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, hits)
}

/// A proxy in front of `upstream`, with these rules (reloaded from `file`, if any).
async fn start(config: Config, upstream: String, rules: Rules, file: Option<PathBuf>, timeout: Duration) -> Proxy {
    let proxy = ProxyConfig {
        upstream,
        rules,
        rules_file: file,
        options: Default::default(),
        upstream_timeout: timeout,
        tls: None,
        limits: Default::default(),
    };
    Proxy::start(config, proxy).await
}

fn from(ip: &str) -> Vec<String> {
    vec!["-H".into(), format!("X-Forwarded-For: {ip}")]
}

fn login_rules() -> Rules {
    Rules::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rules/login.toml")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_applies_the_login_rules_and_forwards_the_rest() {
    let (up, hits) = upstream().await;
    let proxy =
        start(common::manual_config(), format!("http://{up}"), login_rules(), None, Duration::from_secs(30)).await;

    // Forwarding appends the peer to the chain.
    let (status, text) = curl([vec![proxy.url("/echo")], from("198.51.100.9")].concat()).await;
    assert_eq!(status, 200);
    assert!(text.contains("198.51.100.9, 127.0.0.1|"), "{text}");

    for _ in 0..5 {
        let (status, _) =
            curl([vec!["-X".into(), "POST".into(), proxy.url("/login")], from("198.51.100.7")].concat()).await;
        assert_eq!(status, 401);
    }
    let (status, _) =
        curl([vec!["-X".into(), "POST".into(), proxy.url("/login")], from("198.51.100.7")].concat()).await;
    assert_eq!(status, 429, "the sixth failure is refused before it reaches the upstream");
    let before = hits.load(Ordering::Relaxed);
    let (status, text) = curl([vec![proxy.url("/echo")], from("198.51.100.7")].concat()).await;
    assert_eq!(status, 429, "{text}");
    assert_eq!(hits.load(Ordering::Relaxed), before, "blocked requests never reach the upstream");
    let (status, _) = curl([vec![proxy.url("/echo")], from("198.51.100.8")].concat()).await;
    assert_eq!(status, 200, "other clients pass");

    let metrics = proxy.metrics().await;
    for wanted in [
        "tollgate_rule_decisions_total{rule=\"login-failures\",outcome=\"counted\"} 5",
        "tollgate_rule_decisions_total{rule=\"login-failures\",outcome=\"rejected\"} 2",
    ] {
        assert!(metrics.contains(wanted), "{wanted}: {metrics}");
    }
    let (status, health) = curl(vec![proxy.admin_url("/healthz")]).await;
    assert_eq!(status, 200);
    assert!(health.ends_with(r#"{"status":"ok","store":{"name":"memory","state":"up"}}"#), "{health}");
    proxy.stop().await;
}

/// Before: two rules on one request had keys in different Cluster slots; `check_all` failed with
/// `CrossSlot` and the middleware let the request through unlimited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_rules_on_a_redis_cluster_are_both_enforced_all_or_nothing() {
    let cluster = RedisCluster::start();
    let (up, hits) = upstream().await;
    let rules = Rules::parse(
        "trusted_proxies = [\"127.0.0.1/32\"]\n\
         [[rules]]\nname = \"per-ip\"\nlimit = \"2/1m\"\nkey = [\"client_ip\"]\n\
         [[rules]]\nname = \"everyone\"\nlimit = \"3/1m\"\nkey = [\"global\"]\n",
        "t",
    )
    .unwrap();
    let config = Config {
        store: StoreConfig::redis(&format!(
            "redis+cluster://{}",
            cluster.nodes().iter().map(|n| n.address()).collect::<Vec<_>>().join(",")
        )),
        ..common::manual_config()
    };
    let proxy = start(config, format!("http://{up}"), rules, None, Duration::from_secs(30)).await;
    let mut statuses = Vec::new();
    for ip in ["10.1.0.1", "10.1.0.1", "10.1.0.1", "10.1.0.2", "10.1.0.3"] {
        let (status, text) = curl([vec![proxy.url("/echo")], from(ip)].concat()).await;
        assert_ne!(status, 503, "{text}");
        statuses.push(status);
    }
    // 10.1.0.1: 2 pass, the third is over its own limit (the global one keeps its last unit);
    // 10.1.0.2 takes it; 10.1.0.3 is over the global limit.
    assert_eq!(statuses, [200, 200, 429, 200, 429]);
    assert_eq!(hits.load(Ordering::Relaxed), 3);
    // The request refused by the global limit consumed nothing from 10.1.0.3's own.
    let store = RedisStore::open_cluster(&cluster.urls(), RedisOptions::default()).await.unwrap();
    let per_ip = Limit::per_minute(2).build().unwrap();
    let own = store.check_all(&[Check::new(b"10.1.0.3", &per_ip, 0).scoped("per-ip")]).await.unwrap();
    assert_eq!(own[0].remaining, 2);
    proxy.stop().await;
}

/// On a change of the rules file (here, rewritten in place) the proxy applies the new rules
/// within two seconds; a file that does not load keeps the rules in force, and is counted; an
/// unchanged rule keeps its state across reloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_rules_file_is_applied_and_a_bad_one_is_not() {
    let (up, _) = upstream().await;
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.toml");
    // A fixed window: its state is a count, kept across a change of the limit.
    let rule = |count: u32| {
        format!(
            "[[rules]]\nname = \"ip\"\nlimit = \"{count}/1h\"\nalgorithm = \"fixed-window\"\nkey = [\"client_ip\"]\n"
        )
    };
    std::fs::write(&file, rule(2)).unwrap();
    let rules = Rules::load(&file).unwrap();
    let proxy =
        start(common::manual_config(), format!("http://{up}"), rules, Some(file.clone()), Duration::from_secs(30))
            .await;
    let echo = || curl(vec![proxy.url("/echo")]);
    assert_eq!(echo().await.0, 200);

    // A bad file: the rules in force stay (1 of 2 left).
    std::fs::write(&file, "[[rules]]\nname = \"ip\"\nlimit = \"two per minute\"\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !proxy.metrics().await.contains("tollgate_config_reloads_total{result=\"error\"} 1") {
        assert!(Instant::now() < deadline, "the bad file was never tried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(echo().await.0, 200);
    assert_eq!(echo().await.0, 429, "still the old rule: 2 per minute");

    // A good file: 4 per minute, same rule name and algorithm: its count (2) is kept.
    std::fs::write(&file, rule(4)).unwrap();
    let changed = Instant::now();
    while !proxy.metrics().await.contains("tollgate_config_reloads_total{result=\"ok\"} 1") {
        assert!(changed.elapsed() < Duration::from_secs(5), "the new file was never applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("rules file change applied after {:?}", changed.elapsed());
    assert_eq!(echo().await.0, 200);
    assert_eq!(echo().await.0, 200);
    assert_eq!(echo().await.0, 429, "2 counted before the reload + 2 after");
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Before: no upstream timeout, and a 502's body carried the upstream's address and error text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_or_dead_upstream_is_a_504_or_502_that_leaks_nothing() {
    let (up, _) = upstream().await;
    let rules = Rules::default();
    let proxy =
        start(common::manual_config(), format!("http://{up}"), rules.clone(), None, Duration::from_millis(300)).await;
    let (status, text) = curl(vec![proxy.url("/slow")]).await;
    assert_eq!(status, 504, "{text}");
    assert!(!text.contains(&up.to_string()) && !text.contains("127.0.0.1"), "{text}");
    // Hop-by-hop headers, and the ones Connection names, are not forwarded.
    let (_, echoed) =
        curl(vec![proxy.url("/echo"), "-H".into(), "Connection: x-secret".into(), "-H".into(), "x-secret: 1".into()])
            .await;
    assert!(!echoed.contains("x-secret") && echoed.contains("x-forwarded-for"), "{echoed}");
    proxy.stop().await;

    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let proxy = start(common::manual_config(), format!("http://{dead}"), rules, None, Duration::from_secs(2)).await;
    let (status, text) = curl(vec![proxy.url("/echo")]).await;
    assert_eq!(status, 502, "{text}");
    assert!(!text.contains(&dead.port().to_string()) && !text.contains("Connection refused"), "{text}");
    proxy.stop().await;
}
