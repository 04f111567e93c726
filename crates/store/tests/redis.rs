//! The Redis store against real `redis-server` processes and a real 3-node Redis Cluster:
//! the conformance suite, decisions identical to the memory store across the whole range a
//! `Limit` accepts, zero over-grant under 64 concurrent tasks, a TTL on every key, and bad keys
//! failing alone. The failure policy over a killed, paused and frozen Redis is in
//! `tests/redis_outage.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{MAX_PERIOD_NS, Snapshot};
use tollgate_store::remote::{Charge, MAX_CHARGE_TOTAL, Origin, Remote};
use tollgate_store::testkit::random::{Rng, random_calendar_limit, random_limit};
use tollgate_store::testkit::{
    self,
    redis_server::{RedisServer, ServerConfig},
    redis_topology::ClusterConfig,
    redis_topology::RedisCluster,
};
use tollgate_store::{
    Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, Refund, Store, StoreError, TimeSource,
    all_allowed,
};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store, so that tests and traces share one server without meeting.
fn options(clock: Option<Arc<ManualClock>>) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time: clock.map_or(TimeSource::Server, |c| TimeSource::Clock(c)),
        // Generous for loaded CI machines.
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

#[tokio::test]
async fn single_server_passes_the_conformance_suite() {
    let server = RedisServer::start();
    let url = server.url();
    testkit::conformance(|clock| RedisStore::open(&url, options(Some(clock))).unwrap()).await;
}

#[tokio::test]
async fn cluster_passes_the_conformance_suite_and_refuses_cross_slot_checks() {
    // With replicas and the native module loaded: the script and the module each pass the suite,
    // and what the module writes reaches the replicas.
    let module = testkit::redis_server::module_path();
    let config = ClusterConfig {
        replicas: 1,
        lines: vec![format!("loadmodule {}", module.display())],
        ..ClusterConfig::default()
    };
    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_with(config)).await.unwrap();
    let base = RedisStore::open_cluster(&cluster.urls(), options(None)).await.unwrap();
    testkit::conformance(|clock| base.with_options(options(Some(clock))).unwrap()).await;
    testkit::conformance(|clock| base.with_options(RedisOptions { module: true, ..options(Some(clock)) }).unwrap())
        .await;
    let native = base.with_options(RedisOptions { module: true, ..options(None) }).unwrap();
    let gcra = Limit::per_minute(5).build().unwrap();
    assert_eq!(native.check(b"replicated", &gcra, 2).await.unwrap().remaining, 3);
    let key = String::from_utf8(native.state_key("", b"replicated", &gcra).unwrap()).unwrap();
    let primary = &cluster.nodes()[cluster.primary_of(cluster.slot_of(key.as_bytes())).unwrap()];
    let value = primary.cli(&["GET", &key]);
    let port = primary.port().to_string();
    let replica = cluster
        .nodes()
        .iter()
        .find(|n| {
            let role = n.cli(&["ROLE"]);
            let role: Vec<&str> = role.lines().collect();
            role.first() == Some(&"slave") && role.get(2) == Some(&port.as_str())
        })
        .expect("the primary's replica");
    // A replica answers reads on a connection that said READONLY; replication is asynchronous.
    let on_replica = || {
        let mut read = std::process::Command::new("redis-cli")
            .args(replica.cli_args())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        writeln!(read.stdin.take().unwrap(), "READONLY\nGET {key}").unwrap();
        let out = String::from_utf8(read.wait_with_output().unwrap().stdout).unwrap();
        out.lines().nth(1).unwrap_or("").to_string()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while on_replica() != value.trim() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(on_replica(), value.trim(), "the replica holds what the module wrote");
    assert!(value.trim().len() >= 19, "{value}");

    let limit = Limit::per_second(5).build().unwrap();
    let same_tag = [Check::new(b"{u1}:a", &limit, 1), Check::new(b"{u1}:b", &limit, 1)];
    assert!(base.check_all(&same_tag).await.unwrap().iter().all(|d| d.allowed));
}

/// Before: keys in different Cluster slots were refused (`CrossSlot`), and the middleware then
/// let the request through unlimited. Now they are decided slot by slot, all or nothing: what the
/// first slots admitted is refunded when a later one denies.
#[tokio::test]
async fn a_cluster_decides_keys_in_different_slots_all_or_nothing() {
    let cluster = RedisCluster::start();
    let store = RedisStore::open_cluster(&cluster.urls(), options(None)).await.unwrap();
    let (hourly, one) = (Limit::per_hour(100).build().unwrap(), Limit::per_hour(1).build().unwrap());
    // "a", "b" and "c" hash to three slots on three nodes.
    for algorithm in Algorithm::ALL {
        let many = Limit::per_hour(100).algorithm(algorithm).build().unwrap();
        let key = format!("a-{algorithm}");
        let checks = [Check::new(key.as_bytes(), &many, 3), Check::new(b"b", &hourly, 1), Check::new(b"c", &one, 1)];
        assert!(all_allowed(&store.check_all(&checks).await.unwrap()), "{algorithm}: first call");
        let denied = store.check_all(&checks).await.unwrap();
        let answers: Vec<(bool, u64)> = denied.iter().map(|d| (d.allowed, d.remaining)).collect();
        assert_eq!(answers, [(true, 97), (true, 99), (false, 0)], "{algorithm}: the first two report as peeks");
        let a = store.peek(key.as_bytes(), &many).await.unwrap();
        assert_eq!(a.remaining, 97, "{algorithm}: the second call's 3 were given back");
        store.reset("", b"c", &one).await.unwrap();
        store.reset("", b"b", &hourly).await.unwrap();
    }
    let b = store.peek(b"b", &hourly).await.unwrap();
    assert_eq!(b.remaining, 100);
}

