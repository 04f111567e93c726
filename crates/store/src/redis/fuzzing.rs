//! The body of the `redis_reply` fuzz target (feature `fuzzing`): arbitrary bytes as a Redis
//! server's reply, read by everything in the store that reads one (`CLUSTER SLOTS`, `MOVED` and
//! `ASK`, a Sentinel's `GET-MASTER-ADDR-BY-NAME` and `ROLE`, the decision script's reply, a
//! lease's, `TIME`), and by the framing that bounds each reply and finds where it ends before it is
//! parsed (`bounded.rs`: the same outcome and the same ends in one read or byte by byte). Nothing may panic, and whatever
//! is accepted must hold what the code using it relies on: slots below 16,384 and each given
//! once, ports from 1 to 65,535, hosts that can be hosts, decisions admitted or denied with no
//! more remaining than their limit, never more units granted than asked.

use super::bounded::Framing;
use super::reply::{parse_lease_reply, parse_reply, server_time_ns};
use super::target::Address;
use super::topology::{self, Redirect, SLOTS};

/// Bytes as a server's reply (see the module docs).
pub fn replies(data: &[u8]) {
    // Where each reply ends (what the connection cuts the stream at), read whole and byte by byte.
    let (mut whole, mut by_byte) = (Framing::default(), Framing::default());
    let (mut ends_whole, mut ends_by_byte) = (Vec::new(), Vec::new());
    let read_whole = whole.split(data, |end| ends_whole.push(end)).is_ok();
    let read_by_byte = data
        .iter()
        .enumerate()
        .all(|(i, b)| by_byte.split(std::slice::from_ref(b), |end| ends_by_byte.push(i + end)).is_ok());
    assert_eq!(read_whole, read_by_byte, "the framing depends on how the bytes arrive");
    if read_whole {
        assert_eq!(ends_whole, ends_by_byte, "the replies end elsewhere depending on how the bytes arrive");
        assert!(ends_whole.windows(2).all(|w| w[0] < w[1]) && ends_whole.last().is_none_or(|&e| e <= data.len()));
    }

    let Ok(value) = redis::parse_redis_value(data) else { return };
    let asked = Address { host: "10.0.0.9".into(), port: 7000 };
    let valid = |address: &Address| address.port != 0 && !address.host.is_empty() && address.host.len() <= 255;

    if let Ok(ranges) = topology::cluster_slots(value.clone(), &asked) {
        let mut given = vec![false; SLOTS];
        for range in &ranges {
            assert!(range.start <= range.end && usize::from(range.end) < SLOTS, "{range:?}");
            for slot in range.start..=range.end {
                assert!(!given[usize::from(slot)], "slot {slot} given twice");
                given[usize::from(slot)] = true;
            }
            assert!(valid(&range.primary) && range.replicas.iter().all(valid), "{range:?}");
        }
        assert_eq!(topology::coverage(&ranges), given.iter().filter(|g| **g).count());
    }

    if let Err(error) = value.clone().extract_error()
        && let Ok(Some(Redirect::Moved(slot, address) | Redirect::Ask(slot, address))) = topology::redirect(&error)
    {
        assert!(usize::from(slot) < SLOTS && valid(&address), "{slot} {address:?}");
    }

    if let Ok(Some(address)) = topology::sentinel_primary(value.clone()) {
        assert!(valid(&address), "{address:?}");
    }
    let _ = topology::is_primary(&value);
    let _ = topology::role_name(&value);

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
