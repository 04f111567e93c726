//! What servers say about the topology, read as input like any other: `CLUSTER SLOTS`, the
//! `MOVED` and `ASK` redirects, a Sentinel's `GET-MASTER-ADDR-BY-NAME` and `ROLE`. Every value is
//! checked before it is used (a slot below 16,384, each slot given once, a port from 1 to 65,535,
//! a host that can be one, bounded counts); an impossible one is an error naming it, which fails
//! the call or the answer it came with and nothing else: a compromised server, or anyone on the
//! path of a plain link, can make calls fail, never make tollgate panic or send calls where a
//! malformed reply points.

use std::collections::HashSet;

use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use crate::target::Address;

pub(crate) use crate::slot::SLOTS;

/// The most primaries one map may name (Redis Cluster is designed for up to 1,000 nodes): a map
/// naming more is refused, rather than opening a connection per name.
pub(crate) const MAX_PRIMARIES: usize = 1_000;

/// The most replicas of one range kept as candidates for re-reading the map.
const MAX_REPLICAS: usize = 16;

/// One range of `CLUSTER SLOTS`' answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Range {
    pub(crate) start: u16,
    pub(crate) end: u16,
    pub(crate) primary: Address,
    /// Its replicas that have a valid address (at most [`MAX_REPLICAS`]).
    pub(crate) replicas: Vec<Address>,
}

/// `CLUSTER SLOTS`' answer from the node at `asked` (an empty host is that node's): every range
/// within the slots, no slot given twice, at most [`MAX_PRIMARIES`] primaries. The error says
/// what is impossible.
pub(crate) fn cluster_slots(value: Value, asked: &Address) -> Result<Vec<Range>, String> {
    let Value::Array(ranges) = value else { return Err(format!("not an array: {}", kind(&value))) };
    if ranges.len() > SLOTS {
        return Err(format!("{} ranges for {SLOTS} slots", ranges.len()));
    }
    let mut given = vec![false; SLOTS];
    let mut primaries: HashSet<Address> = HashSet::new();
    let mut out: Vec<Range> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else { return Err("a range is not an array".into()) };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(primary)) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            return Err("a range lacks its slots or its primary".into());
        };
        let (start, end) = (slot(*start)?, slot(*end)?);
        if start > end {
            return Err(format!("the range {start}-{end} ends before it starts"));
        }
        if let Some(twice) = (start..=end).find(|&s| given[usize::from(s)]) {
            return Err(format!("slot {twice} is given twice"));
        }
        for s in start..=end {
            given[usize::from(s)] = true;
        }
        let primary = node(primary, asked).map_err(|what| format!("the primary of {start}-{end}: {what}"))?;
        if primaries.insert(primary.clone()) && primaries.len() > MAX_PRIMARIES {
            return Err(format!("more than {MAX_PRIMARIES} primaries"));
        }
        let replicas = fields[3..].iter().filter_map(|r| node(r, asked).ok()).take(MAX_REPLICAS).collect();
        out.push(Range { start, end, primary, replicas });
    }
    Ok(out)
}

/// The slots `ranges` cover (each slot is in one range at most: see [`cluster_slots`]).
pub(crate) fn coverage(ranges: &[Range]) -> usize {
    ranges.iter().map(|r| usize::from(r.end - r.start) + 1).sum()
}

/// A slot number a server sent.
fn slot(value: i64) -> Result<u16, String> {
    u16::try_from(value)
        .ok()
        .filter(|&s| usize::from(s) < SLOTS)
        .ok_or_else(|| format!("{value} is not a slot (0 to 16383)"))
}

/// A node of `CLUSTER SLOTS` (`[host, port, id, …]`); an empty host (or `?`) is the node asked.
fn node(value: &Value, asked: &Address) -> Result<Address, String> {
    let Value::Array(fields) = value else { return Err("not an array".into()) };
    let host = match fields.first() {
        Some(value) => text(value).ok_or("a host that is not a string")?,
        None => return Err("no host".into()),
    };
    let port = match fields.get(1) {
        Some(Value::Int(port)) => *port,
        _ => return Err("no port".into()),
    };
    let host = if host.is_empty() || host == "?" { asked.host.clone() } else { host };
    address(host, port)
}

/// An address a server gave, if it can be one.
fn address(host: String, port: i64) -> Result<Address, String> {
    let port = u16::try_from(port).ok().filter(|&p| p != 0).ok_or_else(|| format!("port {port} is not a port"))?;
    if !is_host(&host) {
        return Err(format!("{:?} is not a host", truncated(&host)));
    }
    Ok(Address { host, port })
}

/// Whether `host` can be a host name or an IP address: 1 to 255 characters of letters, digits,
/// `.`, `-`, `_`, and `:` and `%` for IPv6 (no spaces, slashes, `@`…).
fn is_host(host: &str) -> bool {
    (1..=255).contains(&host.len())
        && host.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'%'))
}