/// Redis decides exactly as the memory store, on every field of every decision and of every
/// snapshot, across the whole range `Limit` accepts, with limits changing on live keys, clocks
/// going backwards and charges. Before: the script clamped instants to ±46 days (a 30-day sliding
/// window lost its previous window), read sub-window slices as numbers (a key seen under two slice
/// lengths was pinned for centuries), and rewrote the whole sliding log (lost beyond ~8,000 entries).
#[tokio::test]
async fn decides_exactly_like_the_memory_store_across_the_whole_range() {
    differential(&RedisServer::start(), false).await;
}

/// The same, on a server with tollgate's native module loaded (`tollgate-redis-module`): the
/// store sends it every lone check of its algorithms, the script every other call, on the same keys.
#[tokio::test]
async fn the_native_module_decides_exactly_like_the_script_and_the_memory_store() {
    let server = module_server();
    testkit::conformance(|clock| {
        RedisStore::open(&server.url(), RedisOptions { module: true, ..options(Some(clock)) }).unwrap()
    })
    .await;
    differential(&server, true).await;
    let stats = server.cli(&["info", "commandstats"]);
    let calls = |name: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // (Calendar limits go to the script: the module has no time zones.)
    assert!(calls("tollgate.check") > 500 && calls("fcall") > 1_000, "{stats}");
    // What the module writes is what the script writes: the same value, the same TTL.
    let clock = Arc::new(ManualClock::new(T0));
    let exact = |module| RedisOptions { module, clock_skew_margin: Duration::ZERO, ..options(Some(clock.clone())) };
    let (native, script) =
        (RedisStore::open(&server.url(), exact(true)).unwrap(), RedisStore::open(&server.url(), exact(false)).unwrap());
    let limit = Limit::per_minute(5).build().unwrap();
    native.check(b"same", &limit, 2).await.unwrap();
    let written = |store: &RedisStore| {
        let key = String::from_utf8(store.state_key("", b"same", &limit).unwrap()).unwrap();
        let ttl: i64 = server.cli(&["pttl", &key]).trim().parse().unwrap();
        (server.cli(&["get", &key]), ttl)
    };
    let (value, ttl) = written(&native);
    assert_eq!(server.cli(&["flushall"]).trim(), "OK");
    script.check(b"same", &limit, 2).await.unwrap();
    let (script_value, script_ttl) = written(&script);
    assert_eq!(value, script_value);
    assert!(ttl.abs_diff(script_ttl) < 1_000 && ttl > 0, "module {ttl} ms, script {script_ttl} ms");
    // A key holding what tollgate did not write fails alone, as with the script.
    for (key, command) in [(&b"text"[..], ["set", "VALUE", "hello"]), (b"list", ["rpush", "VALUE", "x"])] {
        let name = String::from_utf8(native.state_key("", key, &limit).unwrap()).unwrap();
        let _ = server.cli(&[command[0], &name, command[2]]);
        let result = native.check(key, &limit, 1).await;
        assert!(matches!(result, Err(StoreError::BadState(_))), "{result:?}");
    }
    assert!(native.check(b"fine", &limit, 1).await.unwrap().allowed);
    // A hostile call (a trillion slices, an overflowing cost) is an error; the server serves on.
    let hostile = [
        ["3", "", "", "0", "1", "0", "0", "sub-window", "30", "60000000000", "30", "1000000000000", "1", "1", "1"],
        ["3", "", "", "0", "1", "0", "0", "gcra", "30", "60000000000", "30", "1", "1", "1", "999999999999999999999999"],
    ];
    for args in hostile {
        let reply = server.cli(&[&["TOLLGATE.CHECK", "hostile"][..], &args].concat());
        assert!(reply.contains("TOLLGATE_ARGS"), "{reply}");
    }
    assert_eq!(server.cli(&["PING"]).trim(), "PONG");
    // A server without the module: its calls go to the script.
    let plain = RedisServer::start();
    let store = RedisStore::open(&plain.url(), RedisOptions { module: true, ..options(None) }).unwrap();
    let limit = Limit::per_second(5).build().unwrap();
    assert_eq!(store.check(b"k", &limit, 1).await.unwrap().remaining, 4);
    assert_eq!(store.check(b"k", &limit, 1).await.unwrap().remaining, 3);
}

