//! A client's reading of replies: [`Value::parse`] reads one whole reply from a buffer,
//! [`skim`] only finds where it ends and the integer it is or starts with (what a load generator
//! needs, without allocating), and [`read`] reads one from a blocking reader (the tests'
//! clients). Each returns `Ok(None)` (or waits) until the reply is complete, and refuses what is
//! not RESP, or arrays nested deeper than [`MAX_DEPTH`], with a [`ReplyError`].
//!
//! RESP3's simple types (`_`, `,`, `#`) are read as [`Value::Simple`] so that a reply of a
//! RESP3 server does not break a client that only wants its end.

use std::io::BufRead;

/// Deepest nesting of arrays read.
pub const MAX_DEPTH: usize = 16;

/// Longest bulk string read (Redis's own `proto-max-bulk-len`).
pub const MAX_BULK_BYTES: usize = 512 << 20;

/// A reply that is not RESP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol error: {0}")]
pub struct ReplyError(String);

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK` (and RESP3's `_`, `,`, `#` lines).
    Simple(String),
    /// `-ERR …`.
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n` and its bytes; `None` for `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*n` and its elements; `None` for `*-1`.
    Array(Option<Vec<Value>>),
}

impl Value {
    /// The reply at the start of `buf`, and its length; `Ok(None)` until it is complete.
    pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, ReplyError> {
        parse_at(buf, 0, 0)
    }

    /// Its integers, if it is an array of integers (a decision) or an integer.
    #[must_use]
    pub fn integers(&self) -> Option<Vec<i64>> {
        match self {
            Value::Integer(n) => Some(vec![*n]),
            Value::Array(Some(items)) => {
                items.iter().map(|v| if let Value::Integer(n) = v { Some(*n) } else { None }).collect()
            }
            _ => None,
        }
    }
}

/// What [`skim`] sees of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skimmed {
    /// An error reply, with its text.
    Error(String),
    /// Any other reply; `first` is the integer it is or starts with (an array's first element).
    Value {
        /// The integer, if any.
        first: Option<i64>,
    },
}

/// Where the reply at the start of `buf` ends, and what it is as far as a decision goes.
pub fn skim(buf: &[u8]) -> Result<Option<(Skimmed, usize)>, ReplyError> {
    if buf.first() == Some(&b'-') {
        return Ok(line(buf, 1).map(|(text, end)| (Skimmed::Error(String::from_utf8_lossy(text).into_owned()), end)));
    }
    Ok(skim_at(buf, 0, 0)?.map(|(first, end)| (Skimmed::Value { first }, end)))
}

/// Reads one reply from `reader`, waiting for all of it.
pub fn read(reader: &mut impl BufRead) -> std::io::Result<Value> {
    read_at(reader, 0)
}

/// One element's type byte and header line (without CRLF), and the position after the line.
fn header(buf: &[u8], at: usize) -> Option<(u8, &[u8], usize)> {
    let kind = *buf.get(at)?;
    let (text, end) = line(buf, at + 1)?;
    Some((kind, text, end))
}

/// The line starting at `at`, without its CRLF, and the position after it.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let cr = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..cr], at + cr + 2))
}

fn number(text: &[u8]) -> Result<i64, ReplyError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| ReplyError(format!("{:?} is not a number", String::from_utf8_lossy(text))))
}

/// A bulk string of `len` (from its header) whose data starts at `start`: where it ends (after its
/// CRLF), `None` for `$-1`.
fn bulk_end(len: i64, start: usize) -> Result<Option<usize>, ReplyError> {
    if len < 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).ok().filter(|&n| n <= MAX_BULK_BYTES);
    let len = len.ok_or_else(|| ReplyError(format!("bulk length above {MAX_BULK_BYTES}")))?;
    start.checked_add(len).and_then(|n| n.checked_add(2)).map(Some).ok_or_else(|| ReplyError("bulk length".into()))
}

/// Whether the two bytes after a bulk string's data are its CRLF: a length that lies is refused,
/// not read as a string cut short with the next reply shifted.
fn terminated(end: &[u8]) -> Result<(), ReplyError> {
    if end == b"\r\n" {
        Ok(())
    } else {
        Err(ReplyError("a bulk string not ended by CRLF where its length says".into()))
    }
}

fn deeper(depth: usize) -> Result<usize, ReplyError> {
    if depth >= MAX_DEPTH {
        return Err(ReplyError(format!("arrays nested deeper than {MAX_DEPTH}")));
    }
    Ok(depth + 1)
}

fn unexpected(kind: u8) -> ReplyError {
    ReplyError(format!("unexpected reply type {:?}", char::from(kind)))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, ReplyError> {
    let Some((kind, line, end)) = header(buf, at) else { return Ok(None) };
    let value = match kind {
        b'+' | b'_' | b',' | b'#' => Value::Simple(text(line)),
        b'-' => Value::Error(text(line)),
        b':' => Value::Integer(number(line)?),
        b'$' => match bulk_end(number(line)?, end)? {
            None => Value::Bulk(None),
            Some(total) if buf.len() >= total => {
                terminated(&buf[total - 2..total])?;
                return Ok(Some((Value::Bulk(Some(buf[end..total - 2].to_vec())), total)));
            }
            Some(_) => return Ok(None),
        },
        b'*' => {
            let n = number(line)?;
            if n < 0 {
                return Ok(Some((Value::Array(None), end)));
            }
            let depth = deeper(depth)?;
            // Not the declared count: a reply cannot make the reader reserve more than it sent.
            let mut items = Vec::new();
            let mut at = end;
            for _ in 0..n {
                let Some((item, next)) = parse_at(buf, at, depth)? else { return Ok(None) };
                items.push(item);
                at = next;
            }
            return Ok(Some((Value::Array(Some(items)), at)));
        }
        other => return Err(unexpected(other)),
    };
    Ok(Some((value, end)))
}

fn skim_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Option<i64>, usize)>, ReplyError> {
    let Some((kind, line, end)) = header(buf, at) else { return Ok(None) };
    match kind {
        b'+' | b'-' | b'_' | b',' | b'#' => Ok(Some((None, end))),
        b':' => Ok(Some((Some(number(line)?), end))),
        b'$' => match bulk_end(number(line)?, end)? {
            None => Ok(Some((None, end))),
            Some(total) if buf.len() >= total => terminated(&buf[total - 2..total]).map(|()| Some((None, total))),
            Some(_) => Ok(None),
        },
        b'*' => {
            let depth = deeper(depth)?;
            let mut at = end;
            let mut first = None;
            for i in 0..number(line)?.max(0) {
                let Some((element, next)) = skim_at(buf, at, depth)? else { return Ok(None) };
                if i == 0 {
                    first = element;
                }
                at = next;
            }
            Ok(Some((first, at)))
        }
        other => Err(unexpected(other)),
    }
}

fn read_at(reader: &mut impl BufRead, depth: usize) -> std::io::Result<Value> {
    let invalid = |e: ReplyError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut raw = Vec::new();
    reader.read_until(b'\n', &mut raw)?;
    let Some((kind, line, _)) = header(&raw, 0) else {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the reply ended early"));
    };
    Ok(match kind {
        b'+' | b'_' | b',' | b'#' => Value::Simple(text(line)),
        b'-' => Value::Error(text(line)),
        b':' => Value::Integer(number(line).map_err(invalid)?),
        b'$' => match bulk_end(number(line).map_err(invalid)?, 0).map_err(invalid)? {
            None => Value::Bulk(None),
            Some(total) => {
                let mut data = vec![0; total];
                reader.read_exact(&mut data)?;
                terminated(&data[total - 2..]).map_err(invalid)?;
                data.truncate(total - 2);
                Value::Bulk(Some(data))
            }
        },
        b'*' => {
            let n = number(line).map_err(invalid)?;
            if n < 0 {
                return Ok(Value::Array(None));
            }
            let depth = deeper(depth).map_err(invalid)?;
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(read_at(reader, depth)?);
            }
            Value::Array(Some(items))
        }
        other => return Err(invalid(unexpected(other))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECISION: &[u8] = b"*5\r\n:0\r\n:16\r\n:15\r\n:-1\r\n:2\r\n";

    #[test]
    fn replies_are_read_only_when_complete() {
        for end in 0..DECISION.len() {
            assert_eq!(Value::parse(&DECISION[..end]), Ok(None), "{end}");
            assert_eq!(skim(&DECISION[..end]), Ok(None), "{end}");
        }
        let (value, n) = Value::parse(DECISION).unwrap().unwrap();
        assert_eq!((value.integers(), n), (Some(vec![0, 16, 15, -1, 2]), DECISION.len()));
        assert_eq!(skim(DECISION), Ok(Some((Skimmed::Value { first: Some(0) }, DECISION.len()))));
        assert_eq!(read(&mut &DECISION[..]).unwrap(), value);
    }

    #[test]
    fn every_type_reads_the_same_in_all_three_readers() {
        let cases: [(&[u8], Value); 7] = [
            (b"+OK\r\n", Value::Simple("OK".into())),
            (b"-ERR no\r\n", Value::Error("ERR no".into())),
            (b":-42\r\n", Value::Integer(-42)),
            (b"$5\r\na\r\nbc\r\n", Value::Bulk(Some(b"a\r\nbc".to_vec()))),
            (b"$-1\r\n", Value::Bulk(None)),
            (b"*-1\r\n", Value::Array(None)),
            (
                b"*2\r\n*1\r\n:1\r\n$0\r\n\r\n",
                Value::Array(Some(vec![Value::Array(Some(vec![Value::Integer(1)])), Value::Bulk(Some(vec![]))])),
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(Value::parse(bytes), Ok(Some((want.clone(), bytes.len()))), "{bytes:?}");
            assert_eq!(read(&mut &bytes[..]).unwrap(), want, "{bytes:?}");
            assert_eq!(skim(bytes).unwrap().unwrap().1, bytes.len(), "{bytes:?}");
        }
        assert_eq!(skim(b"-ERR no\r\n").unwrap().unwrap().0, Skimmed::Error("ERR no".into()));
    }

    #[test]
    fn what_is_not_resp_is_refused() {
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        for bad in [b"?x\r\n".as_slice(), b":ten\r\n", b"$x\r\n", b"$536870913\r\n", deep.as_bytes()] {
            assert!(Value::parse(bad).is_err(), "{bad:?}");
            assert!(skim(bad).is_err(), "{bad:?}");
            assert!(read(&mut &bad[..]).is_err(), "{bad:?}");
        }
        // A string whose declared length is not followed by its CRLF is not RESP (a length that
        // lies), whoever reads it.
        for bad in [b"$3\r\nabcXY".as_slice(), b"$3\r\nabc\rX", b"*2\r\n$1\r\nab\r\n:1\r\n"] {
            assert!(Value::parse(bad).is_err(), "{bad:?} parsed as {:?}", Value::parse(bad));
            assert!(skim(bad).is_err(), "{bad:?} skimmed as {:?}", skim(bad));
            assert!(read(&mut &bad[..]).is_err(), "{bad:?} read as {:?}", read(&mut &bad[..]).ok());
        }
        // A declared count far beyond what was sent reserves nothing: it waits for the rest.
        assert_eq!(Value::parse(b"*9223372036854775807\r\n:1\r\n"), Ok(None));
        assert!(read(&mut &b"*3\r\n:1\r\n"[..]).is_err(), "the reply ended early");
    }
}
