//! Reservations (`Store::reserve_until` → `Store::settle`) on the memory store and on real Redis
//! (a server, a 3-node Cluster with a reservation across slots, a primary killed between reserve
//! and settle): a settle above the estimate charged past the limit, one below refunded, each
//! exactly once; twice, after the deadline, an unknown or malformed id refused with its own
//! error, changing nothing; a reservation settled by another node (another connection) than the
//! one that made it; both stores deciding the same scenario identically; and a concurrent burst
//! of N clients (reserve → settle) whose total stays within the documented bound, each settle
//! counted once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::remote::Remote;
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::testkit::redis_topology::RedisCluster;
use tollgate_store::{
    Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Refusal, Store, StoreError, TimeSource,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store, so that tests sharing a server never meet.
fn options(clock: Option<Arc<ManualClock>>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("r{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: clock.map_or(TimeSource::Server, |c| TimeSource::Clock(c)),
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

fn hourly() -> Limit {
    Limit::per_hour(100).algorithm(Algorithm::FixedWindow).build().unwrap()
}

fn bucket() -> Limit {
    Limit::per_hour(100).algorithm(Algorithm::TokenBucket).burst(100).build().unwrap()
}

/// The key's remaining under both limits.
async fn remaining<S: Store>(store: &S, key: &[u8]) -> (u64, u64) {
    let a = store.check_one(Check::new(key, &hourly(), 0).scoped("a")).await.unwrap().remaining;
    let b = store.check_one(Check::new(key, &bucket(), 0).scoped("b")).await.unwrap().remaining;
    (a, b)
}

fn refusal(result: Result<impl std::fmt::Debug, StoreError>) -> Refusal {
    match result {
        Err(StoreError::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The scenario every store runs; what it read, for comparing stores.
async fn settles_exactly<S: Store>(store: &S, clock: &ManualClock, key: &[u8]) -> Vec<String> {
    let (a, b) = (hourly(), bucket());
    let checks = |cost| vec![Check::new(key, &a, cost).scoped("a"), Check::new(key, &b, cost).scoped("b")];
    let mut seen = Vec::new();

    // Lower: 30 reserved, 10 actual → 20 refunded on both limits.
    let (reserved, reservation) = store.reserve_until(&checks(30), 10 * SEC).await.unwrap();
    assert!(reserved.decisions.iter().all(|d| d.allowed), "{reserved:?}");
    let reservation = reservation.expect("an admitted reserve opens a reservation");
    assert_eq!(reservation.deadline_ns, T0 + 10 * SEC);
    assert_eq!(remaining(store, key).await, (70, 70));
    let settled = store.settle(&reservation.id, 10).await.unwrap();
    assert_eq!((settled.estimate, settled.actual), (30, 10));
    assert_eq!(remaining(store, key).await, (90, 90));
    seen.push(format!("{:?}", remaining(store, key).await));

    // Twice: refused, nothing changes.
    let again = refusal(store.settle(&reservation.id, 0).await);
    assert_eq!(again, Refusal::AlreadySettled(reservation.id.clone()));
    assert_eq!(again.to_string(), format!("reservation {} was settled already", reservation.id));
    assert_eq!(remaining(store, key).await, (90, 90));

    // Higher: 80 reserved, 150 actual → 70 more, charged past the limit: the next request pays.
    let (_, reservation) = store.reserve_until(&checks(80), 10 * SEC).await.unwrap();
    let reservation = reservation.unwrap();
    assert_eq!(remaining(store, key).await, (10, 10));
    store.settle(&reservation.id, 150).await.unwrap();
    assert_eq!(remaining(store, key).await, (0, 0));
    let next = store.reserve_until(&checks(1), 10 * SEC).await.unwrap();
    assert!(next.1.is_none() && next.0.decisions.iter().all(|d| !d.allowed), "{next:?}");
    seen.push(format!("{:?}", next.0.decisions));

    // Expired: a reservation never settled stays counted at its estimate; a settle after its
    // deadline is refused.
    clock.set(T0 + 3_600 * SEC);
    let (_, reservation) = store.reserve_until(&checks(40), SEC).await.unwrap();
    let reservation = reservation.unwrap();
    clock.advance(Duration::from_secs(2));
    assert_eq!(refusal(store.settle(&reservation.id, 0).await), Refusal::Expired(reservation.id.clone()));
    let after = remaining(store, key).await;
    assert_eq!(after.0, 0, "the fixed window still counts the estimate, 40, beside the 60 the hour before carried");
    seen.push(format!("{after:?}"));

    // Unknown and malformed ids.
    let unknown = format!("{}.{}", "0".repeat(32), (T0 + 3_700 * SEC) / 1_000_000);
    assert_eq!(refusal(store.settle(&unknown, 1).await), Refusal::Unknown(unknown.clone()));
    assert!(matches!(refusal(store.settle("not-an-id", 1).await), Refusal::Malformed(_)));
    assert!(matches!(refusal(store.settle(&reservation.id, 1 << 60).await), Refusal::TooLarge(_)));

    // All or nothing: one check denies, nothing is charged and no reservation opens.
    let before = remaining(store, key).await;
    let tight = Limit::per_hour(5).algorithm(Algorithm::FixedWindow).build().unwrap();
    let mixed = vec![Check::new(key, &a, 10).scoped("a"), Check::new(key, &tight, 10).scoped("t")];
    let denied = store.reserve_until(&mixed, SEC).await;
    assert!(matches!(denied, Err(StoreError::Limit(_))), "a cost above a capacity is an error: {denied:?}");
    let mixed = vec![Check::new(key, &a, 3).scoped("a"), Check::new(key, &tight, 3).scoped("t")];
    store.check_one(Check::new(key, &tight, 4).scoped("t")).await.unwrap();
    let denied = store.reserve_until(&mixed, SEC).await.unwrap();
    assert!(denied.1.is_none() && !denied.0.decisions[1].allowed, "{denied:?}");
    assert_eq!(remaining(store, key).await, before);
    seen
}

#[tokio::test]
async fn memory_settles_each_reservation_exactly_once() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    settles_exactly(&store, &clock, b"user:1").await;
}

#[tokio::test]
async fn redis_settles_each_reservation_exactly_once_and_as_the_memory_store_does() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap();
    let on_redis = settles_exactly(&redis, &clock, b"user:1").await;
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    assert_eq!(settles_exactly(&memory, &clock, b"user:1").await, on_redis);
}

#[tokio::test]
async fn a_reservation_made_by_one_node_is_settled_by_another_once() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let first = RedisStore::open(&server.url(), options(Some(clock))).unwrap();
    // Another process: its own connection, the same keys.
    let second = RedisStore::open(&server.url(), first.options().clone()).unwrap();
    let limit = hourly();
    let (_, reservation) = first.reserve_until(&[Check::new(b"k", &limit, 50)], 60 * SEC).await.unwrap();
    let id = reservation.unwrap().id;
    drop(first);
    assert_eq!(second.settle(&id, 20).await.unwrap().estimate, 50);
    assert_eq!(second.peek(b"k", &limit).await.unwrap().remaining, 80);
    let third = RedisStore::open(&server.url(), second.options().clone()).unwrap();
    assert_eq!(refusal(third.settle(&id, 20).await), Refusal::AlreadySettled(id.clone()));
    assert_eq!(third.peek(b"k", &limit).await.unwrap().remaining, 80);
    // The record and its tombstone carry a TTL.
    let records = server.cli(&["--scan", "--pattern", &format!("{}:rsv:*", second.options().prefix)]);
    let record = records.lines().next().expect("the tombstone is kept until the deadline").to_string();
    let ttl: i64 = server.cli(&["PTTL", &record]).trim().parse().unwrap();
    // 60 s, a second to tell a late settle it expired, and a caller-side clock's 60 s margin.
    assert!(ttl > 60_000 && ttl <= 121_000, "{ttl}");
}

#[tokio::test]
async fn a_reservation_survives_a_redis_restart_only_as_charged_or_gone() {
    // A settle sent while Redis is down fails as the backend's error (and may be sent again);
    // once Redis is back with its data (appendonly), the same settle applies once.
    let mut server = RedisServer::start_with(tollgate_store::testkit::redis_server::ServerConfig {
        lines: vec!["appendonly yes".into(), "appendfsync always".into()],
        ..Default::default()
    });
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::open(&server.url(), options(Some(clock))).unwrap();
    let limit = hourly();
    let (_, reservation) = store.reserve_until(&[Check::new(b"k", &limit, 50)], 60 * SEC).await.unwrap();
    let id = reservation.unwrap().id;
    server.kill();
    let failed = store.settle(&id, 70).await;
    assert!(matches!(&failed, Err(e) if e.is_backend()), "{failed:?}");
    server.restart();
    let mut settled = None;
    for _ in 0..200 {
        match store.settle(&id, 70).await {
            Ok(s) => {
                settled = Some(s);
                break;
            }
            Err(e) if e.is_backend() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(settled.expect("settled once Redis is back").actual, 70);
    assert_eq!(store.peek(b"k", &limit).await.unwrap().remaining, 30);
    assert_eq!(refusal(store.settle(&id, 70).await), Refusal::AlreadySettled(id));
}

#[tokio::test]
async fn a_cluster_settles_a_reservation_across_slots_once_even_sent_again_part_way() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start).await.unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::open_cluster(&cluster.urls(), options(Some(clock))).await.unwrap();
    let limit = hourly();
    // Keys in different slots: one record per slot, each settled in its slot.
    let keys: [&[u8]; 3] = [b"alpha", b"beta", b"gamma"];
    let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, &limit, 40)).collect();
    let (_, reservation) = store.reserve_until(&checks, 60 * SEC).await.unwrap();
    let id = reservation.unwrap().id;
    assert!(id.split('.').count() >= 4, "one slot per key: {id}");
    // A first settle that reached the slot of "alpha" only (its record made the tombstone, as the
    // settle script leaves it), then failed: sent again, it settles the other slots.
    let alpha = cluster.slot_of(b"alpha");
    let node = &cluster.nodes()[cluster.primary_of(alpha).unwrap()];
    let pattern = format!("{}:rsv:*", store.options().prefix);
    let records = node.cli(&["--scan", "--pattern", &pattern]);
    let record = records.lines().find(|r| cluster.slot_of(r.as_bytes()) == alpha).expect("alpha's record").to_string();
    assert_eq!(node.cli(&["SET", &record, "settled", "KEEPTTL"]).trim(), "OK");
    let other = RedisStore::open_cluster(&cluster.urls(), store.options().clone()).await.unwrap();
    other.settle(&id, 55).await.unwrap();
    for (key, remaining) in [(keys[0], 60), (keys[1], 45), (keys[2], 45)] {
        assert_eq!(store.peek(key, &limit).await.unwrap().remaining, remaining, "{key:?}");
    }
    assert_eq!(refusal(store.settle(&id, 0).await), Refusal::AlreadySettled(id));
}

/// What a burst did: reservations admitted, their estimates and actuals, and the key's count.
#[derive(Debug, Default)]
struct Burst {
    admitted: u64,
    denied: u64,
    estimates: u64,
    actuals: u64,
    under: u64,
}

/// `clients` clients at once, each `rounds` times: reserve `estimate`, settle a pseudo-random
/// actual in [0, 2 × estimate]. Checks the bound and exactness against the key's count.
fn check_burst(burst: &Burst, used: u64, capacity: u64) {
    eprintln!("burst: {burst:?}, counted {used}, capacity {capacity}");
    assert_eq!(used, burst.actuals, "each settle counted exactly once");
    assert!(
        burst.actuals <= capacity + burst.under,
        "over-granted beyond the bound: {} > {capacity} + {}",
        burst.actuals,
        burst.under
    );
    assert!(burst.admitted > 0 && burst.denied > 0, "the burst met the limit: {burst:?}");
}

fn actual_of(client: u64, round: u64, estimate: u64) -> u64 {
    (client.wrapping_mul(7919) ^ round.wrapping_mul(104_729)) % (2 * estimate + 1)
}

#[test]
fn a_burst_of_threads_never_over_grants_beyond_the_under_estimates_on_memory() {
    let store = Arc::new(MemoryStore::builder().clock(Arc::new(ManualClock::new(T0))).build());
    let limit = Limit::per_hour(1_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    let (clients, rounds, estimate) = (32u64, 20u64, 10u64);
    let totals = Arc::new(std::sync::Mutex::new(Burst::default()));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let (store, limit, totals) = (store.clone(), limit.clone(), totals.clone());
            std::thread::spawn(move || {
                for round in 0..rounds {
                    let (reserved, reservation) =
                        store.reserve_until_sync(&[Check::new(b"burst", &limit, estimate)], 60 * SEC).unwrap();
                    let Some(reservation) = reservation else {
                        assert!(!reserved.decisions[0].allowed);
                        totals.lock().unwrap().denied += 1;
                        continue;
                    };
                    let actual = actual_of(client, round, estimate);
                    store.settle_sync(&reservation.id, actual).unwrap();
                    let mut t = totals.lock().unwrap();
                    t.admitted += 1;
                    t.estimates += estimate;
                    t.actuals += actual;
                    t.under += actual.saturating_sub(estimate);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reply = runtime.block_on(store.decide(&[Check::new(b"burst", &limit, 0)], &[])).unwrap();
    check_burst(&totals.lock().unwrap(), reply.snapshots[0].used, limit.capacity());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_clients_never_over_grants_beyond_the_under_estimates_on_redis() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(RedisStore::open(&server.url(), options(Some(clock))).unwrap());
    let limit = Limit::per_hour(1_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    let (clients, rounds, estimate) = (32u64, 20u64, 10u64);
    let totals = Arc::new(std::sync::Mutex::new(Burst::default()));
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            let (store, limit, totals) = (store.clone(), limit.clone(), totals.clone());
            tokio::spawn(async move {
                for round in 0..rounds {
                    let (reserved, reservation) =
                        store.reserve_until(&[Check::new(b"burst", &limit, estimate)], 60 * SEC).await.unwrap();
                    let Some(reservation) = reservation else {
                        assert!(!reserved.decisions[0].allowed);
                        totals.lock().unwrap().denied += 1;
                        continue;
                    };
                    let actual = actual_of(client, round, estimate);
                    store.settle(&reservation.id, actual).await.unwrap();
                    let mut t = totals.lock().unwrap();
                    t.admitted += 1;
                    t.estimates += estimate;
                    t.actuals += actual;
                    t.under += actual.saturating_sub(estimate);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let reply = store.decide(&[Check::new(b"burst", &limit, 0)], &[]).await.unwrap();
    check_burst(&totals.lock().unwrap(), reply.snapshots[0].used, limit.capacity());
}

/// A Redis Cluster primary killed (SIGKILL) between reserve and settle, once what it holds reached
/// its replica: the promoted replica has the reservations; one is settled once through the
/// failover (a settle refused by the dying primary's failure may be sent again), the other, never
/// settled, stays charged at its estimate and is refused after its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_outlives_its_primary_killed_between_reserve_and_settle() {
    use tollgate_store::testkit::redis_topology::ClusterConfig;
    let config = ClusterConfig {
        replicas: 1,
        node_timeout_ms: 1000,
        lines: vec!["cluster-require-full-coverage no".into()],
        ..ClusterConfig::default()
    };
    let cluster = Arc::new(std::sync::Mutex::new(
        tokio::task::spawn_blocking(move || RedisCluster::start_with(config)).await.unwrap(),
    ));
    let urls = cluster.lock().unwrap().urls();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::open_cluster(&urls, options(Some(clock.clone()))).await.unwrap();
    let limit = hourly();
    let settled = store.reserve_until(&[Check::new(b"k", &limit, 40)], 60 * SEC).await.unwrap().1.unwrap().id;
    let never = store.reserve_until(&[Check::new(b"k", &limit, 20)], 60 * SEC).await.unwrap().1.unwrap().id;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        let mut guard = c.lock().unwrap();
        let slot = guard.slot_of(b"{k}");
        let victim = guard.primary_of(slot).unwrap();
        let port = guard.nodes()[victim].port().to_string();
        // Wait until the replica has everything its primary wrote (their replication offsets).
        let offset = |role: &str, line: usize| role.lines().nth(line).and_then(|l| l.trim().parse::<u64>().ok());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let primary = offset(&guard.nodes()[victim].cli(&["ROLE"]), 1);
            let replica = guard
                .nodes()
                .iter()
                .map(|n| n.cli(&["ROLE"]))
                .find(|r| r.starts_with("slave") && r.lines().nth(2).is_some_and(|p| p.trim() == port));
            if primary.is_some() && replica.as_deref().and_then(|r| offset(r, 4)) >= primary {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the replica never caught up");
            std::thread::sleep(Duration::from_millis(10));
        }
        guard.nodes_mut()[victim].kill();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while guard.primary_of(slot).is_none_or(|p| p == victim) {
            assert!(std::time::Instant::now() < deadline, "no replica promoted within 30 s");
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .unwrap();
    // Through the failover: the store follows the new primary; a settle failing meanwhile (the
    // backend's error) is sent again, and applies once.
    let mut answer = Err(StoreError::Backend("not sent".into()));
    for _ in 0..300 {
        answer = store.settle(&settled, 55).await;
        if !matches!(&answer, Err(e) if e.is_backend()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answer.unwrap().actual, 55);
    assert_eq!(refusal(store.settle(&settled, 55).await), Refusal::AlreadySettled(settled));
    assert_eq!(store.peek(b"k", &limit).await.unwrap().remaining, 100 - 55 - 20);
    clock.advance(Duration::from_secs(61));
    assert_eq!(refusal(store.settle(&never, 0).await), Refusal::Expired(never));
    assert_eq!(store.peek(b"k", &limit).await.unwrap().remaining, 25, "expired as charged");
}

/// The memory store keeps at most `MAX_OPEN_RESERVATIONS`: past it a reserve is refused, charging
/// nothing, until some reach their deadline.
#[tokio::test]
async fn the_memory_store_bounds_its_open_reservations() {
    use tollgate_store::memory::MAX_OPEN_RESERVATIONS;
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limit = Limit::per_hour(1_000_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    for _ in 0..MAX_OPEN_RESERVATIONS {
        assert!(store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], SEC).unwrap().1.is_some());
    }
    assert_eq!(store.reservations(), MAX_OPEN_RESERVATIONS);
    let full = store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], SEC);
    assert!(matches!(full, Err(StoreError::Refused(Refusal::Full(n))) if n == MAX_OPEN_RESERVATIONS), "{full:?}");
    assert_eq!(store.peek(b"k", &limit).await.unwrap().remaining, 1_000_000 - 100_000, "nothing charged");
    clock.advance(Duration::from_secs(2));
    assert!(store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], SEC).unwrap().1.is_some());
    assert_eq!(store.reservations(), 1, "those past their deadline dropped");
}

/// An id whose deadline part was changed names no reservation: not even one whose deadline has
/// passed, whose record Redis keeps a while longer to tell a late settle "expired". Changing the
/// deadline must not turn an expired reservation (charged at its estimate) into a refund.
async fn a_changed_deadline_settles_nothing<S: Store>(store: &S, clock: &ManualClock) {
    let limit = hourly();
    let (_, reservation) = store.reserve_until(&[Check::new(b"forged", &limit, 100)], SEC).await.unwrap();
    let id = reservation.expect("admitted").id;
    clock.advance(Duration::from_secs(2));
    let mut parts: Vec<String> = id.split('.').map(str::to_string).collect();
    let extended = parts[1].parse::<u64>().unwrap() + 3_600_000;
    parts[1] = extended.to_string();
    let forged = parts.join(".");
    let answer = store.settle(&forged, 0).await;
    assert!(
        matches!(answer, Err(StoreError::Refused(Refusal::Unknown(_) | Refusal::Expired(_)))),
        "a settle of {forged} (the deadline of {id} moved an hour on, after that deadline) must be refused, got {answer:?}"
    );
    assert_eq!(
        store.peek(b"forged", &limit).await.unwrap().remaining,
        0,
        "the expired reservation stays charged at its estimate (a changed id refunded it)"
    );
    assert_eq!(refusal(store.settle(&id, 0).await), Refusal::Expired(id.clone()));
}

#[tokio::test]
async fn memory_a_settle_with_its_deadline_part_changed_settles_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    a_changed_deadline_settles_nothing(&store, &clock).await;
}

#[tokio::test]
async fn redis_a_settle_with_its_deadline_part_changed_settles_nothing() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(T0));
    let store = RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap();
    a_changed_deadline_settles_nothing(&store, &clock).await;
}

/// A reservation of an estimate of 0 is a peek, admitted whatever the state: on a key past its
/// limit it must not open a reservation, whose settle would then charge any actual without the
/// limit ever having admitted anything ("an estimate never too low keeps the key within its
/// limit": an estimate of 0 would bypass admission altogether).
#[tokio::test]
async fn a_reservation_of_nothing_is_not_opened_on_a_key_past_its_limit() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limit = hourly();
    store.check_one(Check::new(b"spent", &limit, 100)).await.unwrap();
    let zero = store.reserve_until(&[Check::new(b"spent", &limit, 0)], 60 * SEC).await;
    if let Ok((reserved, Some(reservation))) = &zero {
        let settled = store.settle(&reservation.id, 1_000).await;
        panic!(
            "an estimate of 0 on a key with nothing left opened {reservation:?} ({reserved:?}); its settle of 1,000 \
             answered {settled:?} (1,000 charged past a limit that admitted nothing); expected no reservation \
             (denied, or refused as an estimate below 1)"
        );
    }
}

/// The memory store's reservations keep each check's key: they count against the store's
/// `max_memory` bound, as its states do, rather than growing to `MAX_OPEN_RESERVATIONS` records of
/// any key's size (16 checks of a 16 KiB key each: 25 GiB at 100,000 reservations).
#[tokio::test]
async fn the_memory_stores_reservations_are_bounded_by_its_memory() {
    let clock = Arc::new(ManualClock::new(T0));
    let max_memory = 8 << 20;
    let store = MemoryStore::builder().clock(clock.clone()).max_memory(max_memory).build();
    let limit = Limit::per_hour(1_000_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    let key = vec![b'k'; 16 * 1024];
    let scopes: Vec<String> = (0..16).map(|i| format!("s{i}")).collect();
    let checks: Vec<Check<'_>> = scopes.iter().map(|s| Check::new(&key, &limit, 1).scoped(s)).collect();
    let per_reservation = checks.len() * key.len();
    let mut opened = 0;
    // Up to 4 times the memory bound in keys alone.
    while opened * per_reservation <= 4 * max_memory {
        match store.reserve_until_sync(&checks, 3_600 * SEC) {
            Ok((_, Some(_))) => opened += 1,
            _ => break,
        }
    }
    assert!(
        opened * per_reservation <= max_memory,
        "{opened} reservations kept {} bytes of keys (beyond the states) in a store bounded to {max_memory} bytes",
        opened * per_reservation
    );
}

/// A reserve whose decision ran but whose record could not be written (here an ACL that lets the
/// states be written but not the record; in life a failover's read-only replica, an OOM) fails
/// with the backend's error: the caller is told to try again (HTTP 503) but holds no
/// reservation, and each attempt keeps its estimate charged. The store knows the decision ran:
/// it must take its estimate back (every charge applied once, principle 11), not leave the key
/// paying for reservations nobody holds.
#[tokio::test]
async fn a_reserve_whose_record_cannot_be_written_keeps_nothing_charged() {
    let server = RedisServer::start();
    let options = options(None);
    let prefix = options.prefix.clone();
    let acl = server.cli(&["ACL", "SETUSER", "norecord", "on", ">pw", &format!("~{prefix}:[^r]*"), "+@all"]);
    assert_eq!(acl.trim(), "OK");
    let url = format!("redis://norecord:pw@{}", server.address());
    let store = RedisStore::open(&url, options).unwrap();
    let limit = hourly();
    let failed = store.reserve_until(&[Check::new(b"k", &limit, 40)], 60 * SEC).await;
    assert!(matches!(&failed, Err(e) if e.is_backend()), "the record's write fails: {failed:?}");
    let peek = store.peek(b"k", &limit).await.unwrap();
    assert_eq!(
        peek.remaining, 100,
        "a reserve that failed after its decision (no reservation, told to try again) left its estimate of 40 \
         charged: {peek:?}"
    );
}

/// The memory store keeps reservations "open, or settled and not past their deadline": those
/// past it are dropped (their checks hold each key), not kept until the table is full.
#[tokio::test]
async fn the_memory_store_drops_reservations_past_their_deadline() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limit = Limit::per_hour(1_000).algorithm(Algorithm::FixedWindow).build().unwrap();
    for _ in 0..3 {
        assert!(store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], SEC).unwrap().1.is_some());
    }
    let settled = store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], SEC).unwrap().1.unwrap();
    store.settle_sync(&settled.id, 1).unwrap();
    clock.advance(Duration::from_secs(2));
    let (_, kept) = store.reserve_until_sync(&[Check::new(b"k", &limit, 1)], 60 * SEC).unwrap();
    assert!(kept.is_some());
    assert_eq!(
        store.reservations(),
        1,
        "past their deadline, 4 reservations (3 open, 1 settled) are still kept beside the one open"
    );
}

