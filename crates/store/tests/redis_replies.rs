//! What the Redis store does with what servers tell it about the topology, against fake servers
//! whose answers each test scripts (`testkit::fake_redis`) and one real cluster beside a real
//! lone node:
//!
//! - a seed outside the cluster (a node with `cluster-enabled yes` in no cluster: `CLUSTER SLOTS`
//!   answers `*0`) does not hide the cluster; a map that covers part of the slots never replaces
//!   a complete one, the best one read is used and its coverage stated, and calls that find no
//!   owner read the map at most once per 100 ms;
//! - impossible values (`-MOVED 20000 …`, a port 0, overlapping slot ranges) fail the call they
//!   came with, as a backend error naming the value, and the store goes on serving;
//! - a Sentinel's switch is followed while calls succeed, and a server the Sentinels name is
//!   used only while it says it is a primary (`ROLE`), however long it has been the primary;
//! - a refresh asks its candidates in parallel, known-good first (a silent node costs one query
//!   timeout, not one per node), and forgets the addresses the topology no longer names.
//!
//! No wall-clock assertion: deadlines here are generous timeouts on what must happen.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate_store::redis::hash_slot;
use tollgate_store::remote::Remote;
use tollgate_store::testkit::fake_redis::{self, Answer, FakeRedis, is, resp};
use tollgate_store::testkit::redis_server::{RedisServer, ServerConfig};
use tollgate_store::testkit::redis_topology::RedisCluster;
use tollgate_store::{Check, Limit, RedisOptions, RedisStore, Store, StoreError};

/// How long something that must happen may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);

fn limit() -> Limit {
    Limit::per_second(1_000).build().unwrap()
}

fn options(timeout: Duration) -> RedisOptions {
    RedisOptions { timeout, ..RedisOptions::default() }
}

/// A store on the cluster reached through `seeds`, calls bounded by a generous 2 s.
fn cluster(seeds: &[&FakeRedis]) -> RedisStore {
    cluster_with(seeds, Duration::from_secs(2))
}

fn cluster_with(seeds: &[&FakeRedis], timeout: Duration) -> RedisStore {
    let seeds: Vec<String> = seeds.iter().map(|s| s.address()).collect();
    RedisStore::open(&format!("redis+cluster://{}", seeds.join(",")), options(timeout)).unwrap()
}

/// The answers of a healthy cluster node: `CLUSTER SLOTS` as `ranges` say (each range's primary
/// by its port), every script call admitted, `PING` and `CLUSTER INFO` as a healthy node's.
fn node_of(ranges: Vec<(u16, u16, u16)>) -> impl Fn(&[Vec<u8>]) -> Answer + Send + Sync + 'static {
    move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&ranges)
        } else if is(command, &["CLUSTER", "INFO"]) {
            Answer::Raw(resp::bulk("cluster_state:ok"))
        } else if is(command, &["FCALL"]) {
            fake_redis::admitted()
        } else if is(command, &["PING"]) {
            Answer::Raw(resp::simple("PONG"))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    }
}

/// A fake cluster node that serves every slot itself.
fn whole_cluster() -> FakeRedis {
    let node = FakeRedis::silent();
    node.script(node_of(vec![(0, 16_383, node.port())]));
    node
}

/// A node with `cluster-enabled yes` that belongs to no cluster: no slots.
fn lone() -> FakeRedis {
    FakeRedis::start(|command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            Answer::Raw(resp::array(&[]))
        } else {
            Answer::Raw(resp::error("CLUSTERDOWN Hash slot not served"))
        }
    })
}

fn slot_of(store: &RedisStore, key: &[u8]) -> u16 {
    hash_slot(&store.state_key("", key, &limit()).unwrap())
}

/// A key whose state lives in a slot below 8192, and one whose state lives at or above it.
fn keys_on_both_halves(store: &RedisStore) -> (Vec<u8>, Vec<u8>) {
    let slot = |key: &[u8]| slot_of(store, key);
    let low = (0..).map(|i| format!("k{i}").into_bytes()).find(|k| slot(k) < 8_192).unwrap();
    let high = (0..).map(|i| format!("k{i}").into_bytes()).find(|k| slot(k) >= 8_192).unwrap();
    (low, high)
}