/// Random limits across the whole range, random keys, costs, clock jumps, charges, views and
/// refunds, holds, reservations settled above, below, twice and late: every field of every
/// decision equal to the memory store's, the checks a hold denied, and every settle's answer.
async fn differential(server: &RedisServer, module: bool) {
    // TOLLGATE_SEED=n explores another sequence (the suite runs the fixed one).
    let seed = std::env::var("TOLLGATE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut rng = Rng(seed);
    // Holds, drawn apart so that the other draws stay the sequence they were before holds.
    let mut holds = Rng(seed ^ 0x5EED_0F40_71D5);
    // Calendar limits (the window family), drawn apart likewise.
    let mut calendars = Rng(seed ^ 0xCA1E_0DA5);
    let keys: [&[u8]; 3] = [b"a", b"{tag}:b", b"\xff\x00}{"];
    // Reservations, drawn apart too: opened on both stores, settled (once, twice, late) alike.
    let mut reserving = Rng(seed ^ 0x7E5E_47E5);
    let (mut settled, mut refused) = (0, 0);
    // Decisions a hold made, and decisions asking for a hold that none made.
    let (mut by_hold, mut not_held) = (0, 0);
    for round in 0..140 {
        let algorithm = Algorithm::ALL[round % Algorithm::ALL.len()];
        // The limit of a key may change between calls: a reload, another caller's parameters.
        let mut limits: Vec<Limit> = (0..3).map(|_| random_limit(&mut rng, algorithm)).collect();
        // Two rounds in three of the window family in calendar periods (a key's limit changing
        // between them). Not mixed with fixed periods: the script reads a fixed period's instants
        // within 104 days of now (FAR_SEC), and a calendar round's clock jumps years.
        if matches!(algorithm, Algorithm::FixedWindow | Algorithm::SlidingWindow) && calendars.below(3) > 0 {
            for limit in &mut limits {
                *limit = random_calendar_limit(&mut calendars, algorithm);
            }
        }
        let clock = Arc::new(ManualClock::new(T0 + rng.below(limits[0].period_ns())));
        let redis = RedisStore::open(&server.url(), RedisOptions { module, ..options(Some(clock.clone())) }).unwrap();
        let memory = MemoryStore::builder().clock(clock.clone()).build();
        let mut pending = None;
        // Per key and node, the running total of its charges and when it was last raised.
        let mut totals: std::collections::HashMap<(&[u8], u64), (u64, u64)> = std::collections::HashMap::new();
        // Charges applied with an origin, to send again later (a lost reply's resend): the charge,
        // its instant, when it was sent.
        let mut sent: Vec<(Charge<'_>, u64, u64)> = Vec::new();
        let horizon = u64::try_from(tollgate_store::remote::RESEND_HORIZON.as_nanos()).unwrap();
        let mut latest = 0;
        // Reservations open on both stores: the key, the limit, the memory store's id, Redis's.
        let mut open: Vec<(&[u8], &Limit, String, String)> = Vec::new();
        // Per key, each refund's instant (a refund or settle call's now: where a store stamps the
        // key's marker if it gives something back) and until when the stamp lives.
        let mut stamps: std::collections::HashMap<&[u8], Vec<(u64, u64)>> = std::collections::HashMap::new();
        let stamp_until = |limit: &Limit, at: u64| {
            at.saturating_add(limit.tolerance_ns().max(2 * limit.period_ns())).saturating_add(SEC)
        };
        for step in 0..60 {
            let limit = if rng.below(6) == 0 { &limits[1 + step % 2] } else { &limits[0] };
            let period = limit.period_ns();
            let gap = match rng.below(5) {
                0 => 0,
                1 => rng.below(limit.emission_interval_ns() + 1),
                2 => rng.below(period + 1),
                3 => rng.below(3 * period + 1),
                _ => rng.below(period / 64 + 2),
            };
            let now = tollgate_store::Clock::now_ns(&*clock) + gap;
            // Now and then a clock going backwards (by up to a day: the contract is exact agreement
            // while no state runs more than 54 days ahead of now, see MAX_AHEAD_NS).
            let back = rng.below(period.min(86_400 * SEC).min(now - T0) + 1);
            // Under a calendar period, never more than 12 hours before the latest instant: the
            // script refuses a key whose window lies beyond the windows the client sends
            // (TOLLGATE_CLOCK), which backward steps adding up to days would reach.
            let earliest = if limit.calendar().is_some() { u64::saturating_sub(latest, 12 * 3_600 * SEC) } else { 0 };
            clock.set(if rng.below(12) == 0 { (now - back).max(earliest) } else { now });
            let key = rng.pick(&keys);
            let cost = match rng.below(6) {
                0 => rng.below(limit.capacity() + 1),
                1 => 0,
                _ => 1,
            };
            // Now and then a hold (for up to two periods; a later one than what is held stays), and
            // a check asking for its hold.
            if holds.below(8) == 0 {
                let ns = holds.below(2 * period + 1);
                memory.hold("", key, ns).await.unwrap();
                redis.hold("", key, ns).await.unwrap();
            }
            let check = [if holds.below(3) == 0 {
                Check::new(key, limit, cost).with_hold()
            } else {
                Check::new(key, limit, cost)
            }];
            let now = tollgate_store::Clock::now_ns(&*clock);
            latest = latest.max(now);
            let charge_cost = if rng.below(4) == 0 { u64::MAX / 4 } else { 1 + rng.below(limit.capacity()) };
            let mut charges: Vec<Charge<'_>> = if rng.below(6) == 0 {
                vec![Charge::new(Check::new(key, limit, charge_cost), rng.below(2 * period))]
            } else {
                Vec::new()
            };
            // A node's charges: what it knew of the key, and its running total, sent twice in one
            // call now and then (applied once) or followed by an older one (skipped). The stores'
            // markers expire on different clocks (Redis's real time, the memory store's manual
            // clock): a charge's total is the whole of its cost above the last one's, or, while
            // both stores remember that one (the clock never past the horizon since), a part (the
            // rest applied before: what a node's merged charges are).
            let node = 1 + rng.below(2);
            let (last, raised) = totals.get(&(key, node)).copied().unwrap_or((0, 0));
            let remembered = last > 0 && latest <= raised + horizon;
            let total = charges.first().and_then(|first| {
                let whole = last.checked_add(first.check.cost).filter(|&t| t <= MAX_CHARGE_TOTAL);
                match whole {
                    Some(whole) if !remembered || rng.below(2) == 0 => Some(whole),
                    _ if remembered => Some(last + 1 + rng.below(first.check.cost.min(1_000))),
                    _ => None,
                }
                .filter(|&t| t <= MAX_CHARGE_TOTAL)
            });
            if let Some((first, total)) = charges.first_mut().zip(total).filter(|_| rng.below(2) == 0) {
                totals.insert((key, node), (total, now));
                first.origin = Some(Origin { node, total });
                first.known_remaining = (rng.below(3) == 0).then(|| rng.below(limit.capacity() + 1));
                // Now and then a view: what the node saw within the last period (the round's
                // shortest: a refund's stamp after it then lives in both stores, each on its own
                // clock, as long as any of the round's limits says).
                if first.known_remaining.is_some() && rng.below(2) == 0 {
                    let bucket = limit.algorithm().is_bucket();
                    let most =
                        if bucket { limit.tolerance_ns() + limit.emission_interval_ns() } else { limit.capacity() };
                    let previous = if limit.algorithm() == Algorithm::SlidingWindow { rng.below(most + 1) } else { 0 };
                    let shortest = limits.iter().map(Limit::period_ns).min().unwrap_or(period);
                    let at = now - rng.below(shortest.min(now - T0) + 1);
                    first.seen = Some(Snapshot { at, used: rng.below(most + 1), previous });
                    first.view = rng.below(2) == 0;
                    // A stamp at or after the view voids it (see `Charge::seen`) while the key's
                    // marker holds it: on Redis until real time passes its life, in the memory
                    // store until its manual clock does. A clock gone back (by days, step after
                    // step) puts a view before a stamp the memory store's clock already expired:
                    // such a view is left out, the stores' clocks disagreeing on the marker.
                    let expired = |&(stamped, until): &(u64, u64)| stamped >= at && latest >= until;
                    if stamps.get(key).is_some_and(|s| s.iter().any(expired)) {
                        (first.known_remaining, first.seen, first.view) = (None, None, false);
                    }
                }
                let again = *first;
                match rng.below(3) {
                    0 => charges.push(Charge { known_remaining: None, ..again }),
                    1 => charges.push(Charge { origin: Some(Origin { node, total: total - 1 }), ..again }),
                    _ => {}
                }
            }
            // Now and then one of them sent again, as a node does until a reply confirms it: for
            // up to the node's resend horizon, however long the key was idle meanwhile. First in
            // the call, so that only the marker can recognise it. (The memory store's markers
            // expire on its manual clock, Redis's on real time: both remember the charge while
            // the clock never went past the horizon since it was sent.)
            let new_charge = charges.first().filter(|c| c.origin.is_some()).copied();
            let resend: Vec<_> = sent.iter().filter(|s| s.2 + horizon >= latest && s.1 <= now).copied().collect();
            if !resend.is_empty() && rng.below(4) == 0 {
                let (charge, at, _) = resend[usize::try_from(rng.below(resend.len() as u64)).unwrap()];
                charges.insert(0, Charge { origin: charge.origin, ..Charge::new(charge.check, now - at) });
            }
            let want = memory.decide(&check, &charges).await.unwrap();
            let got = redis.decide(&check, &charges).await.unwrap();
            assert_eq!(got, want, "{limit} round {round} step {step}: key {key:?} cost {cost} charges {charges:?}");
            by_hold += got.held.len();
            not_held += usize::from(check[0].hold && got.held.is_empty());
            if let Some(c) = new_charge {
                sent.push((c, now - c.age_ns, now));
            }
            // Now and then the admission is withdrawn, at once or after a few more steps.
            if got.decisions[0].allowed && cost > 0 {
                let refund = Refund { check: check[0], at: got.now_ns, decision: got.decisions[0] };
                match rng.below(8) {
                    0 => {
                        memory.refund(&[refund]).await.unwrap();
                        redis.refund(&[refund]).await.unwrap();
                        stamps.entry(key).or_default().push((now, stamp_until(limit, now)));
                    }
                    1 => pending = Some((key, limit, cost, got.now_ns, got.decisions[0])),
                    _ => {}
                }
            }
            if rng.below(5) == 0
                && let Some((key, limit, cost, at, decision)) = pending.take()
            {
                // Settled within the 104 days around now the script reads instants in (FAR_SEC; a
                // calendar year's steps make the clock jump further than a fixed period's).
                if now.abs_diff(at) < tollgate_store::layout::FAR_SEC * SEC {
                    let refund = [Refund { check: Check::new(key, limit, cost), at, decision }];
                    memory.refund(&refund).await.unwrap();
                    redis.refund(&refund).await.unwrap();
                    stamps.entry(key).or_default().push((now, stamp_until(limit, now)));
                }
            }
            // Now and then a reservation of the step's cost, for up to two periods (an hour at
            // most); and one settled with an actual up to twice the capacity, now and then twice.
            if reserving.below(5) == 0 {
                let max = tollgate_store::reservation::MAX_RESERVATION_NS;
                let ttl = 1 + reserving.below((2 * period).min(max - 1));
                let reserved = [Check::new(key, limit, cost)];
                let (want, got) =
                    (memory.reserve_until(&reserved, ttl).await, redis.reserve_until(&reserved, ttl).await);
                if cost == 0 {
                    // An estimate of 0 is refused by both, before any decision.
                    let is_refused = |r: &Result<_, StoreError>| matches!(r, Err(StoreError::Unsupported(_)));
                    assert!(is_refused(&want) && is_refused(&got), "{limit}: a reservation of 0: {want:?} / {got:?}");
                } else {
                    let (want, got) = (want.unwrap(), got.unwrap());
                    assert_eq!(got.0, want.0, "{limit} round {round} step {step}: reserve of {cost} for {ttl} ns");
                    let deadline = |r: &Option<tollgate_store::Reservation>| r.as_ref().map(|r| r.deadline_ns);
                    assert_eq!(deadline(&got.1), deadline(&want.1));
                    if let (Some(w), Some(g)) = (want.1, got.1) {
                        open.push((key, limit, w.id, g.id));
                    }
                }
            }
            // Both keep a record a second past its deadline, the memory store on its manual
            // clock (even once it went back), Redis on real time: a reservation whose second
            // has passed on the manual clock is no longer compared.
            open.retain(|(_, _, w, _)| {
                let deadline_ms: u64 = w.split('.').nth(1).unwrap().parse().unwrap();
                latest / 1_000_000 < deadline_ms + 1_000
            });
            if !open.is_empty() && reserving.below(3) == 0 {
                let i = usize::try_from(reserving.below(open.len() as u64)).unwrap();
                let (reserved_key, limit, ref w, ref g) = open[i];
                let actual = reserving.below(2 * limit.capacity() + 1);
                // A settle below the estimate refunds it (and stamps the key's marker).
                stamps.entry(reserved_key).or_default().push((now, stamp_until(limit, now)));
                let want = memory.settle(w, actual).await;
                let got = redis.settle(g, actual).await;
                let shown = |r: &Result<tollgate_store::Settled, StoreError>| match r {
                    Ok(s) => format!("{s:?}"),
                    Err(StoreError::Refused(refusal)) => format!("{refusal:?}").split('(').next().unwrap().to_string(),
                    Err(e) => panic!("{e}"),
                };
                assert_eq!(shown(&got), shown(&want), "{limit} round {round} step {step}: settle of {actual}");
                if want.is_ok() {
                    settled += 1
                } else {
                    refused += 1
                }
                if reserving.below(3) != 0 {
                    open.swap_remove(i);
                }
            }
        }
    }
    assert!(settled > 50 && refused > 10, "{settled} reservations settled, {refused} settles refused");
    assert!(by_hold > 100 && not_held > 100, "holds made {by_hold} decisions, and asked for {not_held} others")
}

/// A sliding log far beyond 8,000 entries (the old script's DEL + RPUSH(unpack) failed there,
/// after the DEL: the whole log was lost), pruned as it goes.
#[tokio::test]
async fn a_sliding_log_of_tens_of_thousands_of_entries_stays_exact() {
    // By the script, and by a store told to use the native module, which sends a sliding log to
    // the script (the module decides every algorithm but the log: `layout::MODULE_ALGORITHMS`).
    let server = module_server();
    for module in [false, true] {
        sliding_log_of_tens_of_thousands_of_entries(&server, module).await;
    }
}

async fn sliding_log_of_tens_of_thousands_of_entries(server: &RedisServer, module: bool) {
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), RedisOptions { module, ..options(Some(clock.clone())) }).unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let limit = Limit::per_hour(20_000).algorithm(Algorithm::SlidingLog).build().unwrap();
    let mut admitted = 0;
    for i in 0..24_000u64 {
        clock.set(T0 + i * 200_000_000);
        let want = memory.check(b"big", &limit, 1).await.unwrap();
        let got = redis.check(b"big", &limit, 1).await.unwrap();
        assert_eq!(got, want, "request {i}");
        admitted += u32::from(got.allowed);
    }
    // 18,000 requests per hour (one per 200 ms): all admitted, the first hour's leave as they age.
    assert_eq!(admitted, 24_000);
    let peek = redis.peek(b"big", &limit).await.unwrap();
    assert_eq!(peek.remaining, 20_000 - 18_000);
    let length: u64 = server
        .cli(&["llen", &String::from_utf8_lossy(&redis.state_key("", b"big", &limit).unwrap())])
        .trim()
        .parse()
        .unwrap();
    assert!(length <= 18_000 + 1, "expired entries were trimmed: {length}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_one_key_admit_exactly_the_bound_on_redis_and_cluster() {
    let server = RedisServer::start();
    let cluster = RedisCluster::start();
    let cluster_store = RedisStore::open_cluster(&cluster.urls(), options(None)).await.unwrap();
    for limit in testkit::hammer::limits() {
        let clock = Arc::new(ManualClock::new(T0));
        let single = Arc::new(RedisStore::open(&server.url(), options(Some(clock.clone()))).unwrap());
        assert_eq!(testkit::hammer::tasks(single, "hot", &limit, 64, 20).await, 1000, "{limit} on one server");
        let clustered = Arc::new(cluster_store.with_options(options(Some(clock))).unwrap());
        assert_eq!(testkit::hammer::tasks(clustered, "hot", &limit, 64, 20).await, 1000, "{limit} on the cluster");
    }
}