/// "An id whose parts were changed names no reservation": another spelling of an id (its token in
/// upper case, its deadline with a `+` or leading zeros, slots added) is refused, and the id as
/// the store made it settles afterwards. (Accepted spellings also keep an engine following the
/// reservation as open, then counting it expired, though it was settled.)
async fn other_spellings_of_an_id_settle_nothing<S: Store>(store: &S) {
    let limit = hourly();
    let (_, reservation) = store.reserve_until(&[Check::new(b"spelled", &limit, 10)], 60 * SEC).await.unwrap();
    let id = reservation.expect("admitted").id;
    let mut parts = id.splitn(3, '.');
    let (token, deadline, slots) = (parts.next().unwrap(), parts.next().unwrap(), parts.next());
    let slots = slots.map_or(String::new(), |s| format!(".{s}"));
    for spelling in [
        format!("{}.{deadline}{slots}", token.to_uppercase()),
        format!("{token}.+{deadline}{slots}"),
        format!("{token}.00{deadline}{slots}"),
        format!("{id}.{}", if slots.is_empty() { "5" } else { &slots[1..] }),
    ] {
        let answer = store.settle(&spelling, 0).await;
        assert!(
            matches!(answer, Err(StoreError::Refused(Refusal::Unknown(_) | Refusal::Malformed(_)))),
            "{spelling:?}, another spelling of {id:?}, must name no reservation: got {answer:?}"
        );
    }
    assert_eq!(store.settle(&id, 0).await.unwrap().estimate, 10);
}