fn truncated(text: &str) -> &str {
    text.char_indices().nth(64).map_or(text, |(at, _)| &text[..at])
}

/// A string value (bulk or simple), if it is one and is UTF-8.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// What kind of value `value` is, for messages (never the value: it may be huge).
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Int(_) => "an integer",
        Value::BulkString(_) | Value::SimpleString(_) => "a string",
        Value::Array(_) => "an array",
        Value::ServerError(_) => "an error",
        _ => "another type",
    }
}

/// Where a `MOVED` or `ASK` reply sends a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Redirect {
    /// The slot has a new owner.
    Moved(u16, Address),
    /// The slot is being migrated and this key is already at the address: ask there, once.
    Ask(u16, Address),
}

/// The redirect in `error`: `Ok(None)` if it is none, an error naming what is impossible in a
/// `MOVED` or `ASK` (`MOVED SLOT HOST:PORT`).
pub(crate) fn redirect(error: &RedisError) -> Result<Option<Redirect>, String> {
    let moved = match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => true,
        ErrorKind::Server(ServerErrorKind::Ask) => false,
        _ => return Ok(None),
    };
    let what = if moved { "MOVED" } else { "ASK" };
    let detail = error.detail().unwrap_or("");
    let mut words = detail.split_ascii_whitespace();
    let (Some(slot_text), Some(target), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!("{what} {:?}: not a slot and an address", truncated(detail)));
    };
    let number = slot_text.parse::<i64>().map_err(|_| format!("{what} {:?}: not a slot", truncated(slot_text)))?;
    let slot = slot(number).map_err(|e| format!("{what} {e}"))?;
    let Some((host, port)) = target.rsplit_once(':') else {
        return Err(format!("{what} {slot} {:?}: no port", truncated(target)));
    };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = port.parse::<i64>().map_err(|_| format!("{what} {slot} {:?}: not a port", truncated(target)))?;
    let address = address(host.to_string(), port).map_err(|e| format!("{what} {slot}: {e}"))?;
    Ok(Some(if moved { Redirect::Moved(slot, address) } else { Redirect::Ask(slot, address) }))
}

/// A Sentinel's answer to `SENTINEL GET-MASTER-ADDR-BY-NAME`: the primary's address, `None` if
/// it knows no primary of that name (nil).
pub(crate) fn sentinel_primary(value: Value) -> Result<Option<Address>, String> {
    match value {
        Value::Nil => Ok(None),
        Value::Array(fields) if fields.len() == 2 => {
            let host = text(&fields[0]).ok_or("a host that is not a string")?;
            let port = match &fields[1] {
                Value::Int(port) => *port,
                other => text(other).and_then(|p| p.parse::<i64>().ok()).ok_or("a port that is not a number")?,
            };
            address(host, port).map(Some)
        }
        other => Err(format!("{} where a host and a port were due", kind(&other))),
    }
}

/// What `ROLE` says a server is: `Ok(true)` a primary, `Ok(false)` something else (a replica, a
/// Sentinel); an error if it is not a `ROLE` answer.
pub(crate) fn is_primary(value: &Value) -> Result<bool, String> {
    let Value::Array(fields) = value else { return Err(format!("ROLE answered {}", kind(value))) };
    match fields.first().and_then(text).as_deref() {
        Some("master") => Ok(true),
        Some("slave" | "replica" | "sentinel") => Ok(false),
        Some(other) => Err(format!("ROLE answered the role {:?}", truncated(other))),
        None => Err("ROLE answered no role".into()),
    }
}

/// A role for messages: the first word of `ROLE`'s answer, or what it was.
pub(crate) fn role_name(value: &Value) -> String {
    match value {
        Value::Array(fields) => fields.first().and_then(text).map_or_else(|| "?".into(), |r| truncated(&r).to_string()),
        other => kind(other).to_string(),
    }
}

