//! A node's charges (what it admitted while Redis could not be reached) on a real `redis-server`
//! and on the memory store: each applied once, and what the node knew restoring a key the store
//! lost, never undoing a refund or a reset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::Snapshot;
use tollgate_store::remote::{CHARGES_REMEMBERED, Charge, Origin, RESEND_HORIZON, Remote, Reply};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, MemoryStore, RedisOptions, RedisStore, Refund, Store};

/// A fresh key prefix per store.
fn options() -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("c{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        // Generous for loaded CI machines.
        timeout: Duration::from_secs(2),
        ..RedisOptions::default()
    }
}

/// A node's charges reach a store once however often they are sent (riding on several calls in
/// flight, or sent again after a lost reply), and what the node knew of a key restores it on a
/// store that lost it (restarted empty, a replica promoted without the last writes), never on a
/// key it holds as the node saw it, refunded or reset since: on Redis and on the memory store,
/// every algorithm.
async fn charges_apply_once_and_restore_a_lost_key<R: Remote>(store: &R, lose: impl Fn()) {
    for algorithm in Algorithm::ALL {
        let limit = Limit::per_hour(20).algorithm(algorithm).build().unwrap();
        let key: &[u8] = b"{once}";
        let peek = [Check::new(key, &limit, 0)];
        let remaining = |reply: Reply| reply.decisions[0].remaining;
        // A node's charge: its running total (this one's cost included), its cost.
        let charge = |node: u64, total: u64, cost: u64, known_remaining: Option<u64>| Charge {
            check: Check::new(key, &limit, cost),
            age_ns: 0,
            origin: Some(Origin { node, total }),
            known_remaining,
            seen: None,
            view: false,
        };
        // What a node following the key knew of it (`seen`: a reply's snapshot), for a store that
        // lost it only.
        let view = |known: u64, seen: Snapshot| Charge {
            known_remaining: Some(known),
            seen: Some(seen),
            view: true,
            ..Charge::new(Check::new(key, &limit, 0), 0)
        };
        let (first, second) = (charge(9, 3, 3, Some(20)), charge(9, 5, 2, Some(15)));
        assert_eq!(remaining(store.decide(&peek, &[first]).await.unwrap()), 17, "{algorithm}");
        assert_eq!(remaining(store.decide(&peek, &[first]).await.unwrap()), 17, "{algorithm}: sent again");
        assert_eq!(remaining(store.decide(&peek, &[first, second]).await.unwrap()), 15, "{algorithm}: the newer one");
        assert_eq!(remaining(store.decide(&peek, &[charge(9, 1, 1, None)]).await.unwrap()), 15, "{algorithm}: older");
        // The second and a third merged (as a node keeps its charges few): only the third counts.
        assert_eq!(remaining(store.decide(&peek, &[charge(9, 6, 3, None)]).await.unwrap()), 14, "{algorithm}: merged");
        assert_eq!(
            remaining(store.decide(&peek, &[charge(10, 1, 1, None)]).await.unwrap()),
            13,
            "{algorithm}: another node"
        );
        // The key is lost; the node's next charge says it knows 13 left, the charge included:
        // charged, then lowered to that.
        lose();
        assert_eq!(remaining(store.decide(&peek, &[]).await.unwrap()), 20, "{algorithm}: lost");
        assert_eq!(
            remaining(store.decide(&peek, &[charge(9, 7, 1, Some(13))]).await.unwrap()),
            13,
            "{algorithm}: restored"
        );
        // Known remaining above the store's: nothing is given back.
        assert_eq!(remaining(store.decide(&peek, &[charge(9, 8, 1, Some(20))]).await.unwrap()), 12, "{algorithm}");
        // A view: a key the store holds as the node saw it is left as is.
        let seen = store.decide(&peek, &[]).await.unwrap().snapshots[0];
        assert_eq!(remaining(store.decide(&peek, &[view(2, seen)]).await.unwrap()), 12, "{algorithm}: held");
        // A replica promoted without the last writes: it holds the key, 5 used where the node saw 8.
        lose();
        store.decide(&[], &[Charge::new(Check::new(key, &limit, 5), 0)]).await.unwrap();
        assert_eq!(remaining(store.decide(&peek, &[]).await.unwrap()), 15, "{algorithm}: stale");
        assert_eq!(remaining(store.decide(&peek, &[view(12, seen)]).await.unwrap()), 12, "{algorithm}: caught up");
        // A key refunded after the node's view: behind it, but the refund is not undone.
        let one = Check::new(key, &limit, 1);
        let reserved = store.decide(&[one], &[]).await.unwrap();
        assert_eq!(reserved.decisions[0].remaining, 11, "{algorithm}");
        let refund = Refund { check: one, at: reserved.now_ns, decision: reserved.decisions[0] };
        store.refund(&[refund]).await.unwrap();
        assert_eq!(remaining(store.decide(&peek, &[]).await.unwrap()), 12, "{algorithm}: refunded");
        let seen = reserved.snapshots[0];
        assert_eq!(remaining(store.decide(&peek, &[view(11, seen)]).await.unwrap()), 12, "{algorithm}: kept");
        // A key lost: restored.
        lose();
        assert_eq!(remaining(store.decide(&peek, &[view(2, seen)]).await.unwrap()), 2, "{algorithm}: lost, restored");
        // Nor a key reset lately: the view is from before the reset.
        store.reset("", key, &limit).await.unwrap();
        assert_eq!(remaining(store.decide(&peek, &[view(2, seen)]).await.unwrap()), 20, "{algorithm}: reset");
        // Nor what a node owing charges knew from before the reset: its charge counts, no more.
        let owed = Charge { seen: Some(seen), ..charge(9, 9, 1, Some(2)) };
        assert_eq!(remaining(store.decide(&peek, &[owed]).await.unwrap()), 19, "{algorithm}: reset, then charged");
        lose();
    }
}

