//! Every charge applied exactly once (ARCHITECTURE.md, principle 11), on the memory remote and on
//! real Redis: pending charges compacted after a lost reply, a charge sent again long after its
//! key was idle, and a request across Redis Cluster servers one of which fails part way.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tollgate_store::remote::{Charge, Origin, Remote};
use tollgate_store::testkit::redis_server::RedisServer;
use tollgate_store::{Algorithm, Check, Limit, ManualClock, MemoryStore, RedisOptions, RedisStore, TimeSource};

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// A fresh key prefix per store, so that stores sharing a server never meet.
fn options(time: TimeSource, timeout: Duration) -> RedisOptions {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    RedisOptions {
        prefix: format!("x{}", NEXT.fetch_add(1, Ordering::Relaxed)),
        time,
        timeout,
        ..RedisOptions::default()
    }
}

/// Every algorithm: a node's charge applied, its key idle again (a second limit, the longest state
/// two windows), then busy again; the charge sent again (a lost reply's resend, dated as sent) is
/// recognised. Before: its marker lived only until the key was idle, and the charge, dated in a
/// window long over, landed in the live one: counted twice (remaining 6 where 9 is right).
async fn a_charge_sent_again_after_its_key_was_idle_counts_once<R: Remote>(store: &R, wait: impl AsyncFn(Duration)) {
    let limits: Vec<Limit> =
        Algorithm::ALL.iter().map(|&a| Limit::per_second(10).algorithm(a).build().unwrap()).collect();
    let charge =
        |limit| Charge { origin: Some(Origin { node: 5, seq: 1 }), ..Charge::new(Check::new(b"late", limit, 3), 0) };
    let mut applied_at = Vec::new();
    for limit in &limits {
        let reply = store.decide(&[Check::new(b"late", limit, 0)], &[charge(limit)]).await.unwrap();
        assert_eq!(reply.decisions[0].remaining, 7, "{limit}");
        applied_at.push(reply.now_ns);
    }
    wait(Duration::from_millis(2_100)).await;
    for (limit, at) in limits.iter().zip(applied_at) {
        let admitted = store.decide(&[Check::new(b"late", limit, 1)], &[]).await.unwrap();
        assert_eq!(admitted.decisions[0].remaining, 9, "{limit}: idle again, then one admitted");
        let again = Charge { age_ns: admitted.now_ns - at, ..charge(limit) };
        let reply = store.decide(&[Check::new(b"late", limit, 0)], &[again]).await.unwrap();
        assert_eq!(reply.decisions[0].remaining, 9, "{limit}: the charge sent again was applied already");
    }
}

#[tokio::test]
async fn a_charge_sent_again_after_its_key_was_idle_counts_once_on_redis_and_memory() {
    let server = RedisServer::start();
    let redis = RedisStore::open(&server.url(), options(TimeSource::Server, Duration::from_secs(2))).unwrap();
    a_charge_sent_again_after_its_key_was_idle_counts_once(&redis, async |d| tokio::time::sleep(d).await).await;
    let clock = Arc::new(ManualClock::new(T0));
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    a_charge_sent_again_after_its_key_was_idle_counts_once(&memory, async |d| clock.advance(d)).await;
}