#[tokio::test]
async fn every_key_written_has_a_ttl_no_longer_than_needed() {
    let server = RedisServer::start();
    // A clock at the start of a minute: a fixed window's key lives until its window ends, which on
    // the server's own clock can be a millisecond away, expiring between the scan and its PTTL.
    let minute = 60 * SEC;
    let clock = Arc::new(ManualClock::new(T0 / minute * minute));
    let exact = RedisOptions { clock_skew_margin: Duration::ZERO, ..options(Some(clock)) };
    let store = RedisStore::open(&server.url(), exact).unwrap();
    for (i, &algorithm) in Algorithm::ALL.iter().enumerate() {
        // Per minute, so that no key expires before the scan even on a slow machine.
        let limit = Limit::per_minute(5).algorithm(algorithm).build().unwrap();
        for k in 0..50 {
            let key = format!("k{k}");
            store.check(key.as_bytes(), &limit, 1 + (k % 3)).await.unwrap();
            store.check(key.as_bytes(), &limit, 0).await.unwrap();
        }
        let keys: Vec<String> = (0..3).map(|k| format!("{{m{i}}}:{k}")).collect();
        let checks: Vec<Check<'_>> = keys.iter().map(|key| Check::new(key.as_bytes(), &limit, 1)).collect();
        store.check_all(&checks).await.unwrap();
        let charge = [Charge::new(Check::new(b"charged", &limit, 9), SEC)];
        store.decide(&[], &charge).await.unwrap();
    }
    // A hold lives as long as itself.
    store.hold("login", b"held", 30 * SEC).await.unwrap();
    let keys = server.cli(&["--scan"]);
    let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
    assert!(keys.len() >= 7 * 51, "{} keys", keys.len());
    for key in keys {
        let ttl: i64 = server.cli(&["pttl", key]).trim().parse().unwrap();
        // Every state here is idle within one minute (5/min, at most 5 admitted), a sliding window
        // counter within two, a charged key (9 of 5: in debt) within two, the hold within 30 s;
        // -1 would be no TTL.
        assert!(ttl > 0 && ttl <= 120_000, "{key} has PTTL {ttl}");
        assert!(!key.contains(":hold:") || ttl <= 30_000, "{key} has PTTL {ttl}");
    }
}

