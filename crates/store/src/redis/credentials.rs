//! No credential of the URL corpus (`tollgate_redis_client::testkit::urls`) reaches a message of
//! the store: not [`StoreConfig`]'s description, parse error or `Debug`, not a store's `Debug`
//! (the client checks its own with the same corpus: the target, its settings, `redacted`).

use tollgate_redis_client::testkit::urls::{CORPUS, Expected, Leaks, TOKENS};

use super::{RedisOptions, RedisStore, RedisTarget};
use crate::configured::StoreConfig;

#[test]
fn no_credential_reaches_a_message() {
    let mut leaks = Leaks::default();
    for (url, _) in CORPUS {
        assert!(TOKENS.iter().any(|t| url.contains(t)), "{url} holds no token");
        match StoreConfig::parse(url) {
            Ok(store) => {
                leaks.check(url, "StoreConfig::describe()", &store.describe());
                leaks.check(url, "Debug of StoreConfig", &format!("{store:?}"));
            }
            Err(error) => leaks.check(url, "StoreConfig::parse's error", &error),
        }
    }
    leaks.none();
}

#[tokio::test]
async fn no_credential_reaches_a_store_s_debug() {
    let mut leaks = Leaks::default();
    for (url, expected) in CORPUS {
        let Expected::Password(_) = expected else { continue };
        let Ok(target) = RedisTarget::parse(url) else { continue };
        let store = RedisStore::connect(&target, RedisOptions::default()).unwrap();
        leaks.check(url, "Debug of RedisStore", &format!("{store:?}"));
    }
    leaks.none();
}
