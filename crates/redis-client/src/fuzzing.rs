//! The bodies of this crate's fuzz targets (feature `fuzzing`), for `fuzz/` and the replay of
//! `fuzz/regressions/TARGET/*` (`tests/fuzz_inputs.rs`). Nothing may panic, and whatever is
//! accepted must hold what the code using it relies on:
//!
//! - [`redis_topology`]: arbitrary bytes as a Redis server's reply, read by the framing that
//!   bounds each reply and finds where it ends (`bounded.rs`: the same outcome and the same ends
//!   in one read or byte by byte; each reply read as the driver reads it), then by everything that reads the topology from one
//!   (`CLUSTER SLOTS`, `MOVED` and `ASK`, a Sentinel's `GET-MASTER-ADDR-BY-NAME` and `ROLE`):
//!   slots below 16,384 and each given once, ports from 1 to 65,535, hosts that can be hosts;
//! - [`redis_url`]: arbitrary text as a store URL (`target.rs`): a target accepted names at
//!   least one server, each with a port, its password nowhere in what may be logged (its
//!   redacted form, its `Debug`), and parses again from what it was read from.

use crate::bounded::Framing;
use crate::target::{Address, RedisTarget, Topology, redacted};
use crate::topology::{self, Redirect, SLOTS};

/// Bytes as a server's reply (see the module docs); returns the reply parsed, if it parses, for
/// the readers of the layers above (the store's decision replies).
pub fn redis_topology(data: &[u8]) -> Option<redis::Value> {
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
        // Each reply reads as the driver's parser reads it (the connection's reader, `reply.rs`).
        let mut start = 0;
        for &end in &ends_whole {
            let frame = &data[start..end];
            match (crate::reply::parse(frame), redis::parse_redis_value(frame)) {
                (Ok(ours), Ok(theirs)) => assert_eq!(ours, theirs, "{frame:?}"),
                (Err(_), Err(_)) => {}
                (ours, theirs) => panic!("{frame:?}: read as {ours:?}, by the driver as {theirs:?}"),
            }
            start = end;
        }
    }

    let value = redis::parse_redis_value(data).ok()?;
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
    Some(value)
}

/// Text as a store URL (see the module docs).
pub fn redis_url(data: &[u8]) {
    let Ok(url) = std::str::from_utf8(data) else { return };
    let shown = redacted(url);
    let Ok(target) = RedisTarget::parse(url) else {
        // Refused: the message form says at most the scheme.
        assert!(shown == "…" || shown.ends_with("://…"), "{shown}");
        return;
    };
    assert_eq!(shown, target.redacted());
    let servers: Vec<&Address> = match &target.topology {
        Topology::Server(address) => vec![address],
        Topology::Cluster(seeds) => seeds.iter().collect(),
        Topology::Sentinel { sentinels, master } => {
            assert!(!master.is_empty(), "a Sentinel group without a master name: {shown}");
            sentinels.iter().collect()
        }
    };
    assert!(!servers.is_empty(), "a target naming no server: {shown}");
    assert!(servers.iter().all(|a| a.port != 0 && !a.host.is_empty()), "{servers:?}");
    assert!(target.username.is_none() || target.password.is_some(), "a user without a password: {shown}");
    // Nothing that may be logged depends on a password.
    let mut other = target.clone();
    other.password = target.password.as_ref().map(|p| format!("{p}-other"));
    other.sentinel_password = Some("another".into());
    assert_eq!(other.redacted(), target.redacted());
    let hidden = |t: &RedisTarget| format!("{t:?}").replace("None", "Some(<redacted>)");
    assert_eq!(hidden(&other), hidden(&target), "the Debug of a target shows a password");
    // The form that may be logged names the same servers, database and TLS.
    if target.username.is_none() {
        let again = RedisTarget::parse(&shown).unwrap_or_else(|e| panic!("{shown} does not parse again: {e}"));
        assert_eq!((&again.topology, &again.tls, again.db), (&target.topology, &target.tls, target.db), "{shown}");
    }
}