#[tokio::test]
async fn a_key_holding_something_else_fails_alone() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let gcra = Limit::per_second(5).build().unwrap();
    let window = Limit::per_second(5).algorithm(Algorithm::FixedWindow).build().unwrap();
    let log = Limit::per_second(5).algorithm(Algorithm::SlidingLog).build().unwrap();
    let name = |key: &[u8], limit: &Limit| String::from_utf8(store.state_key("", key, limit).unwrap()).unwrap();
    let _ = server.cli(&["lpush", &name(b"list", &gcra), "x"]);
    let _ = server.cli(&["set", &name(b"text", &window), "hello world"]);
    let _ = server.cli(&["set", &name(b"str", &log), "x"]);
    let _ = server.cli(&["rpush", &name(b"oldlog", &log), "1700000000000000000 1"]);
    for (key, limit) in [(&b"list"[..], &gcra), (b"text", &window), (b"str", &log), (b"oldlog", &log)] {
        let result = store.check(key, limit, 1).await;
        assert!(matches!(result, Err(StoreError::BadState(_))), "{key:?}: {result:?}");
    }
    // Nothing was deleted by the failing calls, the connection and every other key keep working.
    assert_eq!(server.cli(&["llen", &name(b"oldlog", &log)]).trim(), "1");
    assert!(store.check(b"fine", &gcra, 1).await.unwrap().allowed);
    assert!(store.check(b"fine", &window, 1).await.unwrap().allowed);

    // A call of another layout than the script's fails as such, in both of the script's forms.
    let (_, function) = tollgate_store::redis::program::library_source();
    let (eval, _) = tollgate_store::redis::program::eval_source();
    let call =
        ["1", "k", "2", "", "", "0", "1", "0", "0", "gcra", "5", "1000000000", "5", "1", "200000000", "800000000", "1"];
    for reply in
        [server.cli(&[&["FCALL", &function][..], &call].concat()), server.cli(&[&["EVAL", &eval][..], &call].concat())]
    {
        let says = format!(
            "TOLLGATE_VERSION the script reads layout {}, the call is 2",
            tollgate_store::redis::program::VERSION
        );
        assert!(reply.contains(&says), "{reply}");
    }
}

