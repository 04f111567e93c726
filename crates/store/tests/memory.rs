//! The memory store against the conformance suite, with real threads, and under a key flood.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::testkit;
use tollgate_store::{Algorithm, Check, Limit, ManualClock, MemoryStore, all_allowed};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

fn store_at(clock: Arc<ManualClock>) -> MemoryStore {
    MemoryStore::builder().clock(clock).build()
}

#[tokio::test]
async fn passes_the_conformance_suite() {
    testkit::conformance(store_at).await;
}

#[tokio::test]
async fn passes_the_conformance_suite_with_one_shard_and_a_tiny_bound() {
    // Every key shares one shard and evictions happen constantly: decisions must not change
    // while the number of keys stays below the bound.
    testkit::conformance(|clock| MemoryStore::builder().clock(clock).shards(1).max_keys(8).build()).await;
}

/// `threads` OS threads each calling `check_sync(key, limit, 1)` `calls` times.
fn hammer_threads(store: &Arc<MemoryStore>, limit: &Limit, threads: usize, calls: usize) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (store, admitted) = (store.clone(), admitted.clone());
            scope.spawn(move || {
                for _ in 0..calls {
                    if store.check_sync(b"hot", limit, 1).unwrap().allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    admitted.load(Ordering::Relaxed)
}

#[test]
fn sixty_four_threads_on_one_key_admit_exactly_the_bound() {
    for limit in testkit::hammer::limits() {
        let clock = Arc::new(ManualClock::new(T0));
        let store = Arc::new(store_at(clock.clone()));
        // 64 threads x 40 calls = 2,560 attempts on a frozen clock: exactly the capacity (1,000).
        assert_eq!(hammer_threads(&store, &limit, 64, 40), 1000, "{limit}: from idle");
        // One period later every algorithm has its full count back, except the sliding window
        // counter, which still weighs the previous window fully at its seam.
        clock.advance(Duration::from_secs(1));
        let expected = if limit.algorithm() == Algorithm::SlidingWindow { 0 } else { 1000 };
        assert_eq!(hammer_threads(&store, &limit, 64, 40), expected, "{limit}: one period later");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_bound() {
    for limit in testkit::hammer::limits() {
        let store = Arc::new(store_at(Arc::new(ManualClock::new(T0))));
        assert_eq!(testkit::hammer::tasks(store, "hot", &limit, 64, 40).await, 1000, "{limit}");
    }
}

#[test]
fn check_all_is_all_or_nothing_under_contention() {
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(store_at(clock));
    let shared = Limit::per_second(500).algorithm(Algorithm::FixedWindow).build().unwrap();
    let own = Limit::per_second(10).build().unwrap();
    let admitted = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for thread in 0..64 {
            let (store, shared, own, admitted) = (&store, &shared, &own, &admitted);
            scope.spawn(move || {
                let key = format!("user:{thread}");
                for _ in 0..20 {
                    let checks = [Check::new(b"global", shared, 1), Check::new(key.as_bytes(), own, 1)];
                    if all_allowed(&store.check_all_sync(&checks).unwrap()) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // Each user may pass 10 times; the global limit caps the total at 500; a denial by either
    // consumes nothing from the other.
    assert_eq!(admitted.load(Ordering::Relaxed), 500);
    let global = store.check_sync(b"global", &shared, 0).unwrap();
    assert_eq!(global.remaining, 0);
    let users: u64 =
        (0..64).map(|t| 10 - store.check_sync(format!("user:{t}").as_bytes(), &own, 0).unwrap().remaining).sum();
    assert_eq!(users, 500, "users were charged exactly for the admitted requests");
}

/// Floods `keys` distinct keys through a store bounded at `max_keys`; returns the store.
fn flood(limit: &Limit, keys: u64, max_keys: usize) -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).max_keys(max_keys).build();
    let mut key = String::new();
    for i in 0..keys {
        use std::fmt::Write;
        key.clear();
        let _ = write!(key, "flood:{i}");
        // 1 µs apart: with a 1-minute limit every key is still active when the bound is hit.
        clock.set(T0 + i * 1_000);
        assert!(store.check_sync(key.as_bytes(), limit, 1).unwrap().allowed, "a new key is always admitted");
        if i % 1_000_000 == 0 {
            assert!(store.len() <= max_keys, "{} keys after {i}", store.len());
        }
    }
    (store, clock)
}

#[test]
fn ten_million_keys_stay_under_the_cap() {
    let limit = Limit::per_minute(100).build().unwrap();
    let (store, _) = flood(&limit, 10_000_000, 100_000);
    assert!(store.len() <= 100_000, "{} keys", store.len());
    assert!(store.len() >= 95_000, "one live key is evicted per new key, not a batch");
    let per_key = store.bytes() / store.len();
    assert!(
        per_key <= 72,
        "{per_key} bytes per GCRA key (a 24-byte slot and the spare room of a table sized for its bound)"
    );
    let evictions = store.evictions();
    assert!(evictions.live > 9_000_000, "every key was live when evicted: {evictions:?}");
}

#[test]
fn idle_keys_are_evicted_before_active_ones() {
    let limit = Limit::per_second(1).algorithm(Algorithm::FixedWindow).build().unwrap();
    let (store, clock) = flood(&limit, 1_000, 1_000);
    // Every key's window has ended: the next keys replace idle ones, losslessly.
    clock.advance(Duration::from_secs(2));
    for i in 0..1_000 {
        store.check_sync(format!("fresh:{i}").as_bytes(), &limit, 1).unwrap();
    }
    assert!(store.len() <= 1_000);
    assert_eq!(store.evictions().live, 0, "{:?}", store.evictions());
    assert!(store.evictions().idle > 0);
}

#[test]
fn sliding_log_memory_is_bounded_by_count_and_accounted() {
    let limit = Limit::per_hour(1_000).algorithm(Algorithm::SlidingLog).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).max_keys(64).build();
    for i in 0..100 {
        for _ in 0..2_000 {
            clock.advance(Duration::from_micros(1));
            store.check_sync(format!("log:{i}").as_bytes(), &limit, 1).unwrap();
        }
    }
    assert!(store.len() <= 64);
    // At most 1,000 entries of 16 bytes per key (the log's deque may hold up to twice that).
    let bytes = store.bytes();
    assert!(bytes <= 64 * 2 * 1_000 * 16 + 64 * 1024, "{bytes} bytes");
    assert!(bytes >= store.len() * 1_000 * 16, "the entries are counted: {bytes} bytes");
}

#[test]
fn gcra_state_is_at_most_56_bytes_per_key_at_a_million_keys() {
    let limit = Limit::per_minute(100).build().unwrap();
    // A bound above the flood, so that exactly a million keys are tracked.
    let (store, _) = flood(&limit, 1_000_000, 2_000_000);
    assert_eq!(store.len(), 1_000_000);
    let per_key = store.bytes() as f64 / 1e6;
    println!("GCRA: {per_key:.1} bytes per key at 1,000,000 keys");
    assert!(per_key <= 56.0, "{per_key} bytes per key");
}

#[test]
fn a_system_clock_store_works_without_a_runtime() {
    let store = MemoryStore::new();
    let limit = Limit::per_second(2).build().unwrap();
    assert!(store.check_sync(b"k", &limit, 2).unwrap().allowed);
    assert!(!store.check_sync(b"k", &limit, 1).unwrap().allowed);
    assert!(tollgate_store::Clock::now_ns(&**store.clock()) > T0);
}

/// The old eviction dropped every key idle by the soonest-idle eighth's threshold: fixed-window
/// keys sharing one window end were all dropped at once (each one an over-grant). Now exactly as
/// many live keys as needed go, and each is counted.
#[test]
fn a_full_shard_evicts_one_live_key_per_new_key_even_when_they_share_an_idle_instant() {
    let limit = Limit::per_minute(5).algorithm(Algorithm::FixedWindow).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock).shards(1).max_keys(1_000).build();
    for i in 0..1_000 {
        store.check_sync(format!("k{i}").as_bytes(), &limit, 5).unwrap();
    }
    assert_eq!(store.len(), 1_000);
    store.check_sync(b"one more", &limit, 1).unwrap();
    assert_eq!(store.len(), 1_000, "one key made room for one key");
    assert_eq!(store.evictions(), tollgate_store::memory::Evictions { idle: 0, live: 1 });
    // Peeks, which create no state (a check of the evicted key would insert it and evict another).
    let still_full =
        (0..1_000).filter(|i| store.check_sync(format!("k{i}").as_bytes(), &limit, 0).unwrap().remaining == 0);
    assert_eq!(still_full.count(), 999, "every other key keeps its state");
}

/// Sub-window keys hold their ring (8 bytes per slice) and sliding logs their entries: the
/// byte budget bounds them whatever the key count allows.
#[test]
fn the_byte_budget_bounds_every_algorithms_state() {
    let clock = Arc::new(ManualClock::new(T0));
    let budget = 4 << 20;
    let store = MemoryStore::builder().clock(clock.clone()).max_memory(budget).build();
    let ring = Limit::per_hour(100).algorithm(Algorithm::SubWindow).slices(3600).build().unwrap();
    for i in 0..2_000 {
        store.check_sync(format!("ring:{i}").as_bytes(), &ring, 1).unwrap();
        assert!(store.bytes() <= budget + budget / 8, "{} bytes after {i} keys", store.bytes());
    }
    assert!(store.len() < 2_000, "28.8 KB per key: not all of them fit in 4 MiB");
    assert!(store.evictions().live > 0);
    let log = Limit::per_hour(100_000).algorithm(Algorithm::SlidingLog).build().unwrap();
    for i in 0..200_000u64 {
        clock.set(T0 + i);
        store.check_sync(format!("log:{}", i % 4).as_bytes(), &log, 1).unwrap();
    }
    assert!(store.bytes() <= budget + budget / 8 + 4 * 100_000 * 16, "{} bytes", store.bytes());
    assert_eq!(store.max_memory(), budget);
}

#[test]
fn eviction_is_amortised_constant_time_under_a_flood_of_live_keys() {
    // Each sweep is O(shard) and pays for an eighth of a shard of inserts: 2M inserts into a
    // 64k-key store take about as many slot visits as 16 sweeps per shard turnover, not 2M sweeps.
    let limit = Limit::per_minute(100).algorithm(Algorithm::SlidingWindow).build().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::builder().clock(clock.clone()).max_keys(1 << 16).build();
    let started = std::time::Instant::now();
    for i in 0..2_000_000u64 {
        clock.set(T0 + i);
        store.check_sync(&i.to_le_bytes(), &limit, 1).unwrap();
    }
    assert!(store.len() <= 1 << 16);
    assert!(store.evictions().live >= 2_000_000 - (1 << 16));
    println!("2M live keys through a 64k store: {:?}", started.elapsed());
}

#[test]
fn keys_are_bytes_and_scopes_keep_states_apart() {
    let store = store_at(Arc::new(ManualClock::new(T0)));
    let limit = Limit::per_minute(1).build().unwrap();
    for key in [&b"\xff\xfe"[..], b"\0", b"{x}", b"", b"plain"] {
        assert!(store.check_sync(key, &limit, 1).unwrap().allowed, "{key:?}");
        assert!(!store.check_sync(key, &limit, 1).unwrap().allowed, "{key:?}");
    }
    let api = [Check::new(b"plain", &limit, 1).scoped("api")];
    assert!(store.check_all_sync(&api).unwrap()[0].allowed, "the scope api has its own state for the key");
    assert!(!store.check_all_sync(&api).unwrap()[0].allowed);
    store.reset_sync("api", b"plain", &limit);
    assert!(store.check_all_sync(&api).unwrap()[0].allowed);
    assert!(!store.check_sync(b"plain", &limit, 1).unwrap().allowed, "the ad-hoc state was not reset");
}
