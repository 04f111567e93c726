//! The connection-level commands clients send on their own: enough of `PING`, `ECHO`, `HELLO`,
//! `CLIENT`, `COMMAND`, `INFO`, `SELECT`, `CONFIG` and `QUIT` for redis-cli, client libraries and
//! redis-benchmark. What they do not support is refused in Redis's words, never acknowledged
//! and ignored: `SELECT 1` (one keyspace), `HELLO ... AUTH` (no passwords), `CLIENT KILL`.

use bytes::BytesMut;

use super::{Flow, reply, shown};

const VERSION: &str = env!("CARGO_PKG_VERSION");

pub(super) fn run(name: &[u8], args: &[&[u8]], out: &mut BytesMut) -> Flow {
    let is = |candidate: &str| name.eq_ignore_ascii_case(candidate.as_bytes());
    if is("PING") {
        match args {
            [] => reply::simple(out, "PONG"),
            [message] => reply::bulk(out, message),
            _ => arity(out, "ping"),
        }
    } else if is("ECHO") {
        match args {
            [message] => reply::bulk(out, message),
            _ => arity(out, "echo"),
        }
    } else if is("QUIT") {
        reply::simple(out, "OK");
        return Flow::Close;
    } else if is("HELLO") {
        hello(args, out);
    } else if is("CLIENT") {
        client(args, out);
    } else if is("SELECT") {
        match args {
            [db] if std::str::from_utf8(db).is_ok_and(|db| db.parse::<i64>() == Ok(0)) => reply::simple(out, "OK"),
            [_] => reply::error(out, "ERR DB index is out of range: tollgate has one keyspace (SELECT 0)"),
            _ => arity(out, "select"),
        }
    } else if is("CONFIG") {
        config(args, out);
    } else if is("COMMAND") {
        // No command docs to share: an empty list.
        reply::array(out, 0);
    } else if is("INFO") {
        let info = format!(
            "# Server\r\nredis_version:7.0.0\r\ntollgate_version:{VERSION}\r\nredis_mode:standalone\r\n\
             # Keyspace\r\n"
        );
        reply::bulk(out, info.as_bytes());
    } else {
        let message = format!("ERR unknown command '{}', with args beginning with: {}", shown(name), preview(args));
        reply::error(out, &message);
    }
    Flow::Continue
}

/// `CLIENT SETNAME / SETINFO` (what libraries send: no names kept), `GETNAME`, `ID`.
fn client(args: &[&[u8]], out: &mut BytesMut) {
    let Some((sub, rest)) = args.split_first() else { return arity(out, "client") };
    let is = |candidate: &str| sub.eq_ignore_ascii_case(candidate.as_bytes());
    let (name, wanted) = if is("SETNAME") {
        ("client|setname", 1)
    } else if is("SETINFO") {
        ("client|setinfo", 2)
    } else if is("GETNAME") {
        ("client|getname", 0)
    } else if is("ID") {
        ("client|id", 0)
    } else {
        let message =
            format!("ERR unknown subcommand '{}' for 'client'; subcommands: SETNAME, SETINFO, GETNAME, ID", shown(sub));
        return reply::error(out, &message);
    };
    if rest.len() != wanted {
        arity(out, name);
    } else if is("GETNAME") {
        reply::null(out);
    } else if is("ID") {
        reply::integer(out, 1);
    } else {
        reply::simple(out, "OK");
    }
}

/// `HELLO [2 [AUTH user pass] [SETNAME name]]`: RESP2 only, no passwords, no names kept.
fn hello(args: &[&[u8]], out: &mut BytesMut) {
    if let Some((version, mut options)) = args.split_first() {
        if **version != *b"2" {
            return reply::error(out, "NOPROTO this server speaks RESP2 only");
        }
        while let [option, rest @ ..] = options {
            options = match rest {
                [_, after @ ..] if option.eq_ignore_ascii_case(b"SETNAME") => after,
                [_, _, ..] if option.eq_ignore_ascii_case(b"AUTH") => {
                    return reply::error(out, "ERR tollgate has no authentication: connect without AUTH");
                }
                // An unknown option, or one missing its values: Redis's words.
                _ => return reply::error(out, &format!("ERR Syntax error in HELLO option '{}'", shown(option))),
            };
        }
    }
    reply::array(out, 10);
    for (field, value) in [("server", "tollgate"), ("version", VERSION), ("mode", "standalone"), ("role", "master")] {
        reply::bulk(out, field.as_bytes());
        reply::bulk(out, value.as_bytes());
    }
    reply::bulk(out, b"proto");
    reply::integer(out, 2);
}

/// `CONFIG GET save` / `appendonly` (redis-benchmark asks): nothing is persisted. Other
/// parameters are not there (an empty answer, as Redis gives for unknown ones).
fn config(args: &[&[u8]], out: &mut BytesMut) {
    let value = |parameter: &[u8]| -> Option<&'static [u8]> {
        if parameter.eq_ignore_ascii_case(b"save") {
            Some(b"")
        } else if parameter.eq_ignore_ascii_case(b"appendonly") {
            Some(b"no")
        } else {
            None
        }
    };
    match args {
        [] => arity(out, "config"),
        [get] if get.eq_ignore_ascii_case(b"GET") => arity(out, "config|get"),
        [get, parameters @ ..] if get.eq_ignore_ascii_case(b"GET") => {
            reply::array(out, 2 * parameters.iter().filter(|p| value(p).is_some()).count());
            for parameter in parameters {
                if let Some(value) = value(parameter) {
                    reply::bulk(out, parameter);
                    reply::bulk(out, value);
                }
            }
        }
        [sub, ..] => {
            let sub = shown(sub).to_ascii_uppercase();
            reply::error(out, &format!("ERR tollgate has no configuration to change at run time (CONFIG {sub})"));
        }
    }
}

fn arity(out: &mut BytesMut, command: &str) {
    reply::error(out, &format!("ERR wrong number of arguments for '{command}' command"));
}

fn preview(args: &[&[u8]]) -> String {
    args.iter().take(3).map(|a| format!("'{}' ", String::from_utf8_lossy(&a[..a.len().min(32)]))).collect()
}