/// A call asking for holds without the keys they name, or with keys besides (the hold keys
/// follow the markers, the lessees' key last: one missing shifts the others), or a hold flag that
/// is neither 0 nor 1, or a hold script call without its key or with a bad length: each is a
/// `TOLLGATE_ARGS` error naming what is wrong, never a hold silently skipped, another key read as
/// a hold, or a Lua error on a nil key; and none writes anything.
#[tokio::test]
async fn a_malformed_hold_call_is_an_args_error_and_writes_nothing() {
    let server = RedisServer::start();
    let (decide, _) = tollgate_store::redis::program::eval_source();
    let (hold, _) = tollgate_store::redis::program::entry_eval_source("hold");
    let version = tollgate_store::redis::program::VERSION;
    let header = |checks: &'static str| vec![version, "", "", "0", checks, "0", "0"];
    let check = |flag: &'static str| ["gcra", "5", "1000000000", "5", "1", "200000000", "800000000", "1", flag];
    let call = |script: &str, keys: &[&str], args: Vec<&str>| {
        let numkeys = keys.len().to_string();
        let mut cli = vec!["EVAL", script, &numkeys];
        cli.extend(keys);
        cli.extend(args);
        server.cli(&cli)
    };
    let one = |flag| [header("1"), check(flag).to_vec()].concat();
    let (decide, hold) = (decide.as_str(), hold.as_str());
    let cases = [
        ("one check, its hold key missing", decide, vec!["{k}"], one("1"), "hold key"),
        (
            "two checks, no hold keys",
            decide,
            vec!["{k}", "{k}:2"],
            [header("2"), check("1").to_vec(), check("1").to_vec()].concat(),
            "hold key",
        ),
        (
            "a lease without its hold key (the lessees' key would be read as the hold)",
            decide,
            vec!["{k}", "{k}:lessees"],
            [one("1"), vec!["node", "1000"]].concat(),
            "keys",
        ),
        ("a key besides the hold key", decide, vec!["{k}", "{k}:hold", "{k}:extra"], one("1"), "keys"),
        ("a hold key for a check asking for none", decide, vec!["{k}", "{k}:hold"], one("0"), "keys"),
        ("a hold flag of 2", decide, vec!["{k}", "{k}:hold"], one("2"), "a check hold of 2"),
        ("a hold without its key", hold, vec![], [header("0"), vec!["1000"]].concat(), "hold key"),
        ("a hold of -1 ns", hold, vec!["{k}:hold"], [header("0"), vec!["-1"]].concat(), "a hold of -1 ns"),
    ];
    for (what, script, keys, args, says) in cases {
        let reply = call(script, &keys, args);
        assert!(reply.contains("TOLLGATE_ARGS") && reply.contains(says), "{what}: {reply}");
    }
    assert_eq!(server.cli(&["DBSIZE"]).trim(), "0", "a malformed call wrote something");
    // The same calls well formed are answered (the cases above fail for what they name alone).
    let reply = call(decide, &["{k}", "{k}:hold"], one("1"));
    assert!(!reply.contains("ERR") && !reply.contains("TOLLGATE"), "{reply}");
    let reply = call(hold, &["{k}:hold"], [header("0"), vec!["1000000000"]].concat());
    assert!(!reply.contains("ERR") && !reply.contains("TOLLGATE"), "{reply}");
}

