//! The connection-level commands clients send on their own: enough of `PING`, `ECHO`, `HELLO`,
//! `CLIENT`, `COMMAND`, `INFO`, `SELECT`, `CONFIG` and `QUIT` for redis-cli, client libraries and
//! redis-benchmark: each one's arguments read (here, what [`Command`](super::Command) holds of
//! them) and its reply. What they do not support is refused in Redis's words, never acknowledged
//! and ignored: `SELECT 1` (one keyspace), `HELLO ... AUTH` (no passwords), `CLIENT KILL`.

use bytes::BytesMut;
use tollgate_resp::reply;

use super::args::shown;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `CLIENT` subcommands tollgate answers: what libraries send (no names kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// `CLIENT SETNAME name`: `+OK`.
    SetName,
    /// `CLIENT SETINFO attribute value`: `+OK`.
    SetInfo,
    /// `CLIENT GETNAME`: no name (null).
    GetName,
    /// `CLIENT ID`: 1.
    Id,
}

/// `PING [message]`.
pub(super) fn ping<'a>(args: &[&'a [u8]]) -> Result<Option<&'a [u8]>, String> {
    match args {
        [] => Ok(None),
        [message] => Ok(Some(message)),
        _ => Err(arity("ping")),
    }
}

/// `ECHO message`.
pub(super) fn echo<'a>(args: &[&'a [u8]]) -> Result<&'a [u8], String> {
    match args {
        [message] => Ok(message),
        _ => Err(arity("echo")),
    }
}

/// `SELECT 0`, the one keyspace.
pub(super) fn select(args: &[&[u8]]) -> Result<(), String> {
    match args {
        [db] if std::str::from_utf8(db).is_ok_and(|db| db.parse::<i64>() == Ok(0)) => Ok(()),
        [_] => Err("ERR DB index is out of range: tollgate has one keyspace (SELECT 0)".into()),
        _ => Err(arity("select")),
    }
}

/// `CLIENT SETNAME / SETINFO / GETNAME / ID`, each with its arity.
pub(super) fn client(args: &[&[u8]]) -> Result<Client, String> {
    let Some((sub, rest)) = args.split_first() else { return Err(arity("client")) };
    let is = |candidate: &str| sub.eq_ignore_ascii_case(candidate.as_bytes());
    let (client, name, wanted) = if is("SETNAME") {
        (Client::SetName, "client|setname", 1)
    } else if is("SETINFO") {
        (Client::SetInfo, "client|setinfo", 2)
    } else if is("GETNAME") {
        (Client::GetName, "client|getname", 0)
    } else if is("ID") {
        (Client::Id, "client|id", 0)
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}' for 'client'; subcommands: SETNAME, SETINFO, GETNAME, ID",
            shown(sub)
        ));
    };
    if rest.len() != wanted {
        return Err(arity(name));
    }
    Ok(client)
}

impl Client {
    pub(super) fn reply(self, out: &mut BytesMut) {
        match self {
            Client::GetName => reply::null(out),
            Client::Id => reply::integer(out, 1),
            Client::SetName | Client::SetInfo => reply::simple(out, "OK"),
        }
    }
}

/// `HELLO [2 [AUTH user pass] [SETNAME name]]`: RESP2 only, no passwords, no names kept.
pub(super) fn hello(args: &[&[u8]]) -> Result<(), String> {
    let Some((version, mut options)) = args.split_first() else { return Ok(()) };
    if **version != *b"2" {
        return Err("NOPROTO this server speaks RESP2 only".into());
    }
    while let [option, rest @ ..] = options {
        options = match rest {
            [_, after @ ..] if option.eq_ignore_ascii_case(b"SETNAME") => after,
            [_, _, ..] if option.eq_ignore_ascii_case(b"AUTH") => {
                return Err("ERR tollgate has no authentication: connect without AUTH".into());
            }
            // An unknown option, or one missing its values: Redis's words.
            _ => return Err(format!("ERR Syntax error in HELLO option '{}'", shown(option))),
        };
    }
    Ok(())
}

/// `HELLO`'s reply: the server's fields, protocol 2.
pub(super) fn hello_reply(out: &mut BytesMut) {
    reply::array(out, 10);
    for (field, value) in [("server", "tollgate"), ("version", VERSION), ("mode", "standalone"), ("role", "master")] {
        reply::bulk(out, field.as_bytes());
        reply::bulk(out, value.as_bytes());
    }
    reply::bulk(out, b"proto");
    reply::integer(out, 2);
}

/// `CONFIG GET parameter...`, its parameters; any other `CONFIG` is refused: nothing changes at
/// run time.
pub(super) fn config_get<'a>(args: &'a [&'a [u8]]) -> Result<&'a [&'a [u8]], String> {
    match args {
        [] => Err(arity("config")),
        [get] if get.eq_ignore_ascii_case(b"GET") => Err(arity("config|get")),
        [get, parameters @ ..] if get.eq_ignore_ascii_case(b"GET") => Ok(parameters),
        [sub, ..] => {
            let sub = shown(sub).to_ascii_uppercase();
            Err(format!("ERR tollgate has no configuration to change at run time (CONFIG {sub})"))
        }
    }
}

/// `CONFIG GET save` / `appendonly` (redis-benchmark asks): nothing is persisted. Other
/// parameters are not there (an empty answer, as Redis gives for unknown ones).
pub(super) fn config_reply(parameters: &[&[u8]], out: &mut BytesMut) {
    let value = |parameter: &[u8]| -> Option<&'static [u8]> {
        if parameter.eq_ignore_ascii_case(b"save") {
            Some(b"")
        } else if parameter.eq_ignore_ascii_case(b"appendonly") {
            Some(b"no")
        } else {
            None
        }
    };
    reply::array(out, 2 * parameters.iter().filter(|p| value(p).is_some()).count());
    for parameter in parameters {
        if let Some(value) = value(parameter) {
            reply::bulk(out, parameter);
            reply::bulk(out, value);
        }
    }
}

/// `INFO`: the server section, an empty keyspace.
pub(super) fn info_reply(out: &mut BytesMut) {
    let info = format!(
        "# Server\r\nredis_version:7.0.0\r\ntollgate_version:{VERSION}\r\nredis_mode:standalone\r\n# Keyspace\r\n"
    );
    reply::bulk(out, info.as_bytes());
}

/// The reply to a command tollgate does not know, in Redis's words.
pub(super) fn unknown(name: &[u8], args: &[&[u8]]) -> String {
    format!("ERR unknown command '{}', with args beginning with: {}", shown(name), preview(args))
}

fn arity(command: &str) -> String {
    format!("ERR wrong number of arguments for '{command}' command")
}

fn preview(args: &[&[u8]]) -> String {
    args.iter().take(3).map(|a| format!("'{}' ", String::from_utf8_lossy(&a[..a.len().min(32)]))).collect()
}
