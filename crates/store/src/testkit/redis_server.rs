//! The client's real `redis-server` processes (`tollgate_redis_client::testkit::redis_server`),
//! and what the store's tests start them with besides: tollgate's native module, and the
//! manual's smallest ACL.

pub use tollgate_redis_client::testkit::redis_server::*;

/// tollgate's native module for a `loadmodule …` line, built for the test's profile.
pub use super::redis_module::module_path;

/// The manual's smallest ACL for tollgate (the `ACL SETUSER tollgate …` line of docs/redis.md,
/// word for word) for the user `user` with `password`, as a `redis.conf` line (`user …`); the
/// tests that run with it (`redis_acl.rs`, `redis_sentinel.rs`) are the page's proof.
#[must_use]
pub fn manual_acl(user: &str, password: &str) -> String {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/redis.md")).expect("docs/redis.md");
    let line = page
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER tollgate "))
        .expect("docs/redis.md gives an `ACL SETUSER tollgate …` line");
    format!("user {user} {}", line.replace(">PASSWORD", &format!(">{password}")))
}
