//! Review of issue 37's fault domain on one server (`RedisStore::domain` without building the
//! state key): a check Redis cannot hold (a scope with ':') is refused with its configuration
//! error whether or not the server's breaker is open, as it was when its domain came from its key.

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::fallback::FallbackOptions;
use tollgate_store::{
    Breaker, Check, FailurePolicy, Fallback, Limit, ManualClock, RedisOptions, RedisStore, Store, StoreError,
};

const T0: u64 = 1_700_000_000 * 1_000_000_000;

/// A `local` node over a server that is gone (nothing listens on its port), whose breaker opens
/// at the first failure and is not probed during the test.
fn node_over_a_dead_server() -> Fallback<RedisStore> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let options = RedisOptions { timeout: Duration::from_secs(2), ..RedisOptions::default() };
    let redis = RedisStore::open(&format!("redis://127.0.0.1:{port}"), options).unwrap();
    let breaker = Breaker::new(1, Duration::from_secs(3600));
    let clock = Arc::new(ManualClock::new(T0));
    Fallback::with_options(
        redis,
        FailurePolicy::Local,
        FallbackOptions { clock, breaker, ..FallbackOptions::default() },
    )
}

#[tokio::test]
async fn a_scope_redis_cannot_hold_is_refused_whether_or_not_the_breaker_is_open() {
    let limit = Limit::per_hour(10).build().unwrap();
    let bad = Check::new(b"k", &limit, 1).scoped("rule:with:colons");

    let closed = node_over_a_dead_server();
    let before = closed.check_one(bad).await;
    assert!(matches!(before, Err(StoreError::Unsupported(_))), "breaker closed: {before:?}");

    let node = node_over_a_dead_server();
    // The server fails once: decided locally, and its breaker opens.
    assert!(node.check(b"other", &limit, 1).await.unwrap().allowed);
    assert!(node.stats().breaker_open, "{:?}", node.stats());
    let after = node.check_one(bad).await;
    assert!(
        matches!(after, Err(StoreError::Unsupported(_))),
        "breaker open: a check Redis cannot hold is {after:?} (decided locally, owed to a Redis that \
         will refuse it), not refused as with the breaker closed ({before:?})"
    );
}