#[tokio::test]
async fn a_nodes_charges_apply_once_and_restore_a_lost_key() {
    let server = RedisServer::start();
    let redis = RedisStore::open(&server.url(), options()).unwrap();
    charges_apply_once_and_restore_a_lost_key(&redis, || assert_eq!(server.cli(&["FLUSHALL"]).trim(), "OK")).await;
    let memory = MemoryStore::new();
    let lose = || {
        for algorithm in Algorithm::ALL {
            memory.lose_sync("", b"{once}", &Limit::per_hour(20).algorithm(algorithm).build().unwrap());
        }
    };
    charges_apply_once_and_restore_a_lost_key(&memory, lose).await;
    // A marker outlives its key's state, for as long as a node may send the charge again, and no
    // longer than the charges are remembered.
    let limit = Limit::per_second(20).build().unwrap();
    let charge =
        Charge { origin: Some(Origin { node: 3, total: 2 }), ..Charge::new(Check::new(b"short", &limit, 2), 0) };
    redis.decide(&[], &[charge]).await.unwrap();
    let marker = format!("{}:applied:gcra:{{short}}", redis.options().prefix);
    let ttl: u128 = server.cli(&["PTTL", &marker]).trim().parse().unwrap();
    let (resend, remembered) = (RESEND_HORIZON.as_millis(), CHARGES_REMEMBERED.as_millis());
    assert!(resend < ttl && ttl <= remembered, "{marker}: PTTL {ttl}");
}

/// [`Store::charge`] (a response that cost more than its reservation): charged whatever the
/// limit says, the key then in debt until it is paid back; on every algorithm.
async fn a_charge_goes_past_the_limit<S: Store>(store: &S) {
    for algorithm in Algorithm::ALL {
        let limit = Limit::per_hour(20).algorithm(algorithm).build().unwrap();
        let check = |cost| Check::new(b"{past}", &limit, cost).scoped("tokens");
        assert!(store.check_one(check(15)).await.unwrap().allowed, "{algorithm}");
        store.charge(&[check(10)]).await.unwrap();
        let peek = store.check_one(check(0)).await.unwrap();
        assert_eq!(peek.remaining, 0, "{algorithm}: 15 admitted and 10 charged of 20");
        assert!(!store.check_one(check(1)).await.unwrap().allowed, "{algorithm}: the next request pays");
    }
}

#[tokio::test]
async fn a_charge_goes_past_the_limit_on_memory_and_redis() {
    a_charge_goes_past_the_limit(&MemoryStore::new()).await;
    let server = RedisServer::start();
    let redis = RedisStore::open(&server.url(), options()).unwrap();
    a_charge_goes_past_the_limit(&redis).await;
}
