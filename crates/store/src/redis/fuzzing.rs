//! The body of the `redis_reply` fuzz target (feature `fuzzing`): arbitrary bytes as a Redis
//! server's reply, read by everything that reads one on the way to a decision: the client's
//! framing and topology readers (`tollgate_redis_client::fuzzing::redis_topology`: `CLUSTER
//! SLOTS`, `MOVED` and `ASK`, a Sentinel's answers), then the store's (the decision script's
//! reply, a lease's, `TIME`). Nothing may panic, and whatever is accepted must hold what the
//! code using it relies on: the client's invariants, and decisions admitted or denied with no
//! more remaining than their limit, never more units granted than asked.

use super::reply::{parse_lease_reply, parse_reply, server_time_ns};

/// Bytes as a server's reply (see the module docs).
pub fn replies(data: &[u8]) {
    let Some(value) = tollgate_redis_client::fuzzing::redis_topology(data) else { return };

    if let Ok(values) = redis::from_redis_value::<Vec<i64>>(value.clone()) {
        for n in [0, 1, 2, 3, usize::MAX] {
            if let Ok(reply) = parse_reply(&values, n) {
                assert_eq!(reply.decisions.len(), n);
                assert!(reply.decisions.iter().all(|d| d.remaining <= d.limit));
                assert!(reply.snapshots.iter().all(|s| s.at == reply.now_ns));
            }
        }
        for want in [0, 1, 5, u64::MAX] {
            if let Ok((reply, granted, lessees)) = parse_lease_reply(&values, want) {
                assert!(granted <= want && lessees >= 1 && reply.decisions.len() == 1);
                assert!(granted == 0 || reply.decisions[0].allowed);
            }
        }
    }

    let _ = server_time_ns(value);
}