#[tokio::test]
async fn server_time_decisions_and_the_longest_limits() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let limit = Limit::per_minute(3).build().unwrap();
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(store.check(b"user", &limit, 1).await.unwrap().allowed);
    }
    assert_eq!(allowed, 3);
    let denied = store.check(b"user", &limit, 1).await.unwrap();
    assert!(denied.retry_after_ns > 0 && denied.retry_after_ns <= 20 * SEC, "{denied:?}");
    store.reset("", b"user", &limit).await.unwrap();
    assert!(store.check(b"user", &limit, 3).await.unwrap().allowed);
    assert!(matches!(store.check(b"user", &limit, 4).await, Err(StoreError::Limit(_))));
    // 50 days, the maximum: decided on Redis as in memory.
    for algorithm in Algorithm::ALL {
        let long = Limit::builder(1_000, Duration::from_nanos(MAX_PERIOD_NS)).algorithm(algorithm).build().unwrap();
        let d = store.check(b"long", &long, 1).await.unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 999), "{long}");
    }
}

#[tokio::test]
async fn keys_are_bytes_and_named_scopes_never_share_state() {
    let server = RedisServer::start();
    let store = RedisStore::open(&server.url(), options(None)).unwrap();
    let limit = Limit::per_minute(1).build().unwrap();
    for key in [&b"\xff\xfe"[..], b"\0", b"{x}", b"x", b"}{", b""] {
        assert!(store.check(key, &limit, 1).await.unwrap().allowed, "{key:?}");
        assert!(!store.check(key, &limit, 1).await.unwrap().allowed, "{key:?}");
    }
    for scope in ["api", "search"] {
        let check = [Check::new(b"x", &limit, 1).scoped(scope)];
        assert!(store.check_all(&check).await.unwrap()[0].allowed, "{scope} has its own state for x");
    }
    let bad = [Check::new(b"x", &limit, 1).scoped("a:b")];
    assert!(matches!(store.check_all(&bad).await, Err(StoreError::Unsupported(_))));
}