// --- Item 1: a seed outside the cluster. ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_outside_the_cluster_does_not_hide_it() {
    let (lone, good) = (lone(), whole_cluster());
    let store = cluster(&[&lone, &good]);
    let decision = store.check(b"k", &limit(), 1).await;
    assert!(matches!(decision, Ok(ref d) if d.allowed), "a lone node listed first hid the cluster: {decision:?}");
    assert_eq!(good.count(&["FCALL"]), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_lone_node_listed_first_does_not_hide_a_real_cluster() {
    let (cluster, lone) = tokio::task::spawn_blocking(|| {
        let lone =
            RedisServer::start_with(ServerConfig { cluster_node_timeout_ms: Some(2000), ..ServerConfig::default() });
        (RedisCluster::start(), lone)
    })
    .await
    .unwrap();
    assert!(lone.cli(&["CLUSTER", "SLOTS"]).trim().is_empty(), "the lone node serves no slot");
    let mut urls = vec![lone.url()];
    urls.extend(cluster.urls());
    let store = RedisStore::open_cluster(&urls, options(Duration::from_secs(2))).await.unwrap();
    for i in 0..20 {
        let key = format!("key{i}");
        let decision = store.check(key.as_bytes(), &limit(), 1).await;
        assert!(matches!(decision, Ok(ref d) if d.allowed), "{key}: {decision:?}");
    }
    store.probe().await.unwrap();
    assert_eq!(store.diagnose().await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_map_never_replaces_a_complete_one() {
    let node = whole_cluster();
    let store = cluster(&[&node]);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    // The node forgets its cluster (restarted without its nodes.conf) and answers no slots.
    let port = node.port();
    let serving = node_of(vec![(0, 16_383, port)]);
    node.script(
        move |command| {
            if is(command, &["CLUSTER", "SLOTS"]) { Answer::Raw(resp::array(&[])) } else { serving(command) }
        },
    );
    let asked = node.count(&["CLUSTER", "SLOTS"]);
    let start = Instant::now();
    while node.count(&["CLUSTER", "SLOTS"]) == asked {
        assert!(start.elapsed() < DEADLINE, "no refresh asked the node again");
        tokio::time::sleep(Duration::from_millis(120)).await;
        let _ = store.probe().await;
    }
    let decision = store.check(b"k", &limit(), 1).await;
    assert!(matches!(decision, Ok(ref d) if d.allowed), "an empty map replaced a complete one: {decision:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_best_map_read_is_used_and_its_coverage_stated() {
    let (lone, half) = (lone(), FakeRedis::silent());
    half.script(node_of(vec![(0, 8_191, half.port())]));
    let store = cluster(&[&lone, &half]);
    let (low, high) = keys_on_both_halves(&store);
    let decision = store.check(&low, &limit(), 1).await;
    assert!(matches!(decision, Ok(ref d) if d.allowed), "the half map was not used: {decision:?}");
    let covered = format!("covers 8192 of 16384 slots (the map read from {})", half.address());
    match store.check(&high, &limit(), 1).await {
        Err(StoreError::Backend(error)) => assert!(error.contains(&covered), "{error}"),
        other => panic!("a key of an unserved slot: {other:?}"),
    }
    match store.probe().await {
        Err(error) => assert!(error.to_string().contains(&covered), "{error}"),
        Ok(()) => panic!("the probe passed with half the slots unserved"),
    }
    let diagnosis = store.diagnose().await.unwrap_or_default();
    assert!(diagnosis.contains(&covered), "{diagnosis}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_find_no_owner_read_the_map_at_most_once_per_100_ms() {
    let lone = lone();
    let store = cluster(&[&lone]);
    let start = Instant::now();
    let mut failed = 0;
    for i in 0..200 {
        failed += usize::from(store.check(format!("k{i}").as_bytes(), &limit(), 1).await.is_err());
    }
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.check(format!("c{i}").as_bytes(), &limit(), 1).await.is_err() })
        })
        .collect();
    for task in tasks {
        failed += usize::from(task.await.unwrap());
    }
    let elapsed = start.elapsed();
    assert_eq!(failed, 400, "no call can be decided without a slot map");
    let reads = lone.count(&["CLUSTER", "SLOTS"]);
    let allowed = 2 + usize::try_from(elapsed.as_millis() / 100).unwrap();
    assert!(reads <= allowed, "{reads} CLUSTER SLOTS for 400 calls in {elapsed:?} (at most {allowed})");
}

// --- Item 2: impossible values. ------------------------------------------------------------

/// What a node answers a script call for a key in a slot.
type Redirecting = fn(u16) -> String;

/// A node that serves every slot, and answers every script call `answer(slot of its key)`.
fn redirecting(answer: impl Fn(u16) -> String + Send + Sync + 'static) -> FakeRedis {
    let node = FakeRedis::silent();
    let port = node.port();
    node.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 16_383, port)])
        } else if is(command, &["FCALL"]) && command.len() > 3 {
            Answer::Raw(resp::error(&answer(hash_slot(&command[3]))))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    });
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_redirect_fails_its_call_and_nothing_else() {
    let cases: [(&str, Redirecting); 6] = [
        ("20000", |_| "MOVED 20000 127.0.0.1:1".into()),
        ("16384", |_| "ASK 16384 127.0.0.1:1".into()),
        ("port 0", |slot| format!("MOVED {slot} 127.0.0.1:0")),
        ("another slot", |slot| format!("MOVED {} 127.0.0.1:1", (slot + 1) % 16_384)),
        ("not a slot and an address", |slot| format!("MOVED {slot}")),
        ("is not a host", |slot| format!("ASK {slot} :1")),
    ];
    for (named, answer) in cases {
        let node = redirecting(answer);
        let store = cluster(&[&node]);
        for _ in 0..3 {
            match store.check(b"k", &limit(), 1).await {
                Err(StoreError::Backend(error)) => {
                    assert!(error.contains(&node.address()) && error.contains(named), "{named}: {error}");
                }
                other => panic!("{named}: {other:?}"),
            }
        }
        // The same store serves once the node answers sensibly again.
        node.script(node_of(vec![(0, 16_383, node.port())]));
        assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed, "{named}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_slot_map_is_refused_and_the_next_seed_asked() {
    let good = whole_cluster();
    let maps: [(&str, Vec<u8>); 3] = [
        ("port 0", {
            let primary = resp::array(&[resp::bulk("127.0.0.1"), resp::int(0)]);
            resp::array(&[resp::array(&[resp::int(0), resp::int(16_383), primary])])
        }),
        ("overlap", {
            let primary = resp::array(&[resp::bulk("127.0.0.1"), resp::int(i64::from(good.port()))]);
            let range = |a: i64, b: i64| resp::array(&[resp::int(a), resp::int(b), primary.clone()]);
            resp::array(&[range(0, 10_000), range(5_000, 16_383)])
        }),
        ("empty host", {
            let primary = resp::array(&[resp::bulk(" "), resp::int(7000)]);
            resp::array(&[resp::array(&[resp::int(0), resp::int(16_383), primary])])
        }),
    ];
    for (named, map) in maps {
        let hostile = FakeRedis::start(move |command| {
            if is(command, &["CLUSTER", "SLOTS"]) { Answer::Raw(map.clone()) } else { fake_redis::admitted() }
        });
        let store = cluster(&[&hostile, &good]);
        let decision = store.check(b"k", &limit(), 1).await;
        assert!(matches!(decision, Ok(ref d) if d.allowed), "{named}: {decision:?}");
        assert_eq!(hostile.count(&["FCALL"]), 0, "{named}: a call went where an impossible map said");
    }
}

/// A node whose `CLUSTER SLOTS` answer never ends, in three ways: a string announced as 10 GB,
/// a line that goes on, an array of two billion values that keep coming. tollgate
/// reads at most one reply's bound of each (16 MiB, 2,097,152 values), then hangs up, and
/// connects again for the next call. Before: it read on as fast as the node sent (3 GB in 10 s
/// under `tollgate serve`, idle), its memory growing until the process was killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_never_ends_is_cut_at_its_bound() {
    /// Far more than one reply may take, socket buffers included.
    const TOO_MUCH: u64 = 256 << 20;
    for (head, chunk) in [
        ("$9999999999\r\n", "x".repeat(1 << 16)),
        ("+", "x".repeat(1 << 16)),
        ("*2147483647\r\n", ":1\r\n".repeat(1 << 14)),
    ] {
        let node = FakeRedis::silent();
        let (head_bytes, chunk_bytes) = (head.as_bytes().to_vec(), chunk.into_bytes());
        node.script(move |command| {
            if is(command, &["CLUSTER", "SLOTS"]) {
                Answer::Endless { head: head_bytes.clone(), chunk: chunk_bytes.clone() }
            } else {
                Answer::Raw(resp::error("ERR unknown command"))
            }
        });
        let store = cluster(&[&node]);
        let decision = store.check(b"k", &limit(), 1).await;
        assert!(decision.is_err(), "{head:?}: a call answered without a slot map: {decision:?}");
        let start = Instant::now();
        loop {
            let (streamed, hung_up) = node.streamed();
            if hung_up == 1 {
                break;
            }
            assert!(streamed < TOO_MUCH, "{head:?}: tollgate read {streamed} bytes of one reply and reads on");
            assert!(start.elapsed() < DEADLINE, "{head:?}: tollgate neither read on nor hung up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The node answers again: the next call connects anew.
        node.script(node_of(vec![(0, 16_383, node.port())]));
        tokio::time::sleep(Duration::from_millis(120)).await;
        let decision = store.check(b"k", &limit(), 1).await;
        assert!(matches!(decision, Ok(ref d) if d.allowed), "{head:?}: {decision:?}");
    }
}

// --- Item 7: Sentinel. -----------------------------------------------------------------------

/// A fake Sentinel that names, for `tollgate`, the server at the port `named` holds.
fn sentinel(named: Arc<std::sync::atomic::AtomicU16>) -> FakeRedis {
    FakeRedis::start(move |command| {
        if is(command, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME"]) {
            let port = named.load(std::sync::atomic::Ordering::Relaxed).to_string();
            Answer::Raw(resp::array(&[resp::bulk("127.0.0.1"), resp::bulk(&port)]))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    })
}

/// A data server that says it is `role` (switchable) and admits every script call.
fn data_server(role: Arc<std::sync::Mutex<&'static str>>) -> FakeRedis {
    FakeRedis::start(move |command| {
        if is(command, &["ROLE"]) {
            fake_redis::role(*role.lock().unwrap())
        } else if is(command, &["FCALL"]) {
            fake_redis::admitted()
        } else if is(command, &["PING"]) {
            Answer::Raw(resp::simple("PONG"))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    })
}

fn sentinel_store(sentinel: &FakeRedis) -> RedisStore {
    let url = format!("redis+sentinel://{}/tollgate", sentinel.address());
    RedisStore::open(&url, options(Duration::from_secs(2))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_switch_is_followed_while_calls_succeed() {
    let master = || Arc::new(std::sync::Mutex::new("master"));
    let (first, second) = (data_server(master()), data_server(master()));
    let named = Arc::new(std::sync::atomic::AtomicU16::new(first.port()));
    let sentinel = sentinel(named.clone());
    let store = sentinel_store(&sentinel);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    assert_eq!(first.count(&["FCALL"]), 1);
    // The Sentinels promote another server; the first, cut off from them, still takes writes.
    named.store(second.port(), std::sync::atomic::Ordering::Relaxed);
    let start = Instant::now();
    while second.count(&["FCALL"]) == 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "calls still go to the replaced primary {} calls after the switch",
            first.count(&["FCALL"])
        );
        assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let on_first = first.count(&["FCALL"]);
    for _ in 0..20 {
        assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    }
    assert_eq!(first.count(&["FCALL"]), on_first, "a call went back to the replaced primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_says_it_is_a_replica_gets_no_more_calls() {
    let role = Arc::new(std::sync::Mutex::new("master"));
    let server = data_server(role.clone());
    let sentinel = sentinel(Arc::new(std::sync::atomic::AtomicU16::new(server.port())));
    let store = sentinel_store(&sentinel);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    // Demoted, and back as a replica that accepts writes (`replica-read-only no`), while a stale
    // Sentinel still names it.
    *role.lock().unwrap() = "slave";
    let start = Instant::now();
    loop {
        let decision = store.check(b"k", &limit(), 1).await;
        if let Err(StoreError::Backend(error)) = &decision {
            assert!(error.contains("not a primary"), "{error}");
            break;
        }
        assert!(start.elapsed() < DEADLINE, "calls still go to a server that says it is a replica: {decision:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let calls = server.count(&["FCALL"]);
    for _ in 0..5 {
        assert!(store.check(b"k", &limit(), 1).await.is_err());
    }
    assert_eq!(server.count(&["FCALL"]), calls, "a call went to the replica");
}

// --- Item 8: candidates asked in parallel; forgotten addresses. -----------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_asks_its_candidates_in_parallel() {
    let silent: Vec<FakeRedis> = (0..4).map(|_| FakeRedis::silent()).collect();
    let refused = FakeRedis::silent();
    let refused_address = refused.address();
    drop(refused);
    let good = whole_cluster();
    let mut seeds: Vec<String> = silent.iter().map(FakeRedis::address).collect();
    seeds.push(refused_address);
    seeds.push(good.address());
    // Each silent node could hold a call for 30 s: asked one after another, the call would take
    // two minutes.
    let store =
        RedisStore::open(&format!("redis+cluster://{}", seeds.join(",")), options(Duration::from_secs(30))).unwrap();
    let decision = tokio::time::timeout(DEADLINE, store.check(b"k", &limit(), 1)).await;
    assert!(
        matches!(decision, Ok(Ok(ref d)) if d.allowed),
        "the live seed was not asked while the silent ones were pending: {decision:?}"
    );
    for node in &silent {
        assert_eq!(node.count(&["CLUSTER", "SLOTS"]), 1, "every silent seed was asked, and none answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_asks_the_known_nodes_first() {
    let primary = whole_cluster();
    let seed = FakeRedis::silent();
    seed.script(node_of(vec![(0, 16_383, primary.port())]));
    let store = cluster(&[&seed]);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(120)).await;
        store.probe().await.unwrap();
    }
    assert!(primary.count(&["CLUSTER", "SLOTS"]) >= 3, "the map's own primary is asked first");
    assert_eq!(seed.count(&["CLUSTER", "SLOTS"]), 1, "the seed is asked only while no known node answers");
}

/// A primary cut off from its cluster's majority but not from tollgate: the majority promotes
/// its replica, while the old primary still answers its stale map (every slot its own) and, once
/// it sees its cluster fail, `CLUSTERDOWN` to every call. A refresh asks the map's primaries
/// first, and the old primary answers at once. Before: its stale map won every refresh, and every
/// call went on failing `CLUSTERDOWN` for as long as the partition lasted; a node that answered
/// `CLUSTERDOWN` is now asked after the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_its_cluster_does_not_keep_tollgate_with_it() {
    let (old, promoted) = (whole_cluster(), whole_cluster());
    let seed = FakeRedis::silent();
    seed.script(node_of(vec![(0, 16_383, old.port())]));
    let store = cluster(&[&seed]);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    let (old_port, promoted_port) = (old.port(), promoted.port());
    old.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 16_383, old_port)])
        } else {
            Answer::Raw(resp::error("CLUSTERDOWN The cluster is down"))
        }
    });
    seed.script(node_of(vec![(0, 16_383, promoted_port)]));
    let start = Instant::now();
    let mut last = None;
    while promoted.count(&["FCALL"]) == 0 {
        assert!(start.elapsed() < DEADLINE, "every call still goes to the cut-off primary: {last:?}");
        last = Some(store.check(b"k", &limit(), 1).await);
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    let decision = store.check(b"k", &limit(), 1).await;
    assert!(matches!(decision, Ok(ref d) if d.allowed), "{decision:?}");
}

/// A map of 16,384 one-slot ranges, each with 16 replicas of its own: 262,144 replica addresses
/// (a broken or hostile node: Redis Cluster is designed for about 1,000 nodes). Before: every
/// replica was kept as a candidate for the next refresh, which deduplicated them pair by pair,
/// blocking a runtime thread for minutes (`tollgate serve` stopped answering anyone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_naming_a_quarter_million_replicas_does_not_stall_a_refresh() {
    let node = FakeRedis::silent();
    let port = i64::from(node.port());
    let at = |host: &str, port: i64| resp::array(&[resp::bulk(host), resp::int(port), resp::bulk("id")]);
    let ranges: Vec<Vec<u8>> = (0..16_384_i64)
        .map(|slot| {
            let mut fields = vec![resp::int(slot), resp::int(slot), at("127.0.0.1", port)];
            fields.extend((0..16).map(|r| {
                let n = slot * 16 + r;
                at(&format!("10.{}.{}.{}", n >> 16, (n >> 8) & 255, n & 255), 6379)
            }));
            resp::array(&fields)
        })
        .collect();
    let map = Arc::new(resp::array(&ranges));
    let serving = node_of(Vec::new());
    node.script(
        move |command| {
            if is(command, &["CLUSTER", "SLOTS"]) { Answer::Raw(map.to_vec()) } else { serving(command) }
        },
    );
    let store = cluster_with(&[&node], Duration::from_secs(5));
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    tokio::time::sleep(Duration::from_millis(120)).await;
    // On a task of its own: a refresh that stalls its thread cannot stall the deadline too.
    let probe = tokio::spawn(async move { store.probe().await });
    let probed = tokio::time::timeout(DEADLINE, probe).await;
    assert!(matches!(probed, Ok(Ok(Ok(())))), "the refresh did not end within {DEADLINE:?}: {probed:?}");
    assert!(node.count(&["CLUSTER", "SLOTS"]) >= 2, "the refresh asked the map's primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_the_topology_no_longer_names_are_forgotten() {
    let (old, new) = (whole_cluster(), FakeRedis::silent());
    new.script(node_of(vec![(0, 16_383, new.port())]));
    let seed = FakeRedis::silent();
    seed.script(node_of(vec![(0, 16_383, old.port())]));
    let store = cluster(&[&seed]);
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    assert_eq!(old.count(&["FCALL"]), 1, "the first map names the old node");
    // The cluster moves every slot to the new node: the old one answers MOVED, and names it.
    let new_port = new.port();
    old.script(move |command| {
        if is(command, &["CLUSTER", "SLOTS"]) {
            fake_redis::cluster_slots(&[(0, 16_383, new_port)])
        } else if is(command, &["FCALL"]) && command.len() > 3 {
            Answer::Raw(resp::error(&format!("MOVED {} 127.0.0.1:{new_port}", hash_slot(&command[3]))))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    });
    seed.script(node_of(vec![(0, 16_383, new_port)]));
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
    assert_eq!(new.count(&["FCALL"]), 1, "the call followed MOVED");
    // Once a refresh has read the new map (every slot on the new node, not only the one MOVED
    // named), the old node is in it no more: it is forgotten.
    let other =
        (0..).map(|i| format!("o{i}").into_bytes()).find(|k| slot_of(&store, k) != slot_of(&store, b"k")).unwrap();
    let limit = limit();
    let start = Instant::now();
    while *store.domain(&Check::new(&other, &limit, 1)) != *new.address() {
        assert!(start.elapsed() < DEADLINE, "no refresh read the new map");
        tokio::time::sleep(Duration::from_millis(120)).await;
        let _ = store.probe().await;
    }
    // Then the new node and the seed fail their CLUSTER SLOTS: a refresh asks them, never the
    // old node.
    let failing = |command: &[Vec<u8>]| {
        if is(command, &["CLUSTER", "SLOTS"]) { Answer::Raw(resp::error("ERR busy")) } else { fake_redis::admitted() }
    };
    new.script(failing);
    seed.script(failing);
    let old_asked = old.count(&["CLUSTER", "SLOTS"]);
    let asked = new.count(&["CLUSTER", "SLOTS"]);
    let start = Instant::now();
    while new.count(&["CLUSTER", "SLOTS"]) == asked {
        assert!(start.elapsed() < DEADLINE, "no refresh asked the new node");
        tokio::time::sleep(Duration::from_millis(120)).await;
        let _ = store.probe().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(old.count(&["CLUSTER", "SLOTS"]), old_asked, "a refresh asked a node the topology no longer names");
}

// --- Item 2: the store's other replies (the script's, a lease's, TIME). ----------------------

/// A single fake server that answers `TIME` and every script call as given.
fn answering(time: Vec<u8>, script: Vec<i64>) -> (FakeRedis, RedisStore) {
    let server = FakeRedis::start(move |command| {
        if is(command, &["TIME"]) {
            Answer::Raw(time.clone())
        } else if is(command, &["FCALL"]) {
            Answer::Raw(resp::array(&script.iter().map(|&v| resp::int(v)).collect::<Vec<_>>()))
        } else {
            Answer::Raw(resp::error("ERR unknown command"))
        }
    });
    let store = RedisStore::open(&format!("redis://{}", server.address()), options(Duration::from_secs(2))).unwrap();
    (server, store)
}

/// One check's reply: allowed, limit, remaining, retry, reset, used, previous; then the time.
const ADMITTED: [i64; 9] = [1, 10, 9, 0, 0, 1, 0, 1_700_000_000, 0];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_script_and_time_replies_fail_their_call() {
    let time = |secs: &str, micros: &str| resp::array(&[resp::bulk(secs), resp::bulk(micros)]);
    let good_time = time("1700000000", "0");
    // TIME far beyond what nanoseconds since the epoch can hold, or microseconds of a second
    // longer than one: the reset fails (before: an overflow, a panic in a debug build).
    for (secs, micros) in [("18446744073709551615", "0"), ("1700000000", "18446744073709551615"), ("1", "1000000")] {
        let (_server, store) = answering(time(secs, micros), ADMITTED.to_vec());
        match store.reset("", b"k", &limit()).await {
            Err(StoreError::Backend(error)) => assert!(error.contains("TIME"), "{secs} {micros}: {error}"),
            other => panic!("TIME {secs} {micros}: {other:?}"),
        }
    }
    // A decision that is neither admitted nor denied, more remaining than the limit, a time
    // with a second's worth of nanoseconds or more.
    for (named, reply) in [
        ("allowed", [7, 10, 9, 0, 0, 1, 0, 1_700_000_000, 0]),
        ("remaining", [1, 10, 11, 0, 0, 1, 0, 1_700_000_000, 0]),
        ("nanoseconds", [1, 10, 9, 0, 0, 1, 0, 1_700_000_000, 1_000_000_000]),
    ] {
        let (_server, store) = answering(good_time.clone(), reply.to_vec());
        match store.check(b"k", &limit(), 1).await {
            Err(StoreError::Backend(error)) => assert!(error.contains(named), "{named}: {error}"),
            other => panic!("{named}: {other:?}"),
        }
    }
    let (_server, store) = answering(good_time.clone(), ADMITTED.to_vec());
    assert!(store.check(b"k", &limit(), 1).await.unwrap().allowed);
}

/// A check denied by a hold (allowed = 2) is told the rest of the hold, as its retry and its
/// reset: never nothing, never two different ends, never beyond the furthest instant the script
/// reads (104 days). Before, any such reply was taken: a lying server made a node hold a key for
/// 292 years (`i64::MAX` ns) in its own table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_hold_reply_fails_its_call() {
    let time = resp::array(&[resp::bulk("1700000000"), resp::bulk("0")]);
    let limit = limit();
    let check = tollgate_store::Check::new(b"k", &limit, 0).scoped("login").with_hold();
    for (retry, reset) in [(i64::MAX, i64::MAX), (9_000_000_000_000_001, 9_000_000_000_000_001), (0, 0), (5, 7)] {
        let reply = [2, 10, 0, retry, reset, 10, 0, 1_700_000_000, 0];
        let (_server, store) = answering(time.clone(), reply.to_vec());
        match store.held(&[check]).await {
            Err(StoreError::Backend(error)) => assert!(error.contains("hold"), "{retry} {reset}: {error}"),
            other => panic!("a hold of {retry} ns, reset in {reset}: {other:?}"),
        }
    }
    let furthest = 9_000_000_000_000_000;
    let (_server, store) = answering(time, [2, 10, 0, furthest, furthest, 10, 0, 1_700_000_000, 0].to_vec());
    assert_eq!(store.held(&[check]).await.unwrap(), [Some(9_000_000_000_000_000)]);
}

/// A hold is written to its end even when its caller stops waiting (the client that put its key
/// over hung up, and its request's future was dropped): here on a server that does not have the
/// hold's function yet (the first hold since Redis started), whose `FUNCTION LOAD` answers after
/// the caller left. Before: the call that was to follow the load was never sent (the Redis client
/// drops a queued command whose caller is gone), and no other node ever saw the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_caller_leaves_is_still_written() {
    let loaded = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = |c: &[Vec<u8>]| is(c, &["FCALL"]) && c.get(1).is_some_and(|f| f.ends_with(b"_hold"));
    let server = FakeRedis::start({
        let loaded = loaded.clone();
        move |command| {
            if held(command) && !loaded.load(std::sync::atomic::Ordering::SeqCst) {
                Answer::Raw(resp::error("ERR Function not found"))
            } else if held(command) {
                Answer::Raw(resp::array(&[resp::int(1_700_000_000), resp::int(0)]))
            } else if is(command, &["FUNCTION", "LOAD"]) {
                std::thread::sleep(Duration::from_millis(300));
                loaded.store(true, std::sync::atomic::Ordering::SeqCst);
                Answer::Raw(resp::bulk("tollgate"))
            } else {
                Answer::Raw(resp::error("ERR unknown command"))
            }
        }
    });
    let store = RedisStore::open(&format!("redis://{}", server.address()), options(Duration::from_secs(2))).unwrap();
    let hold = store.hold("login", b"198.51.100.7", 60_000_000_000);
    assert!(tokio::time::timeout(Duration::from_millis(100), hold).await.is_err(), "the caller left during the load");
    let deadline = Instant::now() + DEADLINE;
    while server.received().iter().filter(|c| held(c)).count() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let calls: Vec<String> = server.received().iter().map(|c| String::from_utf8_lossy(&c[0]).into_owned()).collect();
    assert_eq!(server.received().iter().filter(|c| held(c)).count(), 2, "the hold after the load: {calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granting_more_than_asked_fails() {
    use tollgate_store::lease::Lessor;
    let time = resp::array(&[resp::bulk("1700000000"), resp::bulk("0")]);
    let check = |limit| tollgate_store::Check::new(b"k", limit, 1);
    let limit = limit();
    // Units granted beyond what was asked (5), granted while denied, no lessee counted: a node
    // would lend itself units Redis never debited.
    for (named, tail) in [("granted", [1_000_000, 1]), ("granted", [u32::MAX.into(), 1]), ("lessees", [5, 0])] {
        let reply: Vec<i64> = ADMITTED.iter().copied().chain(tail).collect();
        let (_server, store) = answering(time.clone(), reply);
        match store.lease(check(&limit), 5, 1, Duration::from_secs(1)).await {
            Err(StoreError::Backend(error)) => assert!(error.contains(named), "{tail:?}: {error}"),
            other => panic!("{tail:?}: {other:?}"),
        }
    }
    let denied: Vec<i64> = [0, 10, 0, 5, 5, 10, 0, 1_700_000_000, 0, 3, 1].to_vec();
    let (_server, store) = answering(time.clone(), denied);
    match store.lease(check(&limit), 5, 1, Duration::from_secs(1)).await {
        Err(StoreError::Backend(error)) => assert!(error.contains("granted"), "{error}"),
        other => panic!("units granted with a denial: {other:?}"),
    }
    let reply: Vec<i64> = ADMITTED.iter().copied().chain([5, 1]).collect();
    let (_server, store) = answering(time, reply);
    let grant = store.lease(check(&limit), 5, 1, Duration::from_secs(1)).await.unwrap();
    assert_eq!((grant.granted, grant.lessees), (5, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_error_text_reaches_messages_bounded() {
    // A server's error line is its own choice of length: it reaches the logs and, for a key's
    // bad state, the client's error reply, at most a thousand characters of it.
    let long = "x".repeat(100_000);
    for (code, bad_state) in [("ERR", false), ("TOLLGATE_BADSTATE", true)] {
        let line = format!("{code} {long}");
        let server = FakeRedis::start(move |command| {
            if is(command, &["FCALL"]) { Answer::Raw(resp::error(&line)) } else { Answer::Raw(resp::simple("OK")) }
        });
        let store =
            RedisStore::open(&format!("redis://{}", server.address()), options(Duration::from_secs(2))).unwrap();
        let error = store.check(b"k", &limit(), 1).await.unwrap_err();
        assert_eq!(matches!(error, StoreError::BadState(_)), bad_state, "{code}");
        let text = error.to_string();
        assert!(text.len() < 1_100 && text.contains("xxxx") && text.ends_with('…'), "{code}: {} bytes", text.len());
    }
}
