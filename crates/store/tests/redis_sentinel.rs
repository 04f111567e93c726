//! A Sentinel group (a primary, a replica, three Sentinels with a password of their own;
//! `down-after-milliseconds` 1000) switching its primary under load, reached as
//! `redis+sentinel://tollgate:PASSWORD@…/tollgate` with the manual's ACL user (docs/redis.md) on
//! the data servers:
//!
//! - the primary killed with SIGKILL: calls move to the promoted replica within about a second
//!   of the Sentinels' switch, behind the `closed` policy (a call Redis did not decide is a
//!   denial, and every limit is far above the load, so every denial is a fallback);
//! - a switch the Sentinels make while the old primary stays up (`SENTINEL FAILOVER`): the old
//!   primary, demoted, answers `READONLY`, which is followed as a switch and never reaches a
//!   caller as an error.
//!
//! Before: `redis+sentinel://` was an unknown store. The wall-clock bounds are generous (5 s);
//! the measured figures are printed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_store::testkit::load::{Call, CallOutcome, Load};
use tollgate_store::testkit::redis_server::manual_acl;
use tollgate_store::testkit::redis_topology::{SentinelConfig, SentinelGroup};
use tollgate_store::{FailurePolicy, Fallback, Limit, RedisOptions, RedisStore, RedisTarget, Store};

const PASSWORD: &str = "s3cret:@/%";
const SENTINEL_PASSWORD: &str = "sentinel-pw";

fn target(group: &SentinelGroup) -> RedisTarget {
    let url = format!("redis+sentinel://tollgate:s3cret%3A%40%2F%25@{}/tollgate", group.sentinel_addresses());
    let mut target = RedisTarget::parse(&url).unwrap();
    target.sentinel_password = Some(SENTINEL_PASSWORD.into());
    target
}

