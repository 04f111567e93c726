//! The manual's smallest ACL for tollgate: the `ACL SETUSER tollgate …` line of docs/redis.md ("The
//! smallest ACL"), word for word. The tests that run with it (`redis_acl.rs`, `redis_sentinel.rs`)
//! are the page's proof.

/// The manual's ACL for the user `user` with `password`, as a `redis.conf` line (`user …`).
pub(crate) fn manual_acl(user: &str, password: &str) -> String {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/redis.md")).expect("docs/redis.md");
    let line = page
        .lines()
        .find_map(|l| l.trim().strip_prefix("ACL SETUSER tollgate "))
        .expect("docs/redis.md gives an `ACL SETUSER tollgate …` line");
    format!("user {user} {}", line.replace(">PASSWORD", &format!(">{password}")))
}