/// Charges capped at the window's maximum count, again and again: the log's running totals are
/// counted from 0 again (rewriting the list) and stay exact.
#[tokio::test]
async fn a_log_charged_past_2_pow_50_is_rebased_and_stays_exact() {
    // By the script, and by a store told to use the native module (which sends a sliding log to
    // the script: the module decides every algorithm but the log).
    let server = module_server();
    for module in [false, true] {
        log_charged_past_2_pow_50(&server, module).await;
    }
}

/// A server with tollgate's native module loaded.
fn module_server() -> RedisServer {
    let module = testkit::redis_server::module_path();
    RedisServer::start_with(ServerConfig {
        lines: vec![format!("loadmodule {}", module.display())],
        ..ServerConfig::default()
    })
}

async fn log_charged_past_2_pow_50(server: &RedisServer, module: bool) {
    let clock = Arc::new(ManualClock::new(T0));
    let redis = RedisStore::open(&server.url(), RedisOptions { module, ..options(Some(clock.clone())) }).unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let limit = Limit::per_second(50).algorithm(Algorithm::SlidingLog).build().unwrap();
    for i in 0..80u64 {
        clock.set(T0 + i * SEC / 3);
        // Capped charges first, then charges of 2^50 every other step: a rebase with live entries.
        let cost = if i < 40 { u64::MAX / 8 } else { 1 << 50 };
        let charges = [Charge::new(Check::new(b"k", &limit, cost), 0)];
        let check = [Check::new(b"k", &limit, 1)];
        let charges: &[Charge<'_>] = if i % 4 == 0 || (i >= 40 && i % 2 == 0) { &charges } else { &[] };
        for _ in 0..3 {
            let want = memory.decide(&check, charges).await.unwrap();
            let got = redis.decide(&check, charges).await.unwrap();
            assert_eq!(got, want, "step {i}");
        }
    }
    // A rebase by a lone check: a check, a charge of 2^50,
    // a check it denies, then checks once the charge has left the window (the base is then past
    // 2^50; nothing admitted since it was charged can be in the list).
    let start = T0 + 100 * SEC;
    let check = [Check::new(b"r", &limit, 1)];
    let charge = [Charge::new(Check::new(b"r", &limit, 1 << 50), 0)];
    for (at, charges) in [(0, &[][..]), (0, &charge[..]), (SEC / 2, &[]), (SEC + SEC / 10, &[]), (SEC + SEC / 5, &[])] {
        clock.set(start + at);
        let want = memory.decide(&check, charges).await.unwrap();
        let got = redis.decide(&check, charges).await.unwrap();
        assert_eq!(got, want, "at {at}");
    }
}
