//! Reading a command's arguments: text, integers with their ranges, and how a client's argument
//! is shown in a message. Each error is the reply, in the words clients already rely on
//! (redis-cell's for `CL.THROTTLE`).

use std::borrow::Cow;

/// An argument as UTF-8 text, or the error to reply.
pub(super) fn text<'a>(arg: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(arg).map_err(|_| format!("ERR {what} must be valid UTF-8"))
}

/// An argument as an integer, with redis-cell's message when it is not one.
pub(super) fn integer(arg: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| format!("ERR Couldn't parse as integer: {}", String::from_utf8_lossy(arg)))
}

/// The `TG.*` argument `name` as an integer of at least `min` (0 or 1); its errors name it.
pub(super) fn integer_arg(arg: &[u8], name: &str, min: i64) -> Result<u64, String> {
    use std::num::IntErrorKind::{NegOverflow, PosOverflow};
    match std::str::from_utf8(arg).unwrap_or("").parse::<i64>() {
        Ok(n) => at_least(n, name, min),
        Err(e) if *e.kind() == PosOverflow => {
            Err(format!("ERR {name} must be at most {}, got {}", i64::MAX, shown(arg)))
        }
        Err(e) if *e.kind() == NegOverflow => Err(format!("ERR {name} must be >= {min}, got {}", shown(arg))),
        Err(_) => Err(format!("ERR {name} must be an integer, got {}", shown(arg))),
    }
}

/// `n` if it is at least `min`.
pub(super) fn at_least(n: i64, name: &str, min: i64) -> Result<u64, String> {
    if n < min {
        return Err(format!("ERR {name} must be >= {min}, got {n}"));
    }
    u64::try_from(n).map_err(|_| format!("ERR {name} must be >= {min}, got {n}"))
}

/// A client's argument in a message: as text, at most 64 bytes of it.
pub(super) fn shown(arg: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(&arg[..arg.len().min(64)])
}
