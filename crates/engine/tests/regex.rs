//! `path_regex`, `host_regex` and `header_regex` through the engine, on memory and on a real
//! Redis: each rule counts the requests its pattern matches in full (the path in every spelling
//! a backend routes alike, the host in any case, any line of a header, bytes that are not UTF-8
//! included), and nothing else.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{Harness, Req, build, clock, get, memory};
use tollgate_core::ManualClock;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{RedisOptions, RedisStore, Store, TimeSource};

const RULES: &str = r#"
trusted_proxies = ["10.0.0.0/8"]

[[rules]]
name = "users"
limit = "10/1m"
key = ["global"]
match = { path_regex = "/users/[0-9]+/orders" }

[[rules]]
name = "tenants"
limit = "10/1m"
key = ["global"]
match = { host_regex = "[a-z0-9-]+\\.tenants\\.example" }

[[rules]]
name = "bots"
limit = "10/1m"
key = ["global"]
match = { header_regex = { name = "user-agent", pattern = ".*(bot|crawler).*" } }
"#;

/// Sends each request and checks which rules it was counted by (every rule's budget, after each).
async fn counts_what_each_pattern_matches<S: Store>(h: &Harness<S>) {
    let requests: [(Req, &str); 12] = [
        (get("/users/42/orders"), "users"),
        (get("/Users/42/Orders/"), "users"),
        (get("/users/%34%32/orders"), "users"),
        (get("/users/42/orders/7"), ""),
        (get("/v1/users/42/orders"), ""),
        (get("/").host("acme.tenants.example"), "tenants"),
        (get("/").host("ACME.tenants.example"), "tenants"),
        (get("/").host("acme.tenants.example.evil"), ""),
        (get("/").header("user-agent", "Googlebot/2.1"), "bots"),
        (get("/").header("user-agent", "curl/8").header("user-agent", "a crawler"), "bots"),
        (get("/").header_bytes("user-agent", b"\xff evilbot \xc3"), "bots"),
        (get("/users/1/orders").host("a.tenants.example").header("user-agent", "bot"), "users tenants bots"),
    ];
    let names = ["users", "tenants", "bots"];
    let mut expected = [10u64; 3];
    for (request, counted_by) in &requests {
        h.proceed(request).await;
        for (i, name) in names.iter().enumerate() {
            if counted_by.split(' ').any(|c| c == *name) {
                expected[i] -= 1;
            }
            assert_eq!(h.remaining(name, "").await, expected[i], "{name} after {request:?}");
        }
    }
}

#[tokio::test]
async fn regex_matches_on_memory() {
    let clock = clock();
    counts_what_each_pattern_matches(&build(memory(&clock), clock, RULES, false)).await;
}

#[tokio::test]
async fn regex_matches_on_redis() {
    let server = RedisServer::start();
    let clock = clock();
    counts_what_each_pattern_matches(&build(redis(&server.url(), &clock), clock, RULES, false)).await;
}

fn redis(url: &str, clock: &Arc<ManualClock>) -> RedisStore {
    let options = RedisOptions {
        prefix: "regex".into(),
        time: TimeSource::Clock(clock.clone()),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    };
    RedisStore::open(url, options).unwrap()
}
