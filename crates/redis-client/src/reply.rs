//! One reply, framed already (`bounded.rs` found where it ends), read into the driver's
//! [`Value`]: the replies of decisions (integers, strings, arrays of them) by the workspace's own
//! RESP reader (`tollgate_resp`, which builds each value once, with no parser combinators in
//! between), everything else (status lines, errors, RESP3's types, pushes, anything either reader
//! refuses) by the driver's parser, so that what is accepted, and how an error reads, stays the
//! driver's.

use redis::{RedisResult, Value};
use tollgate_resp::Value as Resp;

/// The reply `frame` (one whole reply, as the framing cut it), as the driver's parser reads it.
pub(crate) fn parse(frame: &[u8]) -> RedisResult<Value> {
    if let Ok(Some((value, end))) = Resp::parse(frame)
        && end == frame.len()
        && let Some(value) = plain(value)
    {
        return Ok(value);
    }
    redis::parse_redis_value(frame)
}

/// `value` as the driver's, if it holds only integers, strings and arrays (what the driver reads
/// the same way); `None` for a status line or an error, which the driver's parser reads.
fn plain(value: Resp) -> Option<Value> {
    Some(match value {
        Resp::Integer(n) => Value::Int(n),
        Resp::Bulk(Some(bytes)) => Value::BulkString(bytes),
        Resp::Bulk(None) | Resp::Array(None) => Value::Nil,
        Resp::Array(Some(items)) => Value::Array(items.into_iter().map(plain).collect::<Option<_>>()?),
        Resp::Simple(_) | Resp::Error(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reply reads as the driver's parser reads it, or is refused as it refuses it.
    #[test]
    fn replies_read_as_the_drivers_parser_reads_them() {
        let cases: &[&[u8]] = &[
            b":0\r\n",
            b":-9223372036854775808\r\n",
            b":+5\r\n",
            b": 5\r\n",
            b":5 \r\n",
            b":x\r\n",
            b":99999999999999999999\r\n",
            b"*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n",
            b"*0\r\n",
            b"*-1\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\na\r\nbc\r\n",
            b"$3\r\nabcXY",
            b"*2\r\n*1\r\n:1\r\n$3\r\nabc\r\n",
            b"*2\r\n+OK\r\n:1\r\n",
            b"*1\r\n-ERR inside\r\n",
            b"+OK\r\n",
            b"+PONG\r\n",
            b"-ERR no such thing\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"-MOVED 3999 127.0.0.1:6381\r\n",
            b"_\r\n",
            b",1.5\r\n",
            b"#t\r\n",
            b"%1\r\n+k\r\n:1\r\n",
            b">2\r\n+invalidate\r\n*1\r\n$1\r\nk\r\n",
            b"?\r\n",
        ];
        let deep = "*1\r\n".repeat(40) + ":1\r\n";
        for frame in cases.iter().copied().chain([deep.as_bytes()]) {
            let ours = parse(frame);
            let theirs = redis::parse_redis_value(frame);
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{:?}", String::from_utf8_lossy(frame)),
                (Err(_), Err(_)) => {}
                _ => panic!("{:?}: ours {ours:?}, the driver's {theirs:?}", String::from_utf8_lossy(frame)),
            }
        }
    }
}