/// An impossible reply from a server, as the error of the call it came with.
pub(crate) fn impossible(what: String) -> RedisError {
    RedisError::from((ErrorKind::Parse, "an impossible reply", what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i64) -> Value {
        Value::Int(v)
    }

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![bulk(host), int(port), bulk("id")])
    }

    fn range(start: i64, end: i64, nodes: Vec<Value>) -> Value {
        Value::Array([vec![int(start), int(end)], nodes].concat())
    }

    fn asked() -> Address {
        Address { host: "10.0.0.9".into(), port: 7000 }
    }

    #[test]
    fn reads_cluster_slots() {
        let reply = Value::Array(vec![
            range(0, 5460, vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003), node("", 0)]),
            range(5461, 16383, vec![node("", 7001)]),
        ]);
        let ranges = cluster_slots(reply, &asked()).unwrap();
        let at = |host: &str, port| Address { host: host.into(), port };
        assert_eq!(ranges[0].primary, at("10.0.0.1", 7000));
        assert_eq!(ranges[0].replicas, [at("10.0.0.4", 7003)], "a replica without a valid address is skipped");
        assert_eq!(ranges[1].primary, at("10.0.0.9", 7001), "an empty host is the node asked");
        assert_eq!(coverage(&ranges), SLOTS);
        assert_eq!(cluster_slots(Value::Array(vec![]), &asked()), Ok(vec![]));
    }

    #[test]
    fn refuses_impossible_cluster_slots() {
        for (bad, wanted) in [
            (Value::Int(1), "not an array"),
            (Value::Array(vec![range(0, 16384, vec![node("h", 1)])]), "16384 is not a slot"),
            (Value::Array(vec![range(-1, 5, vec![node("h", 1)])]), "-1 is not a slot"),
            (Value::Array(vec![range(5, 1, vec![node("h", 1)])]), "ends before it starts"),
            (Value::Array(vec![range(0, 1, vec![node("h", 70000)])]), "port 70000"),
            (Value::Array(vec![range(0, 1, vec![node("h", 0)])]), "port 0"),
            (Value::Array(vec![range(0, 1, vec![node("a b", 1)])]), "is not a host"),
            (Value::Array(vec![range(0, 1, vec![node("h/x@y", 1)])]), "is not a host"),
            (Value::Array(vec![range(0, 1, vec![])]), "lacks its slots or its primary"),
            (
                Value::Array(vec![range(0, 10, vec![node("h", 1)]), range(10, 20, vec![node("h", 2)])]),
                "slot 10 is given twice",
            ),
            (Value::Array(vec![Value::Array(vec![int(0), int(1), int(2)])]), "not an array"),
        ] {
            let error = cluster_slots(bad.clone(), &asked()).unwrap_err();
            assert!(error.contains(wanted), "{bad:?}: {error}");
        }
        let many: Vec<Value> = (0..=MAX_PRIMARIES as i64).map(|i| range(i, i, vec![node("h", i + 1)])).collect();
        assert!(cluster_slots(Value::Array(many), &asked()).unwrap_err().contains("more than 1000 primaries"));
    }

    fn server_error(text: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()).unwrap().extract_error() {
            Err(error) => error,
            Ok(value) => panic!("{value:?} is not an error"),
        }
    }

    #[test]
    fn reads_redirects_and_refuses_impossible_ones() {
        let at = |host: &str, port| Address { host: host.into(), port };
        assert_eq!(
            redirect(&server_error("MOVED 3999 127.0.0.1:6381")),
            Ok(Some(Redirect::Moved(3999, at("127.0.0.1", 6381))))
        );
        assert_eq!(redirect(&server_error("ASK 0 [::1]:7000")), Ok(Some(Redirect::Ask(0, at("::1", 7000)))));
        assert_eq!(redirect(&server_error("ERR no")), Ok(None));
        for (bad, wanted) in [
            ("MOVED 20000 127.0.0.1:1", "MOVED 20000 is not a slot"),
            ("ASK 16384 127.0.0.1:1", "ASK 16384 is not a slot"),
            ("MOVED -1 127.0.0.1:1", "-1 is not a slot"),
            ("MOVED x 127.0.0.1:1", "not a slot"),
            ("MOVED 1 127.0.0.1:0", "port 0"),
            ("MOVED 1 127.0.0.1:99999", "port 99999"),
            ("MOVED 1 127.0.0.1", "no port"),
            ("MOVED 1 :7000", "is not a host"),
            ("MOVED 1", "not a slot and an address"),
            ("MOVED", "not a slot and an address"),
            ("MOVED 1 a:1 extra", "not a slot and an address"),
        ] {
            let error = redirect(&server_error(bad)).unwrap_err();
            assert!(error.contains(wanted), "{bad}: {error}");
        }
    }

    #[test]
    fn reads_sentinel_answers_and_roles() {
        let pair = |host: &str, port: Value| Value::Array(vec![bulk(host), port]);
        assert_eq!(
            sentinel_primary(pair("10.0.0.1", bulk("6379"))),
            Ok(Some(Address { host: "10.0.0.1".into(), port: 6379 }))
        );
        assert_eq!(sentinel_primary(Value::Nil), Ok(None));
        for bad in [
            pair("10.0.0.1", bulk("0")),
            pair("10.0.0.1", bulk("65536")),
            pair("10.0.0.1", bulk("x")),
            pair("", bulk("1")),
            Value::Array(vec![bulk("h")]),
            Value::Int(3),
        ] {
            assert!(sentinel_primary(bad.clone()).is_err(), "{bad:?}");
        }
        assert_eq!(is_primary(&Value::Array(vec![bulk("master"), int(0), Value::Array(vec![])])), Ok(true));
        assert_eq!(is_primary(&Value::Array(vec![bulk("slave"), bulk("h"), int(1)])), Ok(false));
        assert!(is_primary(&Value::Array(vec![bulk("leader")])).is_err());
        assert!(is_primary(&Value::Array(vec![])).is_err());
        assert!(is_primary(&Value::Int(1)).is_err());
    }
}
