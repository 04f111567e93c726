//! The Redis key scheme: `PREFIX:ALGORITHM:{KEY}`.
//!
//! The user's key is wrapped in braces, making it the Redis Cluster hash tag: the key's state
//! lives in the slot of the user's key, whatever the prefix and algorithm. A user key that
//! already has a hash tag (`{user42}:minute`) is kept as is, so that keys sharing a tag share a
//! slot: that is how one request's several limits (`{user42}:minute`, `{user42}:day`) can be
//! checked all-or-nothing in one script on a cluster.

use tollgate_core::Algorithm;

/// The Redis key holding `key`'s state under `algorithm`.
pub(super) fn state_key(prefix: &str, algorithm: Algorithm, key: &str) -> String {
    if has_hash_tag(key) { format!("{prefix}:{algorithm}:{key}") } else { format!("{prefix}:{algorithm}:{{{key}}}") }
}

/// Whether Redis Cluster would hash `key` by a `{tag}` inside it (a non-empty one, first `{`
/// to the first `}` after it).
fn has_hash_tag(key: &str) -> bool {
    key.find('{').is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_plain_keys_and_keeps_hash_tags() {
        assert_eq!(state_key("tg", Algorithm::Gcra, "user:42"), "tg:gcra:{user:42}");
        assert_eq!(state_key("tg", Algorithm::FixedWindow, "{u42}:day"), "tg:fixed-window:{u42}:day");
        assert_eq!(state_key("tg", Algorithm::Gcra, "a{}b"), "tg:gcra:{a{}b}", "an empty tag is no tag");
    }
}
