//! The Redis key scheme, one-to-one with (scope, algorithm, key):
//!
//! - `PREFIX:ALGORITHM:{KEY}` for an ad-hoc key without a hash tag;
//! - `PREFIX:ALGORITHM:t:KEY` for an ad-hoc key with one;
//! - `PREFIX:ALGORITHM:e:{e}KEY` for an ad-hoc key without one that is empty or starts with `}`
//!   (in braces, its tag would be empty: see below);
//! - `PREFIX:ALGORITHM:@SCOPE:` followed by either form, for a rule's or named limit's key;
//! - `PREFIX:hold:@SCOPE:` followed by either form for the key's hold in that scope (see
//!   `Store::hold`: one per scope and key, whatever the algorithm; `hold` is no algorithm, so no
//!   state key is a hold's).
//!
//! **Cluster slots (the hash-tag rule).** A key that contains a Redis Cluster hash tag (a non-empty
//! `{…}`: its first `{` and the first `}` after it) is placed by that tag, so keys sharing a tag
//! share a slot and can be checked together; that is how one request's several limits
//! (`{user42}:minute`, `{user42}:day`) are decided all-or-nothing in one script on a cluster.
//! Any other key is wrapped in braces and placed by itself, except that a `}` in it ends the tag
//! early (`a}b` is placed by `a`): still one slot per key, just not chosen by the whole key. A key
//! whose braces would hold an empty tag (the empty key of a `global` rule, or `}x`) would be no
//! tag at all, each Redis key of it placed by its whole name (its states, markers and hold in
//! different slots, a cross-slot call to decide it): such keys are placed by the fixed tag `e`.
//!
//! The marker after `ALGORITHM:` (`{`, `t`, `e` or `@`) tells the forms apart, and a scope holds no
//! `:` (refused), so two different (scope, key) pairs never share a Redis key: before this scheme,
//! `user` and `{user}` did.

use tollgate_core::Algorithm;
/// The Redis Cluster hash slot of a key (the client routes by it).
pub(super) use tollgate_redis_client::slot;

use crate::StoreError;

/// The Redis key holding `key`'s state in `scope` under `algorithm`.
pub(super) fn state_key(prefix: &str, scope: &str, algorithm: Algorithm, key: &[u8]) -> Result<Vec<u8>, StoreError> {
    scoped(prefix, algorithm.as_str(), scope, key)
}

/// The Redis key holding `key`'s hold in `scope`: in the slot of its states (the same hash tag).
pub(super) fn hold_key(prefix: &str, scope: &str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
    scoped(prefix, "hold", scope, key)
}

/// Whether `scope` can name keys on Redis (no `:`, `{` or `}`, which would break the key's form
/// or its hash tag).
pub(super) fn usable_scope(scope: &str) -> Result<(), StoreError> {
    if scope.contains([':', '{', '}']) {
        return Err(StoreError::Unsupported(format!(
            "scope {scope:?}: a rule or limit name used on Redis cannot contain ':', '{{' or '}}'"
        )));
    }
    Ok(())
}

/// `PREFIX:KIND:`, `@SCOPE:` unless the scope is empty, then `key`'s form.
fn scoped(prefix: &str, kind: &str, scope: &str, key: &[u8]) -> Result<Vec<u8>, StoreError> {
    usable_scope(scope)?;
    let mut out = Vec::with_capacity(prefix.len() + scope.len() + key.len() + 24);
    out.extend_from_slice(prefix.as_bytes());
    out.push(b':');
    out.extend_from_slice(kind.as_bytes());
    out.push(b':');
    if !scope.is_empty() {
        out.push(b'@');
        out.extend_from_slice(scope.as_bytes());
        out.push(b':');
    }
    if has_hash_tag(key) {
        out.extend_from_slice(b"t:");
        out.extend_from_slice(key);
    } else if key.first().is_none_or(|&b| b == b'}') {
        // Its braces would make an empty tag, which places a Redis key by its whole name: its
        // states, markers and hold each in a slot of its own. A fixed tag keeps them together.
        out.extend_from_slice(b"e:{e}");
        out.extend_from_slice(key);
    } else {
        out.push(b'{');
        out.extend_from_slice(key);
        out.push(b'}');
    }
    Ok(out)
}

/// The Redis key counting the nodes that lease `state_key` (a sorted set: lessee id, expiry in ms):
/// `PREFIX:lessees:` then the state key after its prefix. It shares the state key's slot (nothing
/// before the tag has braces), and no state key starts so (`lessees` is no algorithm).
pub(super) fn lessees_key(prefix: &str, state_key: &[u8]) -> Vec<u8> {
    beside(prefix, state_key, b"lessees")
}

/// The Redis key remembering which nodes' charges `state_key` received (a hash: node id, highest
/// running total applied; `refunded`, the latest refund's instant; `reset` while a reset is
/// recent): `PREFIX:applied:` then the state key after its prefix, in the state key's slot, as
/// [`lessees_key`].
pub(super) fn applied_key(prefix: &str, state_key: &[u8]) -> Vec<u8> {
    beside(prefix, state_key, b"applied")
}

