//! `GET /healthz` tells the truth about the store: a real redis-server killed and restarted under
//! a running server, a database the server does not have, and a cluster whose slot map covers
//! part of the slots (the best map read, its coverage stated). No wall-clock assertion: each
//! change must show within a generous deadline (the store is probed every second).

mod common;

use std::time::{Duration, Instant};

use common::Server;
use tollgate_server::{Config, StoreConfig};
use tollgate_store::testkit::redis_server::RedisServer;

const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `/healthz` until its body contains `wanted`; returns the whole response.
async fn health_until(server: &Server, wanted: &str) -> String {
    let start = Instant::now();
    loop {
        let response = server.curl(&["HTTP/healthz"]);
        if response.contains(wanted) {
            return response;
        }
        assert!(start.elapsed() < DEADLINE, "no {wanted:?} in /healthz: {response}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_follows_redis_down_and_up_again() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let server = Server::start(Config { store: StoreConfig::redis(&url), ..common::manual_config() }).await;
    let up = health_until(&server, r#""state":"up""#).await;
    assert!(up.starts_with("HTTP/1.1 200") && up.contains(r#""status":"ok""#), "{up}");
    assert!(up.contains(&format!(r#""name":"{url}""#)) && up.contains(r#""on_store_error":"local""#), "{up}");

    redis.kill();
    let down = health_until(&server, r#""state":"down""#).await;
    // Still 200: the failure policy answers (see `health`); the body says it is degraded, and why.
    assert!(down.starts_with("HTTP/1.1 200") && down.contains(r#""status":"degraded""#), "{down}");
    assert!(down.contains("is redis-server running there"), "{down}");
    assert_eq!(server.cli(&["CL.THROTTLE", "k", "1", "1", "60"]).lines().next(), Some("0"), "still deciding");
    // Calls fail until the server's own breaker opens: /healthz and the metrics name it.
    for _ in 0..3 {
        let _ = server.cli(&["CL.THROTTLE", "k", "1", "1", "60"]);
    }
    let node = format!(r#""nodes":[{{"node":"127.0.0.1:{}","breaker":"open","opened":1}}]"#, redis.port());
    let down = health_until(&server, &node).await;
    assert!(
        down.contains("the circuit breaker of 127.0.0.1:") || down.contains("is redis-server running there"),
        "{down}"
    );
    let metrics = server.curl(&["HTTP/metrics"]);
    let gauge = format!(r#"tollgate_store_node_breaker_open{{node="127.0.0.1:{}"}} 1"#, redis.port());
    assert!(metrics.contains(&gauge), "{gauge} in {metrics}");

    redis.restart();
    let up = health_until(&server, r#""status":"ok""#).await;
    assert!(up.contains(r#""breaker":"closed","opened":1"#), "{up}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_the_server_lacks_is_named() {
    let redis = RedisServer::start();
    let store = StoreConfig::redis(&format!("{}/99", redis.url()));
    let server = Server::start(Config { store, ..common::manual_config() }).await;
    let down = health_until(&server, r#""state":"down""#).await;
    assert!(down.contains("the URL's database does not exist on that server"), "{down}");
    server.stop().await;
}

/// A seed outside any cluster (`CLUSTER SLOTS` answers no slot) and a node serving half the
/// slots: the half map is used, and `/healthz` says how much of the cluster it covers. Before:
/// whichever map was read first was used, and `/healthz` said `up` while the other half of the
/// keys failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_map_covering_part_of_the_slots_is_stated() {
    use tollgate_store::testkit::fake_redis::{self, Answer, FakeRedis, is, resp};
    let lone = FakeRedis::start(|command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            Answer::Raw(resp::array(&[]))
        } else {
            Answer::Raw(resp::simple("PONG"))
        }
    });
    let half = FakeRedis::silent();
    let port = half.port();
    half.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 8_191, port)])
        } else if is(command, &["CLUSTER", "INFO"]) {
            Answer::Raw(resp::bulk("cluster_state:ok"))
        } else {
            Answer::Raw(resp::simple("PONG"))
        }
    });
    let store = StoreConfig::redis(&format!("redis+cluster://{},{}", lone.address(), half.address()));
    let server = Server::start(Config { store, ..common::manual_config() }).await;
    let wanted = format!("covers 8192 of 16384 slots (the map read from {})", half.address());
    let down = health_until(&server, &wanted).await;
    assert!(down.contains(r#""status":"degraded""#), "{down}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_is_always_up() {
    let server = Server::start(common::manual_config()).await;
    let health = server.curl(&["HTTP/healthz"]);
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"status":"ok","store":{"name":"memory","state":"up"}}"#), "{health}");
    server.stop().await;
}
