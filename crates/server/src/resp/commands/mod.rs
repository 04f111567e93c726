//! RESP commands: one module per family, each parsing its arguments and rendering its reply.
//!
//! | command | reply |
//! |---|---|
//! | `CL.THROTTLE key max_burst count period [quantity]` | redis-cell's `[limited, limit, remaining, retry_after_s or -1, reset_after_s]` |
//! | `TG.CHECK key algorithm count period_ms [BURST b] [SLICES s] [COST c]` | `[allowed 1/0, limit, remaining, retry_after_ms, reset_after_ms]` |
//! | `TG.PEEK key algorithm count period_ms [BURST b] [SLICES s]` | the same, consuming nothing |
//! | `TG.RESET key algorithm count period_ms [BURST b] [SLICES s]` | `+OK` |
//! | `TG.LIMIT name key [COST c]` | as `TG.CHECK`, under the config's named limit |
//! | `PING`, `ECHO`, `HELLO`, `CLIENT`, `COMMAND`, `INFO`, `SELECT`, `CONFIG GET`, `QUIT` | enough for redis-cli, client libraries and redis-benchmark |
//!
//! A line of an HTTP request (`POST`, `Host:`, `METHOD TARGET HTTP/x`) answers an error and closes
//! the connection, as Redis does (see `cross_protocol`).
//!
//! Durations in `TG.*` replies are milliseconds rounded up, so a client never retries early.
//!
//! Every error names what it refuses: a wrong arity answers the command's own usage (or Redis's
//! `wrong number of arguments for 'ping' command`), an option the command does not take says
//! which ones it does, and `CL.THROTTLE` keeps redis-cell's messages.

mod admin;
mod cross_protocol;
mod native;
mod options;
mod throttle;

use bytes::BytesMut;

use crate::app::App;
use tollgate_resp::reply;

/// What the connection does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read the next command.
    Continue,
    /// Flush the replies and close (QUIT, or a line of an HTTP request).
    Close,
}

/// Runs one command (`args[0]` is its name), appending its reply to `out`.
pub async fn execute(app: &App, args: &[&[u8]], out: &mut BytesMut) -> Flow {
    let name = args[0];
    let rest = &args[1..];
    let is = |candidate: &str| name.eq_ignore_ascii_case(candidate.as_bytes());
    if cross_protocol::is_http(args) {
        cross_protocol::warn();
        reply::error(out, cross_protocol::ERROR);
        return Flow::Close;
    }
    if is("CL.THROTTLE") {
        throttle::run(app, rest, out).await;
    } else if is("TG.CHECK") {
        native::check(app, rest, out, false).await;
    } else if is("TG.PEEK") {
        native::check(app, rest, out, true).await;
    } else if is("TG.RESET") {
        native::reset(app, rest, out).await;
    } else if is("TG.LIMIT") {
        native::named(app, rest, out).await;
    } else {
        return admin::run(name, rest, out);
    }
    Flow::Continue
}

/// An argument as UTF-8 text, or the error to reply.
fn text<'a>(arg: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(arg).map_err(|_| format!("ERR {what} must be valid UTF-8"))
}

/// An argument as an integer, with redis-cell's message when it is not one.
fn integer(arg: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| format!("ERR Couldn't parse as integer: {}", String::from_utf8_lossy(arg)))
}

/// The `TG.*` argument `name` as an integer of at least `min` (0 or 1); its errors name it.
fn integer_arg(arg: &[u8], name: &str, min: i64) -> Result<u64, String> {
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

/// A client's argument in a message: as text, at most 64 bytes of it.
fn shown(arg: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(&arg[..arg.len().min(64)])
}

/// `n` if it is at least `min`.
fn at_least(n: i64, name: &str, min: i64) -> Result<u64, String> {
    if n < min {
        return Err(format!("ERR {name} must be >= {min}, got {n}"));
    }
    u64::try_from(n).map_err(|_| format!("ERR {name} must be >= {min}, got {n}"))
}
