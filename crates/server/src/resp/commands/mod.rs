//! RESP commands, typed: [`Command::from_frame`] reads a command's arguments into a [`Command`]
//! (parsing only: every refusal is a precise error, and nothing runs), then [`Command::apply`]
//! acts through the engine and writes the reply, its values rendered by `tollgate_edge`.
//!
//! | command | reply |
//! |---|---|
//! | `CL.THROTTLE key max_burst count period [quantity]` | redis-cell's `[limited, limit, remaining, retry_after_s or -1, reset_after_s]` |
//! | `TG.CHECK key algorithm count period [BURST b] [SLICES s] [COST c] [TZ zone]` (period: ms, or `day`, `week`, `month`, `year`) | `[allowed 1/0, limit, remaining, retry_after_ms, reset_after_ms]` |
//! | `TG.PEEK key algorithm count period [BURST b] [SLICES s] [TZ zone]` | the same, consuming nothing |
//! | `TG.RESET key algorithm count period [BURST b] [SLICES s] [TZ zone]` | `+OK` |
//! | `TG.LIMIT name key [COST c]` | as `TG.CHECK`, under the config's named limit |
//! | `TG.RESERVE key estimate ttl_ms name [name ...]` | as `TG.CHECK`, then the reservation's id (null if denied) and deadline_ms |
//! | `TG.SETTLE id actual` | `[estimate, actual]`, or `SETTLED`, `EXPIRED`, `NORESERVATION` errors |
//! | `PING`, `ECHO`, `HELLO`, `CLIENT`, `COMMAND`, `INFO`, `SELECT`, `CONFIG GET`, `QUIT` | enough for redis-cli, client libraries and redis-benchmark |
//!
//! A line of an HTTP request (`POST`, `Host:`, `METHOD TARGET HTTP/x`) answers an error and closes
//! the connection, as Redis does (see `cross_protocol`).
//!
//! Durations in `TG.*` replies are milliseconds rounded up, so a client never retries early. The
//! limits of `CL.THROTTLE` and `TG.*` are built by `tollgate_core::LimitSpec`, as the rules
//! file's and the HTTP API's are.
//!
//! Every error names what it refuses: a wrong arity answers the command's own usage (or Redis's
//! `wrong number of arguments for 'ping' command`), an option the command does not take says
//! which ones it does, and `CL.THROTTLE` keeps redis-cell's messages.

mod admin;
mod args;
mod cross_protocol;
mod native;
mod options;
mod reserve;
mod throttle;

use bytes::BytesMut;
use tollgate_resp::reply;

pub use admin::Client;
pub use native::{AdHoc, Keyed, Named};
pub use reserve::{Reserve, Settle};
pub use throttle::Throttle;

use crate::app::App;

/// What the connection does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Read the next command.
    Continue,
    /// Flush the replies and close (QUIT, or a line of an HTTP request).
    Close,
}