fn roomy() -> Limit {
    Limit::per_second(1_000_000).build().unwrap()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// Waits until the Sentinels name a primary other than `old`; returns it and when they did.
fn switched(group: &SentinelGroup, old: usize) -> (usize, Instant) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(primary) = group.primary().filter(|&p| p != old) {
            return (primary, Instant::now());
        }
        assert!(Instant::now() < deadline, "the Sentinels did not switch within 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn not_allowed(calls: &[Call]) -> impl Iterator<Item = &Call> {
    calls.iter().filter(|c| c.outcome != CallOutcome::Allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_groups_switches_are_followed() {
    let config = SentinelConfig {
        lines: vec![manual_acl("tollgate", PASSWORD)],
        sentinel_password: Some(SENTINEL_PASSWORD.into()),
        ..SentinelConfig::default()
    };
    let group = Arc::new(std::sync::Mutex::new(blocking(move || SentinelGroup::start(config)).await));
    let target = target(&group.lock().unwrap());
    let options = RedisOptions { timeout: Duration::from_millis(100), ..RedisOptions::default() };
    let redis = RedisStore::connect(&target, options).unwrap();
    let store = Arc::new(Fallback::new(redis.clone(), FailurePolicy::Closed));
    let keys: Vec<Vec<u8>> = (0..8).map(|i| format!("s{i}").into_bytes()).collect();
    assert!(store.check(&keys[0], &roomy(), 1).await.unwrap().allowed, "decided through the Sentinels");

    // --- The primary killed: the Sentinels promote the replica. ------------------------------
    let load = Load::start(store.clone(), keys.clone(), &roomy(), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = load.elapsed();
    let g = group.clone();
    let (primary, at) = blocking(move || {
        let mut group = g.lock().unwrap();
        let old = group.primary().unwrap();
        group.servers[old].kill();
        switched(&group, old)
    })
    .await;
    let switched_at = load.elapsed() - at.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = load.stop().await;
    let last = not_allowed(&calls).map(|c| c.at).max().unwrap_or(killed_at);
    println!(
        "kill: primary killed at {killed_at:?}, the Sentinels named server {primary} at {switched_at:?}, calls last fell \
         back at {last:?}: {:?} after the switch ({} calls)",
        last.saturating_sub(switched_at),
        calls.len()
    );
    assert!(
        last < switched_at + Duration::from_secs(5),
        "calls still fell back {:?} after the switch",
        last - switched_at
    );
    let long = Limit::per_hour(10).build().unwrap();
    assert!(store.check(b"kept", &long, 1).await.unwrap().allowed);
    assert_eq!(group.lock().unwrap().servers[primary].cli(&["EXISTS", "tollgate:gcra:{kept}"]).trim(), "1");

    // --- A switch while the old primary stays up: it answers READONLY once demoted. ---------
    let g = group.clone();
    blocking(move || {
        let mut group = g.lock().unwrap();
        let dead = (0..group.servers.len()).find(|&i| group.servers[i].pid().is_none()).unwrap();
        group.servers[dead].restart(); // the Sentinels make it a replica of the new primary
        group.wait_settled(Duration::from_secs(30));
    })
    .await;
    // The store itself, without a failure policy: any error would reach the caller.
    let load = Load::start(Arc::new(redis.clone()), keys.clone(), &roomy(), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g = group.clone();
    let (primary, at) = blocking(move || {
        let group = g.lock().unwrap();
        let old = group.primary().unwrap();
        assert_eq!(group.sentinels[0].cli(&["SENTINEL", "FAILOVER", "tollgate"]).trim(), "OK");
        switched(&group, old)
    })
    .await;
    let switched_at = load.elapsed() - at.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = load.stop().await;
    let errors: Vec<&Call> = not_allowed(&calls).collect();
    let readonly: Vec<&&Call> =
        errors.iter().filter(|c| matches!(&c.outcome, CallOutcome::Error(e) if e.contains("READONLY"))).collect();
    println!(
        "failover: the Sentinels named server {primary} at {switched_at:?}; {} of {} calls failed (last at {:?}), {} with READONLY",
        errors.len(),
        calls.len(),
        errors.iter().map(|c| c.at).max(),
        readonly.len()
    );
    assert!(readonly.is_empty(), "a demoted primary's READONLY reached a caller: {:?}", readonly[0]);
    let late: Vec<&&Call> = errors.iter().filter(|c| c.at > switched_at + Duration::from_secs(2)).collect();
    assert!(late.is_empty(), "calls failed 2 s after the switch: {:?}", &late[..late.len().min(3)]);
    let acl_log = group.lock().unwrap().servers[primary].cli(&["ACL", "LOG"]);
    assert!(acl_log.trim().is_empty(), "the manual's ACL refused something: {acl_log}");
}

/// A stand-in for the Sentinels' answer only (`SENTINEL GET-MASTER-ADDR-BY-NAME`, `PING`), so
/// that the primary can be demoted without what real Sentinels do at a switch (they close every
/// client's connection, which hides the `READONLY` a client that reconnects early would get).
async fn fake_sentinel(primary: Arc<std::sync::Mutex<u16>>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let primary = primary.clone();
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 4096];
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 {
                        return;
                    }
                    let request = String::from_utf8_lossy(&buffer[..n]).to_ascii_uppercase();
                    let reply = if request.contains("GET-MASTER-ADDR-BY-NAME") {
                        let port = primary.lock().unwrap().to_string();
                        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
                    } else {
                        "+PONG\r\n".to_string()
                    };
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Before this was handled, a demoted primary's `READONLY` failed the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primarys_readonly_moves_the_call_to_the_new_primary() {
    use tollgate_store::testkit::redis_server::{RedisServer, ServerConfig};
    let (first, second) = blocking(|| {
        let first = RedisServer::start();
        let replica =
            ServerConfig { lines: vec![format!("replicaof 127.0.0.1 {}", first.port())], ..ServerConfig::default() };
        (first, RedisServer::start_with(replica))
    })
    .await;
    let named = Arc::new(std::sync::Mutex::new(first.port()));
    let sentinel = fake_sentinel(named.clone()).await;
    let url = format!("redis+sentinel://127.0.0.1:{sentinel}/tollgate");
    let options = RedisOptions { timeout: Duration::from_millis(500), ..RedisOptions::default() };
    let store = RedisStore::open(&url, options).unwrap();
    let limit = Limit::per_hour(100).build().unwrap();
    assert!(store.check(b"k", &limit, 1).await.unwrap().allowed, "decided on the first primary");

    // The roles swap, connections kept: the store's primary is a replica now.
    assert_eq!(second.cli(&["REPLICAOF", "NO", "ONE"]).trim(), "OK");
    assert_eq!(first.cli(&["REPLICAOF", "127.0.0.1", &second.port().to_string()]).trim(), "OK");
    *named.lock().unwrap() = second.port();
    let decision = store.check(b"k", &limit, 1).await;
    assert!(decision.as_ref().is_ok_and(|d| d.allowed), "READONLY reached the caller: {decision:?}");
    assert_eq!(second.cli(&["EXISTS", "tollgate:gcra:{k}"]).trim(), "1", "decided on the new primary");
    assert!(first.cli(&["ROLE"]).starts_with("slave"));
}