#[tokio::test]
async fn memory_other_spellings_of_an_id_settle_nothing() {
    let store = MemoryStore::builder().clock(Arc::new(ManualClock::new(T0))).build();
    other_spellings_of_an_id_settle_nothing(&store).await;
}

#[tokio::test]
async fn redis_other_spellings_of_an_id_settle_nothing() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(Some(Arc::new(ManualClock::new(T0))))).unwrap();
    other_spellings_of_an_id_settle_nothing(&store).await;
}

/// A settle refused "no open reservation" changes nothing: an id with a slot added (one the
/// store never wrote a record in) must not settle the slots it did write before it is refused:
/// the caller is told nothing happened, and the reservation's own id is then told "settled
/// already".
#[tokio::test]
async fn redis_a_settle_refused_unknown_for_an_added_slot_changes_nothing() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(Some(Arc::new(ManualClock::new(T0))))).unwrap();
    let limit = hourly();
    let (_, reservation) = store.reserve_until(&[Check::new(b"slots", &limit, 50)], 60 * SEC).await.unwrap();
    let id = reservation.expect("admitted").id;
    let added = format!("{id}.5");
    let answer = store.settle(&added, 0).await;
    let remaining = store.peek(b"slots", &limit).await.unwrap().remaining;
    assert!(
        matches!(&answer, Err(StoreError::Refused(Refusal::Unknown(_) | Refusal::Malformed(_)))) && remaining == 50,
        "a settle of {added:?} answered {answer:?} and left {remaining} remaining (50 before: a refusal that refunded)"
    );
    assert_eq!(store.settle(&id, 0).await.unwrap().estimate, 50, "the reservation itself still open");
}