/// `PREFIX:NAME:` then `state_key` after its prefix.
fn beside(prefix: &str, state_key: &[u8], name: &[u8]) -> Vec<u8> {
    let rest = &state_key[prefix.len() + 1..];
    let mut out = Vec::with_capacity(state_key.len() + name.len() + 2);
    out.extend_from_slice(prefix.as_bytes());
    out.push(b':');
    out.extend_from_slice(name);
    out.push(b':');
    out.extend_from_slice(rest);
    out
}

/// Whether Redis Cluster would hash `key` by a `{tag}` inside it (a non-empty one, first `{`
/// to the first `}` after it).
fn has_hash_tag(key: &[u8]) -> bool {
    key.iter()
        .position(|&b| b == b'{')
        .is_some_and(|open| key[open + 1..].iter().position(|&b| b == b'}').is_some_and(|close| close > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(scope: &str, algorithm: Algorithm, key: &[u8]) -> Vec<u8> {
        state_key("tg", scope, algorithm, key).unwrap()
    }

    #[test]
    fn wraps_plain_keys_and_keeps_hash_tags() {
        assert_eq!(key("", Algorithm::Gcra, b"user:42"), b"tg:gcra:{user:42}");
        assert_eq!(key("", Algorithm::FixedWindow, b"{u42}:day"), b"tg:fixed-window:t:{u42}:day");
        assert_eq!(key("", Algorithm::Gcra, b"a{}b"), b"tg:gcra:{a{}b}", "an empty tag is no tag");
        assert_eq!(key("api", Algorithm::Gcra, b"u"), b"tg:gcra:@api:{u}");
        assert_eq!(key("", Algorithm::Gcra, b"\xff\x00k"), b"tg:gcra:{\xff\x00k}", "any bytes");
        assert_eq!(key("all", Algorithm::Gcra, b""), b"tg:gcra:@all:e:{e}", "its braces would be an empty tag");
        assert_eq!(key("", Algorithm::Gcra, b"}x"), b"tg:gcra:e:{e}}x");
    }

    #[test]
    fn different_keys_never_share_a_redis_key() {
        let keys: [&[u8]; 11] =
            [b"user", b"{user}", b"t:{user}", b"@api:{u}", b"u", b"{u}", b"", b"}", b"e:{e}", b"{e}", b"e"];
        let mut seen = std::collections::HashSet::new();
        for scope in ["", "api"] {
            for k in keys {
                assert!(seen.insert(key(scope, Algorithm::Gcra, k)), "{scope:?} {k:?}");
            }
        }
        assert!(state_key("tg", "a:b", Algorithm::Gcra, b"k").is_err());
    }

    #[test]
    fn lessees_share_the_state_keys_slot_and_never_a_state_key() {
        let state = key("api", Algorithm::Gcra, b"{u}:x");
        let lessees = lessees_key("tg", &state);
        assert_eq!(slot(&applied_key("tg", &state)), slot(&state));
        assert_eq!(lessees, b"tg:lessees:gcra:@api:t:{u}:x");
        assert!(Algorithm::ALL.iter().all(|a| a.as_str() != "lessees"));
    }

    /// A key whose braces would make an empty tag (the empty key of a `global` rule, or one
    /// starting with `}`) must still be one slot: its states, its markers and its hold together.
    /// Placed by their whole names, each was in a slot of its own, and on a cluster a decision
    /// reading the hold (every request of a `global` rule with a `timeout`) failed as cross-slot.
    #[test]
    fn a_key_whose_braces_make_no_tag_keeps_its_keys_in_one_slot() {
        for k in [&b""[..], b"}", b"}x", b"}}", b"}{}", b"}a}"] {
            let at = slot(&key("login", Algorithm::Gcra, k));
            for algorithm in Algorithm::ALL {
                let state = key("login", algorithm, k);
                assert_eq!(slot(&state), at, "{k:?}: {algorithm}'s state");
                assert_eq!(slot(&applied_key("tg", &state)), at, "{k:?}: {algorithm}'s marker");
                assert_eq!(slot(&lessees_key("tg", &state)), at, "{k:?}: {algorithm}'s lessees");
            }
            assert_eq!(slot(&hold_key("tg", "login", k).unwrap()), at, "{k:?}: its hold");
        }
    }

    #[test]
    fn a_hold_shares_its_keys_slot_and_is_never_a_state_key() {
        let hold = hold_key("tg", "login", b"198.51.100.7").unwrap();
        assert_eq!(hold, b"tg:hold:@login:{198.51.100.7}");
        for algorithm in Algorithm::ALL {
            assert_eq!(slot(&hold), slot(&key("login", algorithm, b"198.51.100.7")));
            assert_ne!(algorithm.as_str(), "hold");
        }
        assert_eq!(slot(&hold_key("tg", "r", b"{u}:x").unwrap()), slot(b"u"));
    }
}