/// One command, its arguments read (borrowed from the connection's input).
#[derive(Debug)]
pub enum Command<'a> {
    /// `CL.THROTTLE`, redis-cell's command.
    Throttle(Throttle<'a>),
    /// `TG.CHECK`.
    Check(AdHoc<'a>),
    /// `TG.PEEK`.
    Peek(Keyed<'a>),
    /// `TG.RESET`.
    Reset(Keyed<'a>),
    /// `TG.LIMIT`.
    Limit(Named<'a>),
    /// `TG.RESERVE`.
    Reserve(Reserve<'a>),
    /// `TG.SETTLE`.
    Settle(Settle<'a>),
    /// `PING [message]`.
    Ping(Option<&'a [u8]>),
    /// `ECHO message`.
    Echo(&'a [u8]),
    /// `HELLO [2 ...]`: RESP2's greeting.
    Hello,
    /// `CLIENT` and the subcommand tollgate answers.
    Client(Client),
    /// `SELECT 0`, the one keyspace.
    Select,
    /// `CONFIG GET parameter...`.
    ConfigGet(&'a [&'a [u8]]),
    /// `COMMAND`: no command docs to share.
    CommandDocs,
    /// `INFO`.
    Info,
    /// `QUIT`.
    Quit,
    /// A line of an HTTP request sent to the RESP port.
    HttpRequest,
}

/// A command refused before it runs: the error to reply (`ERR ...`), nothing else done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl From<String> for Refused {
    fn from(message: String) -> Refused {
        Refused(message)
    }
}

/// The longest command name tollgate knows (`CL.THROTTLE`), rounded up.
const MAX_NAME: usize = 16;

impl<'a> Command<'a> {
    /// Reads `frame` (the command's name, then its arguments) into a command, or the error to
    /// reply. Names are case-insensitive.
    pub fn from_frame(frame: &'a [&'a [u8]]) -> Result<Command<'a>, Refused> {
        let Some((&name, args)) = frame.split_first() else {
            return Err(Refused("ERR empty command".into()));
        };
        if cross_protocol::is_http(frame) {
            return Ok(Command::HttpRequest);
        }
        let mut upper = [0u8; MAX_NAME];
        let known = name.len() <= MAX_NAME;
        if known {
            upper[..name.len()].copy_from_slice(name);
            upper.make_ascii_uppercase();
        }
        let command = match &upper[..if known { name.len() } else { 0 }] {
            b"CL.THROTTLE" => Command::Throttle(Throttle::parse(args)?),
            b"TG.CHECK" => Command::Check(AdHoc::parse(args)?),
            b"TG.PEEK" => Command::Peek(Keyed::parse_peek(args)?),
            b"TG.RESET" => Command::Reset(Keyed::parse_reset(args)?),
            b"TG.LIMIT" => Command::Limit(Named::parse(args)?),
            b"TG.RESERVE" => Command::Reserve(Reserve::parse(args)?),
            b"TG.SETTLE" => Command::Settle(Settle::parse(args)?),
            b"PING" => Command::Ping(admin::ping(args)?),
            b"ECHO" => Command::Echo(admin::echo(args)?),
            b"QUIT" => Command::Quit,
            b"HELLO" => admin::hello(args).map(|()| Command::Hello)?,
            b"CLIENT" => Command::Client(admin::client(args)?),
            b"SELECT" => admin::select(args).map(|()| Command::Select)?,
            b"CONFIG" => Command::ConfigGet(admin::config_get(args)?),
            b"COMMAND" => Command::CommandDocs,
            b"INFO" => Command::Info,
            _ => return Err(Refused(admin::unknown(name, args))),
        };
        Ok(command)
    }

    /// Runs the command, appending its reply to `out`.
    pub async fn apply(self, app: &App, out: &mut BytesMut) -> Flow {
        match self {
            Command::Throttle(throttle) => throttle.apply(app, out).await,
            Command::Check(check) => check.apply(app, out).await,
            Command::Peek(keyed) => keyed.peek(app, out).await,
            Command::Reset(keyed) => keyed.reset(app, out).await,
            Command::Limit(named) => named.apply(app, out).await,
            Command::Reserve(reserve) => reserve.apply(app, out).await,
            Command::Settle(settle) => settle.apply(app, out).await,
            Command::Ping(None) => reply::simple(out, "PONG"),
            Command::Ping(Some(message)) | Command::Echo(message) => reply::bulk(out, message),
            Command::Hello => admin::hello_reply(out),
            Command::Client(client) => client.reply(out),
            Command::Select => reply::simple(out, "OK"),
            Command::ConfigGet(parameters) => admin::config_reply(parameters, out),
            Command::CommandDocs => reply::array(out, 0),
            Command::Info => admin::info_reply(out),
            Command::Quit => {
                reply::simple(out, "OK");
                return Flow::Close;
            }
            Command::HttpRequest => {
                cross_protocol::warn();
                reply::error(out, cross_protocol::ERROR);
                return Flow::Close;
            }
        }
        Flow::Continue
    }
}

/// Runs one command (`frame[0]` is its name), appending its reply to `out`.
pub async fn execute(app: &App, frame: &[&[u8]], out: &mut BytesMut) -> Flow {
    match Command::from_frame(frame) {
        Ok(command) => command.apply(app, out).await,
        Err(Refused(message)) => {
            reply::error(out, &message);
            Flow::Continue
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(frame: &[&[u8]]) -> String {
        match Command::from_frame(frame) {
            Err(Refused(message)) => message,
            Ok(command) => panic!("{frame:?} read as {command:?}"),
        }
    }

    /// Reading a command runs nothing (no engine here): it is a command, or the error to reply.
    #[test]
    fn a_frame_reads_into_its_command_or_its_error() {
        assert!(matches!(Command::from_frame(&[b"cl.throttle", b"k", b"15", b"30", b"60"]), Ok(Command::Throttle(_))));
        assert!(matches!(Command::from_frame(&[b"Tg.Peek", b"k", b"gcra", b"1", b"1000"]), Ok(Command::Peek(_))));
        assert!(matches!(Command::from_frame(&[b"TG.LIMIT", b"api", b"k"]), Ok(Command::Limit(_))));
        assert!(matches!(Command::from_frame(&[b"client", b"getname"]), Ok(Command::Client(Client::GetName))));
        assert!(matches!(Command::from_frame(&[b"PING"]), Ok(Command::Ping(None))));
        assert!(matches!(Command::from_frame(&[b"post", b"/", b"HTTP/1.1"]), Ok(Command::HttpRequest)));
        assert_eq!(
            refused(&[b"CL.THROTTLE", b"k", b"1", b"2", b"9223372036854775807"]),
            "ERR period is 9223372036854775807000000000 ns, above its maximum of 4320000000000000 ns (50 days)"
        );
        assert_eq!(refused(&[b"CL.THROTTLE", b"k", b"1", b"0", b"60"]), "ERR count must be >= 1, got 0");
        assert_eq!(
            refused(&[b"TG.CHECK", b"k", b"fixed-window", b"1", b"1000", b"BURST", b"2"]),
            "ERR burst applies to gcra, token-bucket and leaky-bucket only; fixed-window admits `count` per period"
        );
        assert_eq!(refused(&[b"SELECT", b"1"]), "ERR DB index is out of range: tollgate has one keyspace (SELECT 0)");
        assert_eq!(refused(&[b"FLUSHALL", b"a"]), "ERR unknown command 'FLUSHALL', with args beginning with: 'a' ");
        // A name longer than any command's is no command, whatever it starts with.
        assert_eq!(
            refused(&[b"CL.THROTTLE.AND.MORE"]),
            "ERR unknown command 'CL.THROTTLE.AND.MORE', with args beginning with: "
        );
    }
}
