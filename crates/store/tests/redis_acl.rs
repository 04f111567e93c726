//! tollgate as an ACL user with exactly the manual's ACL (the `ACL SETUSER tollgate …` line of
//! docs/redis.md, read from the page), on one server and on a Redis Cluster: every path tollgate
//! takes (the conformance suite, charges, leases, a reset, a script the server lost, the probe and
//! the diagnosis) runs, and Redis's `ACL LOG` records no refusal. A key outside the ACL's pattern
//! and a wrong password are refused in tollgate's words.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::lease::Lessor;
use tollgate_store::remote::{Charge, Origin, Remote};
use tollgate_store::testkit::redis_server::manual_acl;
use tollgate_store::testkit::redis_server::{RedisServer, ServerConfig};
use tollgate_store::testkit::redis_topology::{ClusterConfig, RedisCluster};
use tollgate_store::testkit::{self};
use tollgate_store::{Algorithm, Check, Limit, RedisOptions, RedisStore, Refund, Store, StoreError, TimeSource};

const PASSWORD: &str = "tg-pw";

/// A fresh prefix under the ACL's `tollgate:*` pattern.
fn options() -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("tollgate:a{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

/// Every path tollgate takes on `store`, as the ACL user.
async fn every_path(store: &RedisStore, flush_scripts: impl Fn()) {
    testkit::conformance(|clock| {
        store.with_options(RedisOptions { time: TimeSource::Clock(clock), ..options() }).unwrap()
    })
    .await;
    let store = store.with_options(options()).unwrap();
    let limit = Limit::per_hour(10).build().unwrap();
    let check = Check::new(b"{acl}:a", &limit, 1);
    let charge = Charge::new(Check::new(b"{acl}:a", &limit, 2), 1_000);
    let reply = store.decide(&[check], &[charge]).await.unwrap();
    assert_eq!(reply.decisions[0].remaining, 7, "charged 2, then admitted 1");
    // A node's charge (remembered in the key's marker hash), with what the node knew of the key.
    let from_node = Charge { origin: Some(Origin { node: 7, total: 2 }), known_remaining: Some(4), ..charge };
    let reply = store.decide(&[check], &[from_node, from_node]).await.unwrap();
    assert_eq!(reply.decisions[0].remaining, 3, "charged 2 once, lowered to 4, then admitted 1");
    let grant = store.lease(Check::new(b"{acl}:a", &limit, 1), 3, 42, Duration::from_millis(100)).await.unwrap();
    assert_eq!(grant.granted, 3);
    // A sliding log's reservation given back whole (its entry removed).
    let log = Limit::per_hour(10).algorithm(Algorithm::SlidingLog).build().unwrap();
    let reserve = Check::new(b"{acl}:log", &log, 2);
    let reserved = store.reserve(&[reserve]).await.unwrap();
    let seen = store.decide(&[Check::new(b"{acl}:log", &log, 0)], &[]).await.unwrap().snapshots[0];
    store.refund(&[Refund { check: reserve, at: reserved.at, decision: reserved.decisions[0] }]).await.unwrap();
    assert_eq!(store.check(b"{acl}:log", &log, 0).await.unwrap().remaining, 10, "refunded");
    // A node's view of the key from before the refund (read against the marker's stamps).
    let view =
        Charge { known_remaining: Some(8), seen: Some(seen), ..Charge::new(Check::new(b"{acl}:log", &log, 0), 0) };
    let reply = store.decide(&[Check::new(b"{acl}:log", &log, 0)], &[view]).await.unwrap();
    assert_eq!(reply.decisions[0].remaining, 10, "a view from before the refund is not given back");
    store.reset("", b"{acl}:a", &limit).await.unwrap();
    assert_eq!(store.check(b"{acl}:a", &limit, 1).await.unwrap().remaining, 9, "reset");
    flush_scripts();
    assert!(store.check(b"{acl}:b", &limit, 1).await.unwrap().allowed, "the script loaded again");
    store.probe().await.unwrap();
    // A failing server's probe (on a cluster: does it serve its slots, CLUSTER INFO).
    assert!(store.probe_domain(&store.domain(&check)).await.unwrap());
    assert_eq!(store.diagnose().await, None);
}

/// The server loses the script in both forms (a restart, a flush): tollgate loads it again.
fn flush(server: &RedisServer) {
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).trim(), "OK");
    assert_eq!(server.cli(&["FUNCTION", "FLUSH"]).trim(), "OK");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manuals_acl_is_enough_and_nothing_more_is_used() {
    let server = Arc::new(RedisServer::start_with(ServerConfig {
        lines: vec![manual_acl("tollgate", PASSWORD)],
        ..ServerConfig::default()
    }));
    let url = format!("redis://tollgate:{PASSWORD}@127.0.0.1:{}", server.port());
    let store = RedisStore::open(&url, options()).unwrap();
    let s = server.clone();
    every_path(&store, move || flush(&s)).await;
    let log = server.cli(&["ACL", "LOG"]);
    assert!(log.trim().is_empty(), "the manual's ACL refused something: {log}");

    // Without functions (`+evalsha +script|load` in their place, as the manual says for a server
    // before Redis 7): every path runs by EVALSHA, after one refused FCALL.
    let eval_only = manual_acl("evalonly", PASSWORD).replace("+fcall +function|load", "+evalsha +script|load");
    assert_eq!(
        server
            .cli(&[&["ACL", "SETUSER"][..], &eval_only.split_whitespace().skip(1).collect::<Vec<_>>()].concat())
            .trim(),
        "OK"
    );
    let eval_url = format!("redis://evalonly:{PASSWORD}@127.0.0.1:{}", server.port());
    let store = RedisStore::open(&eval_url, options()).unwrap();
    let s = server.clone();
    every_path(&store, move || flush(&s)).await;
    let log = server.cli(&["ACL", "LOG"]);
    assert!(log.contains("fcall") && !log.contains("evalsha"), "{log}");
    assert_eq!(server.cli(&["ACL", "LOG", "RESET"]).trim(), "OK");

    // Outside the pattern, and a wrong password: refused, said so.
    let outside = RedisStore::open(&url, RedisOptions { prefix: "other".into(), ..options() }).unwrap();
    let limit = Limit::per_hour(10).build().unwrap();
    match outside.check(b"k", &limit, 1).await {
        Err(StoreError::Backend(e)) => {
            assert!(e.contains("the ACL user tollgate may not run a command or touch a key"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let wrong = RedisStore::open(&format!("redis://tollgate:nope@127.0.0.1:{}", server.port()), options()).unwrap();
    let diagnosis = wrong.diagnose().await.unwrap();
    assert!(diagnosis.contains("authentication failed: check the user and password in the URL"), "{diagnosis}");
    assert!(!diagnosis.contains("nope"), "{diagnosis}");

    // Nothing in it is spare: without any one of its commands, some path is refused.
    let full = manual_acl("spare", PASSWORD);
    for token in full.split_whitespace().filter(|t| t.starts_with('+')) {
        if ["+cluster|slots", "+cluster|info", "+role"].contains(&token) {
            continue; // a cluster's and Sentinel's, tested with them
        }
        let rules: Vec<&str> = full.split_whitespace().skip(2).filter(|t| t != &token).collect();
        let mut command = vec!["ACL", "SETUSER", "spare", "reset"];
        command.extend(rules);
        assert_eq!(server.cli(&command).trim(), "OK");
        assert_eq!(server.cli(&["ACL", "LOG", "RESET"]).trim(), "OK");
        let url = format!("redis://spare:{PASSWORD}@127.0.0.1:{}", server.port());
        let store = RedisStore::open(&url, options()).unwrap();
        let s = server.clone();
        let _ = tokio::spawn(async move { every_path(&store, move || flush(&s)).await }).await;
        let log = server.cli(&["ACL", "LOG"]);
        assert!(log.contains("spare"), "without {token} every path still runs: the manual's ACL has a spare command");
    }

    let config = ClusterConfig { lines: vec![manual_acl("tollgate", PASSWORD)], ..ClusterConfig::default() };
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(config)).await.unwrap();
    let url = format!("redis+cluster://tollgate:{PASSWORD}@{}", cluster.nodes()[0].address());
    let store = RedisStore::open(&url, options()).unwrap();
    let nodes: Vec<String> = cluster.nodes().iter().map(|n| n.address()).collect();
    let flush = move || {
        for address in &nodes {
            let (_, port) = address.split_once(':').unwrap();
            for flush in [&["SCRIPT", "FLUSH"][..], &["FUNCTION", "FLUSH"]] {
                let out = std::process::Command::new("redis-cli").args(["-p", port]).args(flush).output().unwrap();
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK");
            }
        }
    };
    every_path(&store, flush).await;
    for node in cluster.nodes() {
        let log = node.cli(&["ACL", "LOG"]);
        assert!(log.trim().is_empty(), "the manual's ACL refused something on {}: {log}", node.address());
    }
}
